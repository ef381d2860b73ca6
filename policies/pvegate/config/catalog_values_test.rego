package pvegate.config_test

import data.pvegate.config

# Argument values of risk.critical_calls against the parameters' types: a value
# of another type (firewall: [0] for a boolean) matched no call, and the
# control it carried (critical, two approvers) silently stopped applying.

boolean := {"type": "boolean"}

integer := {"type": "integer"}

typed_catalog := {
	"vm_nic_set": {
		"parameters": ["firewall", "vmid"],
		"parameter_types": {"firewall": boolean, "vmid": integer},
		"tags": [],
	},
	"lxc_nic_set": {
		"parameters": ["firewall", "vmid"],
		"parameter_types": {"firewall": boolean, "vmid": integer},
		"tags": [],
	},
	"firewall_guest_options_set": {
		"parameters": ["policy_in", "ratio"],
		"parameter_types": {
			"policy_in": {"type": "string", "enum": ["ACCEPT", "REJECT", "DROP"]},
			"ratio": {"type": "number"},
		},
		"tags": [],
	},
	"vm_create": {
		"parameters": ["start", "keep_all", "any", "either"],
		"parameter_types": {
			"start": boolean,
			"keep_all": {"type": "boolean", "enum": [true]},
			"any": {},
			"either": {"type": ["string", "integer"]},
		},
		"tags": [],
	},
	"task_log": {"parameters": ["start"], "parameter_types": {"start": integer}, "tags": []},
}

critical(calls) := p if {
	p := config.catalog_problems with data.data as {"risk": {"critical_calls": calls}}
		with input as {"catalog": typed_catalog}
}

call(tools, arguments) := {"name": "c", "reason": "r", "tools": tools, "arguments": arguments}

test_values_of_the_parameters_type_are_no_problem if {
	critical([
		call(["vm_nic_set", "lxc_nic_set"], {"firewall": [false], "vmid": [100, 101.0]}),
		call(["*_nic_set"], {"firewall": [false, true]}),
		call(["firewall_guest_options_set"], {"policy_in": ["ACCEPT"], "ratio": [1, 0.5]}),
		call(["vm_create"], {"keep_all": [true], "any": [0, "x", [1]], "either": [1, "x", false]}),
		{"name": "n", "reason": "r", "arguments": {"vmid": [100]}},
	]) == set()
}

# problem(i, arg, text): the line for critical call i's argument arg
problem(i, arg, text) := sprintf("risk.critical_calls.%d.arguments.%s: %s", [i, arg, text])

nics := "for lxc_nic_set, vm_nic_set"

test_a_value_of_another_type_is_reported if {
	critical([
		call(["vm_nic_set", "lxc_nic_set"], {"firewall": [0]}),
		call(["*_nic_set"], {"firewall": ["false", false]}),
		{"name": "n", "reason": "r", "arguments": {"vmid": [100.5, "100"]}},
	]) == {
		problem(0, "firewall", sprintf("0 (number) matches no call: the parameter is boolean %s", [nics])),
		problem(1, "firewall", sprintf("\"false\" (string) matches no call: the parameter is boolean %s", [nics])),
		problem(2, "vmid", sprintf("100.5 (number) matches no call: the parameter is integer %s", [nics])),
		problem(2, "vmid", sprintf("\"100\" (string) matches no call: the parameter is integer %s", [nics])),
	}
}

test_a_value_outside_the_enum_is_reported if {
	policies := "one of [\"ACCEPT\",\"REJECT\",\"DROP\"]"
	guest := "for firewall_guest_options_set"
	critical([
		call(["firewall_guest_options_set"], {"policy_in": ["accept"], "ratio": ["1"]}),
		call(["vm_create"], {"keep_all": [false]}),
	]) == {
		problem(0, "policy_in", sprintf("\"accept\" (string) matches no call: the parameter is %s %s", [policies, guest])),
		problem(0, "ratio", sprintf("\"1\" (string) matches no call: the parameter is number %s", [guest])),
		problem(1, "keep_all", "false (boolean) matches no call: the parameter is one of [true] for vm_create"),
	}
}

# the same name may be of another type in another tool: a value one of the
# entry's tools takes is no problem, but a tool named exactly that takes none
# of the values is
test_tools_whose_parameters_differ if {
	tools := ["vm_create", "task_log"]
	critical([call(tools, {"start": [true, 0]})]) == set()
	none := "tool task_log takes none of the values (its parameter start is integer)"
	critical([call(tools, {"start": [true]})]) == {problem(0, "start", none)}
	critical([call(tools, {"start": ["yes"]})]) == {problem(
		0, "start",
		"\"yes\" (string) matches no call: the parameter is boolean for vm_create; integer for task_log",
	)}

	# a glob: one tool it matches must take the value
	critical([call(["*"], {"start": [true]})]) == set()
}

# a gateway older than the check sends no parameter_types: nothing to check
test_no_parameter_types_nothing_to_report if {
	calls := [call(["vm_nic_set"], {"firewall": [0]})]
	config.catalog_problems == set() with data.data as {"risk": {"critical_calls": calls}} with input as {"catalog": catalog}
}
