package pvegate.config_test

import data.pvegate.config

catalog := {
	"vm_start": {"parameters": ["cluster", "node", "vmid"], "tags": ["power"]},
	"vm_nic_set": {"parameters": ["cluster", "firewall", "vmid"], "tags": []},
	"lxc_nic_set": {"parameters": ["cluster", "vmid"], "tags": []},
	"check_ip_availability": {"parameters": ["cluster", "ip"], "tags": []},
	"list_nodes": {"parameters": ["cluster"], "tags": ["inventory"]},
}

problems(doc) := p if {
	p := config.catalog_problems with data.data as doc with input as {"catalog": catalog}
}

test_known_references_are_no_problem if {
	doc := {
		"roles": {"r": {
			"allow": [{"tools": ["vm_start", "vm_*", "*"], "tool_tags": ["power", "*"]}],
			"deny": [{"tools": ["list_nodes"]}],
		}},
		"guardrails": {"deny_rules": [{"name": "d", "reason": "r", "tools": ["vm_start"]}]},
		"risk": {
			"critical_calls": [
				{"name": "c", "reason": "r", "tools": ["vm_nic_set"], "arguments": {"firewall": [false]}},
				{"name": "g", "reason": "r", "tools": ["*_nic_set"], "arguments": {"firewall": [false]}},
				{"name": "n", "reason": "r", "arguments": {"vmid": [1]}},
			],
			"tool_tag_points": {"inventory": 5},
		},
		"approval": {"rules": [{"name": "a", "reason": "r", "tools": ["vm_start"]}], "waivers": [{"name": "w", "tools": ["vm_?tart"]}]},
		"obligations": {
			"reveal_secrets": [{"name": "s", "tools": ["list_nodes"]}],
			"redact": {"vm_nic_set": ["arguments.firewall", "arguments.*", "config.password"], "vm_*": ["arguments.node.x"]},
		},
		"quotas": [{"name": "q", "window": "1m", "limit": 1, "counter": "all", "tools": ["vm_start"]}],
		"resource_quotas": [{"name": "rq", "tools": ["vm_start"]}],
		"ip_scope": {"tools": ["check_ip_availability", "check_*"]},
	}
	problems(doc) == set()
}

test_no_catalog_nothing_to_report if {
	doc := {"risk": {"critical_calls": [{"name": "c", "reason": "r", "tools": ["node_rebot"]}]}}
	config.catalog_problems == set() with data.data as doc with input as {}
}

test_misspelled_tool_names_everywhere if {
	doc := {
		"roles": {"r": {"allow": [{"tools": ["vm_strat"]}], "deny": [{"tools": ["vm_delete"]}]}},
		"guardrails": {"deny_rules": [{"name": "d", "reason": "r", "tools": ["vm_strt"]}]},
		"risk": {"critical_calls": [{"name": "c", "reason": "r", "tools": ["node_rebot"]}]},
		"approval": {"rules": [{"name": "a", "reason": "r", "tools": ["sdn_aply"]}], "waivers": [{"name": "w", "tools": ["x"]}]},
		"obligations": {"reveal_secrets": [{"name": "s", "tools": ["token_craete"]}], "redact": {"get_guest_confg": ["config.x"]}},
		"quotas": [{"name": "q", "tools": ["y"]}],
		"resource_quotas": [{"name": "rq", "tools": ["z"]}],
		"ip_scope": {"tools": ["check_ip_availabilty"]},
	}
	problems(doc) == {
		"roles.r.allow.0.tools: vm_strat names no tool in the catalog (misspelled?)",
		"roles.r.deny.0.tools: vm_delete names no tool in the catalog (misspelled?)",
		"guardrails.deny_rules.0.tools: vm_strt names no tool in the catalog (misspelled?)",
		"risk.critical_calls.0.tools: node_rebot names no tool in the catalog (misspelled?)",
		"approval.rules.0.tools: sdn_aply names no tool in the catalog (misspelled?)",
		"approval.waivers.0.tools: x names no tool in the catalog (misspelled?)",
		"obligations.reveal_secrets.0.tools: token_craete names no tool in the catalog (misspelled?)",
		"obligations.redact: get_guest_confg names no tool in the catalog (misspelled?)",
		"quotas.0.tools: y names no tool in the catalog (misspelled?)",
		"resource_quotas.0.tools: z names no tool in the catalog (misspelled?)",
		"ip_scope.tools: check_ip_availabilty names no tool in the catalog (misspelled?)",
	}
}

test_glob_matching_nothing if {
	doc := {"roles": {"r": {"allow": [{"tools": ["vn_*"]}]}}, "obligations": {"redact": {"get_*": ["x"]}}}
	problems(doc) == {
		"roles.r.allow.0.tools: the glob vn_* matches no tool in the catalog",
		"obligations.redact: the glob get_* matches no tool in the catalog",
	}
}

test_misspelled_arguments if {
	doc := {
		"risk": {"critical_calls": [
			{"name": "c", "reason": "r", "tools": ["vm_nic_set", "lxc_nic_set"], "arguments": {"firewal": [false]}},
			{"name": "g", "reason": "r", "tools": ["*_nic_set"], "arguments": {"firewal": [false]}},
			{"name": "n", "reason": "r", "arguments": {"firewal": [false]}},
		]},
		"obligations": {"redact": {"vm_nic_set": ["arguments.firewal.x"], "*_nic_set": ["arguments.vmidd"]}},
		"ip_scope": {"tools": ["vm_start", "list_*"]},
	}
	problems(doc) == {
		"risk.critical_calls.0.arguments.firewal: tool vm_nic_set has no parameter firewal (misspelled?)",
		"risk.critical_calls.0.arguments.firewal: tool lxc_nic_set has no parameter firewal (misspelled?)",
		"risk.critical_calls.1.arguments.firewal: no tool matching *_nic_set has a parameter firewal (misspelled?)",
		"risk.critical_calls.2.arguments.firewal: no tool matching * has a parameter firewal (misspelled?)",
		"obligations.redact.vm_nic_set: arguments.firewal.x: tool vm_nic_set has no parameter firewal (misspelled?)",
		"obligations.redact.*_nic_set: arguments.vmidd: no tool matching *_nic_set has a parameter vmidd (misspelled?)",
		"ip_scope.tools: tool vm_start has no parameter ip (misspelled?)",
		"ip_scope.tools: no tool matching list_* has a parameter ip (misspelled?)",
	}
}

test_unknown_tool_tags if {
	doc := {
		"approval": {"rules": [{"name": "a", "reason": "r", "tool_tags": ["credentails"]}]},
		"risk": {"tool_tag_points": {"irreversable": 25}},
	}
	problems(doc) == {
		"approval.rules.0.tool_tags: no tool in the catalog carries the tag credentails (misspelled?)",
		"risk.tool_tag_points: no tool in the catalog carries the tag irreversable (misspelled?)",
	}
}
