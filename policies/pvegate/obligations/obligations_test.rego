package pvegate.obligations_test

import data.pvegate.fixtures_test as fx
import data.pvegate.obligations

test_plan_only_role_forces_dry_run if {
	inp := fx.call(fx.planner, fx.vm_stop, fx.lab_guest)
	obligations.forced_dry_run with input as inp
	obligations.result.dry_run with input as inp
}

test_plan_only_does_not_apply_to_reads if {
	not obligations.forced_dry_run with input as fx.call(fx.planner, fx.guest_config_tool, fx.lab_guest)
}

test_operator_not_forced if {
	inp := fx.call(fx.agent, fx.vm_stop, fx.prod_guest)
	not obligations.forced_dry_run with input as inp
	obligations.result.dry_run == false with input as inp
}

test_requested_dry_run_is_echoed if {
	inp := object.union(fx.call(fx.agent, fx.vm_stop, fx.prod_guest), {"dry_run": true})
	obligations.result.dry_run with input as inp
}

test_no_granting_role_no_forced_dry_run if {
	not obligations.forced_dry_run with input as fx.call(fx.nobody, fx.vm_stop, fx.prod_guest)
}

test_redaction_paths_from_matching_globs if {
	paths := obligations.redact with input as fx.call(fx.viewer, fx.guest_config_tool, fx.prod_guest)
	paths == ["config.cipassword", "config.sshkeys"]
	count(obligations.redact) == 0 with input as fx.call(fx.agent, fx.vm_stop, fx.prod_guest)
}

test_max_items_most_generous_granting_role if {
	obligations.max_items == 500 with input as fx.call(fx.agent, fx.guest_config_tool, fx.prod_guest)
	obligations.max_items == 200 with input as fx.call(fx.viewer, fx.guest_config_tool, fx.prod_guest)
}

test_max_items_default if {
	obligations.max_items == 100 with input as fx.call(fx.nobody, fx.guest_config_tool, fx.prod_guest)
	org := {"roles": {"r": {"allow": [{}]}}, "bindings": [{"role": "r", "subjects": ["mallory"]}]}
	obligations.max_items == 100 with input as fx.call(fx.nobody, fx.guest_config_tool, fx.prod_guest)
		with data.data as org
}

# a name and globs naming the same tool all count; a key with glob syntax is a
# glob, also where a tool's name is that key letter for letter
test_redaction_names_and_globs if {
	redact := {
		"get_guest_config": ["a"],
		"get_*": ["b"],
		"get_guest_confi[gh]": ["c"],
		"[g]et_guest_config": ["d"],
		"vm_stop": ["e"],
		`\[g\]et*`: ["f"],
	}
	inp := fx.call(fx.viewer, fx.guest_config_tool, fx.prod_guest)
	obligations.redact == ["a", "b", "c", "d"] with input as inp with data.data.obligations.redact as redact
	glob_named := object.union(inp, {"tool": {"name": "[g]et_guest_config"}})
	obligations.redact == ["f"] with input as glob_named with data.data.obligations.redact as redact
}

# a reveal_secrets selector naming no tool is filed under "*": any tool it admits
test_reveal_secrets_selector_without_tools if {
	reveal := [{"name": "humans-reading", "effects": ["read"], "principal_kinds": ["human"]}]
	obligations.result.reveal_secrets with input as fx.call(fx.viewer, fx.guest_config_tool, fx.prod_guest)
		with data.data.obligations.reveal_secrets as reveal
	not obligations.reveal_secrets with input as fx.call(fx.agent, fx.guest_config_tool, fx.prod_guest)
		with data.data.obligations.reveal_secrets as reveal
	not obligations.reveal_secrets with input as fx.call(fx.viewer, fx.vm_stop, fx.prod_guest)
		with data.data.obligations.reveal_secrets as reveal
}
