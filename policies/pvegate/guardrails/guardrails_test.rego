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

# a tool tagged irreversible (a template never starts again) changes a guest for good: the
# protected tag refuses it as it refuses a destroy, whoever asks
to_template := fx.tool("guest_convert_to_template", "guest", "write", "guest", ["provision", "irreversible"])

test_protected_guest_never_changed_irreversibly if {
	inp := fx.call_at(fx.admin, to_template, fx.protected_guest, fx.sat_1000)
	reasons := guardrails.deny with input as fx.with_approval(inp, ["alice"], ["sre-leads"])
	fx.has_reason(reasons, "guest 102 is tagged \"protected\": protected guests are never changed irreversibly")
	codes := {r.code | some r in guardrails.denials} with input as inp
	codes == {"guardrail.protected_tag"}
}

test_irreversible_tool_on_unprotected_guest_not_refused if {
	count(guardrails.deny) == 0 with input as fx.call(fx.admin, to_template, fx.lab_guest)
}

test_irreversible_tag_of_a_read_tool_is_not_a_change if {
	peek := fx.tool("template_preview", "guest", "read", "guest", ["irreversible"])
	count(guardrails.deny) == 0 with input as fx.call(fx.admin, peek, fx.protected_guest)
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

# a window whose from_hour equals its to_hour never opens (docs/policy-contract.md): destroy
# stays denied even at that very hour
test_window_with_equal_hours_never_opens if {
	every_day := ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
	at_three := [{"name": "empty", "weekdays": every_day, "from_hour": 3, "to_hour": 3}]
	reasons := guardrails.deny with input as fx.call_at(fx.admin, fx.guest_delete, fx.lab_guest, fx.wed_0300)
		with data.data.guardrails.maintenance_windows as at_three
	fx.has_reason(reasons, "maintenance window (empty Mon,Tue,Wed,Thu,Fri,Sat,Sun 03:00-03:00); now is Wed 03:00 UTC")
	one_hour := [{"name": "one", "weekdays": every_day, "from_hour": 3, "to_hour": 4}]
	count(guardrails.deny) == 0 with input as fx.call_at(fx.admin, fx.guest_delete, fx.lab_guest, fx.wed_0300)
		with data.data.guardrails.maintenance_windows as one_hour
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

# the tags the data's own restrictions select guests by are guarded too: untagged, the guest
# escapes the deny rule (or approval rule, critical call, quota, scoped role deny) keyed on them
pci_guest := object.union(fx.web_guest, {"tags": ["pci", "web"]})

no_agent_destroy_pci := [{
	"name": "no-agent-destroy-pci", "target_tags": ["pci"], "effects": ["destroy"],
	"principal_kinds": ["agent"], "reason": "agents never destroy PCI guests",
}]

test_removing_a_deny_rules_target_tag_denied if {
	# the rule holds on the tagged guest ...
	del := fx.call(fx.agent, fx.guest_delete, pci_guest)
	reasons := guardrails.deny with input as del with data.data.guardrails.deny_rules as no_agent_destroy_pci
	fx.has_reason(reasons, "agents never destroy PCI guests")

	# ... so the tag it keys on is not taken off first
	untag := with_tags(fx.call(fx.agent, config_update, pci_guest), "web")
	untagged := guardrails.deny with input as untag with data.data.guardrails.deny_rules as no_agent_destroy_pci
	fx.has_reason(untagged, "removing the tag \"pci\" from guest 110")
}

test_removing_an_approval_rules_or_critical_calls_target_tag_denied if {
	rule := [{"name": "pci-destroy", "target_tags": ["pci"], "effects": ["destroy"], "reason": "r"}]
	untag := with_tags(fx.call(fx.agent, config_update, pci_guest), "web")
	by_approval := guardrails.deny with input as untag with data.data.approval.rules as rule
	fx.has_reason(by_approval, "removing the tag \"pci\" from guest 110")
	by_critical := guardrails.deny with input as untag with data.data.risk.critical_calls as rule
	fx.has_reason(by_critical, "removing the tag \"pci\" from guest 110")
}

test_removing_a_scoped_role_denys_guest_tag_denied if {
	binding := {"name": "ops-no-pci-delete", "role": "operator", "token_roles": ["operator"], "scope": {"guest_tags": ["pci"]}}
	untag := with_tags(fx.call(fx.agent, config_update, pci_guest), "web")
	reasons := guardrails.deny with input as untag with data.data.bindings as [binding]
	fx.has_reason(reasons, "removing the tag \"pci\" from guest 110")

	# a binding whose role denies nothing only grants there: its tag may go
	viewer := object.union(binding, {"role": "viewer"})
	count(guardrails.deny) == 0 with input as untag with data.data.bindings as [viewer]
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

# --- volumes by their ids: target.volume_of ---------------------------------

volume_delete := fx.tool("storage_volume_delete", "storage", "destroy", "storage", ["content"])

volume_set := fx.tool("storage_volume_set", "storage", "write", "storage", ["content"])

# volume_of(volume, content, vmid, exists, tags): the guest a volume's name says owns it
volume_of(volume, content, vmid, exists, tags) := {
	"cluster": "default", "volume": volume, "content": content, "vmid": vmid,
	"node": "pve1", "pool": null, "tags": tags, "exists": exists,
}

# volume_call(p, t, owner, arguments): a call naming owner.volume on pve1, Saturday 10:00
# (inside the weekend window), approved by an SRE lead
volume_call(p, t, owner, arguments) := fx.with_approval(inp, ["alice"], ["sre-leads"]) if {
	target := object.union(fx.node_target, {"storage": "local-lvm", "volume_of": owner})
	call := fx.call_at(p, t, target, fx.sat_1000)
	named := {"node": "pve1", "storage": "local-lvm", "volume": owner.volume}
	inp := object.union(call, {"arguments": object.union(named, arguments)})
}

protected_disk := volume_of("local-lvm:vm-102-disk-0", "images", 102, true, ["prod", "protected"])

test_protected_guest_disk_never_deleted_by_volume_id if {
	inp := volume_call(fx.admin, volume_delete, protected_disk, {})
	reasons := guardrails.deny with input as inp
	fx.has_reason(reasons, "volume local-lvm:vm-102-disk-0 belongs to guest 102, which is tagged \"protected\"")
	codes := {r.code | some r in guardrails.denials} with input as inp
	codes == {"guardrail.protected_tag", "guardrail.guest_disk"}
}

test_protected_guest_backup_never_deleted if {
	backup := volume_of("pbs:backup/vm/102/2026-11-20T01:00:00Z", "backup", 102, true, ["protected"])
	inp := volume_call(fx.admin, volume_delete, backup, {})
	codes := {r.code | some r in guardrails.denials} with input as inp
	codes == {"guardrail.protected_tag"}
}

test_existing_guest_disk_not_deleted_by_volume_id if {
	disk := volume_of("local-lvm:vm-205-disk-1", "images", 205, true, ["lab"])
	inp := volume_call(fx.admin, volume_delete, disk, {})
	reasons := guardrails.deny with input as inp
	fx.has_reason(reasons, "volume local-lvm:vm-205-disk-1 belongs to guest 205, which exists: detach/remove it")
	codes := {r.code | some r in guardrails.denials} with input as inp
	codes == {"guardrail.guest_disk"}
}

test_orphan_disk_iso_and_backup_stay_deletable if {
	orphan := volume_of("local-lvm:vm-777-disk-0", "images", 777, false, [])
	count(guardrails.deny) == 0 with input as volume_call(fx.admin, volume_delete, orphan, {})
	iso := volume_of("local:iso/debian-12.iso", null, null, null, [])
	count(guardrails.deny) == 0 with input as volume_call(fx.admin, volume_delete, iso, {})
	backup := volume_of("local:backup/vzdump-qemu-205-2026_11_20-01_00_00.vma.zst", "backup", 205, true, ["lab"])
	count(guardrails.deny) == 0 with input as volume_call(fx.admin, volume_delete, backup, {})
	gone := volume_of("local:backup/vzdump-qemu-777-2026_11_20-01_00_00.vma.zst", "backup", 777, false, [])
	count(guardrails.deny) == 0 with input as volume_call(fx.admin, volume_delete, gone, {})
}

test_unknown_volume_owner_fails_closed if {
	# the lookup failed, or the name is a guest's disk without saying whose
	some owner in [
		volume_of("local-lvm:vm-205-disk-0", "images", 205, null, []),
		volume_of("local-lvm:vm-205-x/vm-206-y", "images", null, null, []),
		volume_of("local:backup/vzdump-qemu-205-2026_11_20-01_00_00.vma.zst", "backup", 205, null, []),
	]
	inp := volume_call(fx.admin, volume_delete, owner, {})
	codes := {r.code | some r in guardrails.denials} with input as inp
	codes == {"guardrail.volume_owner_unknown"}
	fx.has_reason(guardrails.deny, "could not be checked") with input as inp
}

test_protected_guest_backup_not_unprotected if {
	backup := volume_of("local:backup/vzdump-qemu-102-2026_11_20-01_00_00.vma.zst", "backup", 102, true, ["protected"])
	inp := volume_call(fx.admin, volume_set, backup, {"protected": false})
	fx.has_reason(guardrails.deny, "a protected guest's volumes are never unprotected") with input as inp
	codes := {r.code | some r in guardrails.denials} with input as inp
	codes == {"guardrail.protected_tag"}
	count(guardrails.deny) == 0 with input as volume_call(fx.admin, volume_set, backup, {"protected": true})
	count(guardrails.deny) == 0 with input as volume_call(fx.admin, volume_set, backup, {"notes": "keep"})
	lab := volume_of("local:backup/vzdump-qemu-205-2026_11_20-01_00_00.vma.zst", "backup", 205, true, ["lab"])
	count(guardrails.deny) == 0 with input as volume_call(fx.admin, volume_set, lab, {"protected": false})
}

test_volume_rules_need_the_volume_fact if {
	# a destroy-class storage tool that names no volume (target.volume_of absent): no volume rule
	inp := fx.call_at(fx.admin, volume_delete, object.union(fx.node_target, {"storage": "local"}), fx.sat_1000)
	count(guardrails.volume_risks) == 0 with input as inp
}

# --- backup prunes: target.prune_removes --------------------------------------

backup_prune := fx.tool("backup_prune", "backup", "destroy", "storage", ["backup", "prune"])

# prune_call(p, removes): a storage-wide prune of local on pve1, Saturday 10:00, approved
prune_call(p, removes) := fx.with_approval(inp, ["alice"], ["sre-leads"]) if {
	target := object.union(fx.node_target, {"storage": "local", "prune_removes": removes})
	call := fx.call_at(p, backup_prune, target, fx.sat_1000)
	inp := object.union(call, {"arguments": {"node": "pve1", "storage": "local", "keep": "keep-last=1"}})
}

pruned(vmid, exists, tags) := {"vmid": vmid, "node": "pve1", "pool": null, "tags": tags, "exists": exists}

test_prune_never_deletes_a_protected_guests_backups if {
	removes := {"known": true, "guests": [pruned(205, true, ["lab"]), pruned(102, true, ["prod", "protected"])]}
	inp := prune_call(fx.admin, removes)
	fx.has_reason(guardrails.deny, "the prune would delete backups of guest 102, which is tagged \"protected\"") with input as inp
	codes := {r.code | some r in guardrails.denials} with input as inp
	codes == {"guardrail.protected_tag"}
}

test_prune_of_other_guests_and_orphans_passes if {
	removes := {"known": true, "guests": [pruned(205, true, ["lab"]), pruned(777, false, [])]}
	count(guardrails.deny) == 0 with input as prune_call(fx.admin, removes)
	count(guardrails.deny) == 0 with input as prune_call(fx.admin, {"known": true, "guests": []})
}

test_prune_whose_reach_is_unknown_fails_closed if {
	inp := prune_call(fx.admin, {"known": false, "guests": []})
	codes := {r.code | some r in guardrails.denials} with input as inp
	codes == {"guardrail.prune_unknown"}
	fx.has_reason(guardrails.deny, "could not be checked") with input as inp
}

odd_prune := fx.tool("odd_prune", "backup", "write", "storage", [])

test_prune_rules_hold_whatever_the_tools_effect if {
	# a connector declaring target.prune on a tool of another effect: the same rules
	writer := object.union(prune_call(fx.admin, {"known": false, "guests": []}), {"tool": odd_prune})
	"guardrail.prune_unknown" in {r.code | some r in guardrails.denials} with input as writer
	malformed := prune_call(fx.admin, {"known": "yes", "guests": []})
	"guardrail.prune_unknown" in {r.code | some r in guardrails.denials} with input as malformed
	protected := {"known": true, "guests": [pruned(102, true, ["protected"])]}
	odd := object.union(prune_call(fx.admin, protected), {"tool": odd_prune})
	"guardrail.protected_tag" in {r.code | some r in guardrails.denials} with input as odd
}

test_no_prune_rule_without_the_prune_fact if {
	inp := fx.call_at(fx.admin, backup_prune, object.union(fx.node_target, {"storage": "local"}), fx.sat_1000)
	codes := {r.code | some r in guardrails.denials} with input as inp
	not "guardrail.prune_unknown" in codes
}

# a deny rule on target_tags holds where a guest the call reaches carries one, not only its
# target: an HA rule, a pool move or a prune whose target is the cluster or a storage
critical_member := {"vmid": 100, "node": "pve1", "pool": "prod", "pool_known": true, "tags": ["critical"], "exists": true}

reaching(guests) := object.union_n([
	fx.node_target,
	{"node": null, "name": null},
	{"members": {"known": true, "guests": guests}},
])

test_a_deny_rule_on_tags_holds_on_a_guest_the_call_reaches if {
	rule := [{"name": "no-critical-moves", "tools": ["pool_members_remove"], "target_tags": ["critical"], "reason": "c"}]
	tool := fx.tool("pool_members_remove", "cluster", "write", "cluster", ["pools"])
	lab := object.union(critical_member, {"vmid": 205, "pool": "lab", "tags": ["lab"]})
	reasons := guardrails.deny with input as fx.call(fx.admin, tool, reaching([lab, critical_member]))
		with data.data.guardrails.deny_rules as rule
	fx.has_reason(reasons, "c (rule \"no-critical-moves\")")
	count(guardrails.deny) == 0 with input as fx.call(fx.admin, tool, reaching([lab]))
		with data.data.guardrails.deny_rules as rule
}
