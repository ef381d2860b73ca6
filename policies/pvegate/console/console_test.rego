package pvegate.console_test

import data.pvegate.console

listing(p) := {"contract_version": 1, "kind": "list", "principal": p, "request": {}, "tools": []}

person(sub, roles, groups) := {
	"sub": sub, "iss": "idp", "client_id": "pvegate-console",
	"roles": roles, "groups": groups, "scopes": [], "kind": "human",
}

test_an_approver_opens_approvals_and_audit if {
	console.sections == {"approvals", "audit"} with input as listing(person("kc-1", [], ["sre-leads"]))
}

test_a_viewer_opens_approvals_only if {
	console.sections == {"approvals"} with input as listing(person("kc-2", ["viewer"], []))
}

test_an_auditor_opens_everything if {
	console.sections == {"approvals", "audit", "policy"} with input as listing(person("kc-3", ["auditor"], []))
}

test_nothing_bound_nothing_open if {
	count(console.sections) == 0 with input as listing(person("kc-4", ["unknown"], ["nobody"]))
}

test_roles_without_a_console_list_open_nothing if {
	count(console.sections) == 0 with input as listing(person("kc-5", ["operator"], []))
}

vm_stop := {"name": "vm_stop", "connector": "pve_api", "domain": "guest", "effect": "write", "tags": [], "scope": "guest"}

test_tool_roles_names_the_roles_granting_a_tool if {
	roles := console.tool_roles.vm_stop with input as object.union(listing(person("x", [], [])), {"tools": [vm_stop]})
	"operator" in roles
	"admin" in roles
	not "viewer" in roles
}
