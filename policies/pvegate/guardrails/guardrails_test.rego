package pvegate.guardrails_test

import data.pvegate.fixtures_test as fx
import data.pvegate.guardrails

test_protected_guest_never_destroyed if {
	# even by break-glass, in the maintenance window, with an approval
	inp := fx.call_at(fx.breakglass, fx.guest_delete, fx.protected_guest, fx.sat_1000)
	reasons := guardrails.deny with input as fx.with_approval(inp, ["alice"], ["sre-leads"])
	fx.has_reason(reasons, "guest 102 is tagged \"protected\"")
}

test_protected_tag_does_not_block_other_effects if {
	count(guardrails.deny) == 0 with input as fx.call(fx.agent, fx.vm_stop, fx.protected_guest)
}

test_destroy_outside_window_denied if {
	reasons := guardrails.deny with input as fx.call(fx.admin, fx.guest_delete, fx.lab_guest)
	fx.has_reason(reasons, "destroy tools may only run inside a maintenance window (weekend Sat,Sun 00:00-24:00;")
	fx.has_reason(reasons, "now is Wed 15:00 UTC")
}

test_exec_outside_window_denied if {
	reasons := guardrails.deny with input as fx.call(fx.admin, fx.guest_exec, fx.lab_guest)
	fx.has_reason(reasons, "exec tools may only run inside a maintenance window")
}

test_destroy_inside_weekend_window if {
	count(guardrails.deny) == 0 with input as fx.call_at(fx.admin, fx.guest_delete, fx.lab_guest, fx.sat_1000)
}

test_destroy_inside_weeknight_window_wrapping_midnight if {
	count(guardrails.deny) == 0 with input as fx.call_at(fx.admin, fx.guest_delete, fx.lab_guest, fx.wed_2310)
	count(guardrails.deny) == 0 with input as fx.call_at(fx.admin, fx.guest_delete, fx.lab_guest, fx.wed_0300)
}

test_dry_run_is_exempt_from_window if {
	inp := object.union(fx.call(fx.admin, fx.guest_delete, fx.lab_guest), {"dry_run": true})
	count(guardrails.deny) == 0 with input as inp
}

test_break_glass_outside_window_needs_approval_not_denial if {
	inp := fx.call(fx.breakglass, fx.guest_delete, fx.lab_guest)
	count(guardrails.deny) == 0 with input as inp
	guardrails.break_glass_approval_required with input as inp
}

test_no_windows_configured if {
	reasons := guardrails.deny with input as fx.call_at(fx.admin, fx.guest_delete, fx.lab_guest, fx.sat_1000)
		with data.data.guardrails.maintenance_windows as []
	fx.has_reason(reasons, "maintenance window (none configured)")
}

test_agent_may_not_mutate_node_scope if {
	reasons := guardrails.deny with input as fx.call(fx.agent, fx.node_network_update, fx.node_target)
	fx.has_reason(reasons, "agents may not write node-level resources")
	count(guardrails.deny) == 0 with input as fx.call(fx.admin, fx.node_network_update, fx.node_target)
}

test_unresolved_guest_not_mutated if {
	reasons := guardrails.deny with input as fx.call(fx.agent, fx.vm_stop, fx.unknown_target)
	fx.has_reason(reasons, "could not be resolved")
	count(guardrails.deny) == 0 with input as fx.call(fx.agent, fx.guest_config_tool, fx.unknown_target)
}

test_missing_known_flag_counts_as_unresolved if {
	inp := json.remove(fx.call(fx.agent, fx.vm_stop, fx.prod_guest), ["target/known"])
	fx.has_reason(guardrails.deny, "could not be resolved") with input as inp
}

test_org_deny_rule if {
	reasons := guardrails.deny with input as fx.call(fx.agent, fx.access_user_update, fx.unknown_target)
	fx.has_reason(reasons, "agents may not change users, tokens or permissions (rule \"no-agent-access-changes\")")
}

test_org_deny_rule_defaults if {
	reasons := guardrails.deny with input as fx.call(fx.agent, fx.vm_stop, fx.prod_guest)
		with data.data.guardrails.deny_rules as [{"tools": ["vm_stop"]}]
	fx.has_reason(reasons, "denied by rule (rule \"unnamed\")")
}

hidden(p, tool) if {
	guardrails.hidden_from_list(tool) with input as fx.listing_input(p, [tool])
}

test_hidden_from_list if {
	hidden(fx.agent, fx.node_network_update)
	hidden(fx.agent, fx.access_user_update)
	not hidden(fx.admin, fx.node_network_update)
	not hidden(fx.agent, fx.vm_stop)
}

# deny rules select principals by token group and by token role claim
test_deny_rule_selects_by_group_and_role_claim if {
	by_role := [{"name": "no-operator-stop", "principal_roles": ["operator"], "tools": ["vm_stop"], "reason": "r"}]
	reasons := guardrails.deny with input as fx.call(fx.agent, fx.vm_stop, fx.prod_guest)
		with data.data.guardrails.deny_rules as by_role
	fx.has_reason(reasons, "r (rule \"no-operator-stop\")")
	hidden(fx.agent, fx.vm_stop) with data.data.guardrails.deny_rules as by_role
	not hidden(fx.web_dev, fx.vm_stop) with data.data.guardrails.deny_rules as by_role

	by_group := [{"name": "no-web-stop", "principal_groups": ["team-web"], "tools": ["vm_stop"], "reason": "g"}]
	count(guardrails.deny) == 0 with input as fx.call(fx.agent, fx.vm_stop, fx.web_guest)
		with data.data.guardrails.deny_rules as by_group
	hidden(fx.web_dev, fx.vm_stop) with data.data.guardrails.deny_rules as by_group
	not hidden(fx.agent, fx.vm_stop) with data.data.guardrails.deny_rules as by_group
}

test_target_dependent_deny_rule_does_not_hide if {
	rules := [{"name": "no-prod", "target_tags": ["prod"], "tools": ["vm_stop"]}]
	not hidden(fx.agent, fx.vm_stop) with data.data.guardrails.deny_rules as rules
}

config_update := {
	"name": "guest_config_update", "title": "guest_config_update", "connector": "pve_api",
	"domain": "guest", "effect": "write", "tags": ["config"], "scope": "guest",
}

with_tags(inp, tags) := object.union(inp, {"arguments": {"vmid": inp.target.vmid, "tags": tags}})

test_removing_protected_tag_denied if {
	inp := with_tags(fx.call(fx.agent, config_update, fx.protected_guest), "prod")
	reasons := guardrails.deny with input as inp
	fx.has_reason(reasons, "removing the tag \"protected\" from guest 102")
}

test_removing_risk_tag_denied if {
	inp := with_tags(fx.call(fx.agent, config_update, fx.protected_guest), "protected;db")
	reasons := guardrails.deny with input as inp
	fx.has_reason(reasons, "removing the tag \"prod\" from guest 102")
}

test_keeping_guarded_tags_and_adding_others_allowed if {
	inp := with_tags(fx.call(fx.agent, config_update, fx.protected_guest), "db,prod protected;web")
	count(guardrails.deny) == 0 with input as inp
}

test_config_update_without_tags_is_not_a_tag_change if {
	inp := object.union(fx.call(fx.agent, config_update, fx.protected_guest), {"arguments": {"vmid": 102, "cores": 2}})
	count(guardrails.deny) == 0 with input as inp
}

# --- download hosts ------------------------------------------------------------------

download_tool := fx.tool("storage_download_url", "storage", "write", "storage", ["content", "download"])

download_hosts := ["download.proxmox.com", "*.debian.org"]

download_to(host) := object.union(fx.node_target, {"storage": "local", "url_host": host})

test_download_from_listed_host_passes if {
	inp := fx.call(fx.admin, download_tool, download_to("download.proxmox.com"))
	count(guardrails.deny) == 0 with input as inp with data.data.guardrails.download_hosts as download_hosts
}

test_download_host_wildcard_matches_subdomains_only if {
	ok := fx.call(fx.admin, download_tool, download_to("cdimage.debian.org"))
	count(guardrails.deny) == 0 with input as ok with data.data.guardrails.download_hosts as download_hosts
	bare := fx.call(fx.admin, download_tool, download_to("debian.org"))
	count(guardrails.deny) == 1 with input as bare with data.data.guardrails.download_hosts as download_hosts
	lookalike := fx.call(fx.admin, download_tool, download_to("evil-debian.org"))
	count(guardrails.deny) == 1 with input as lookalike with data.data.guardrails.download_hosts as download_hosts
}

test_download_from_other_host_denied if {
	inp := fx.call(fx.admin, download_tool, download_to("mirror.example.net"))
	reasons := guardrails.deny with input as inp with data.data.guardrails.download_hosts as download_hosts
	fx.has_reason(reasons, "storage_download_url may only reach allow-listed hosts (download.proxmox.com, *.debian.org)")
	fx.has_reason(reasons, "host \"mirror.example.net\" is not one of them")
}

test_download_without_trustworthy_host_denied if {
	inp := fx.call(fx.admin, download_tool, download_to(null))
	reasons := guardrails.deny with input as inp with data.data.guardrails.download_hosts as download_hosts
	fx.has_reason(reasons, "a URL without a trustworthy host is not one of them")
}

test_no_download_hosts_configured_denies_every_download if {
	inp := fx.call(fx.admin, download_tool, download_to("download.proxmox.com"))
	reasons := guardrails.deny with input as inp with data.data.guardrails.download_hosts as []
	fx.has_reason(reasons, "allow-listed hosts (none)")
}

test_calls_without_a_url_target_are_not_concerned if {
	count(guardrails.deny) == 0 with input as fx.call(fx.admin, fx.vm_stop, fx.lab_guest)
}
