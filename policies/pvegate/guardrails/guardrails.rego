# METADATA
# title: Guard rails
# description: |
#   Deny rules that hold whatever the roles say:
#   - guests carrying a protected tag are never destroyed (nor changed by a tool tagged
#     irreversible, e.g. turned into a template), nor are their volumes
#     (a disk or backup deleted by its volume id), nor are their backups unprotected;
#   - the disk of a guest that exists is not deleted as a bare storage volume
#     (Proxmox would delete it while the guest uses it): the guest's config removes it;
#   - a guest's volume whose owner could not be checked is not destroyed;
#   - a prune never deletes a protected guest's backups, nor runs when what it would
#     delete could not be checked;
#   - destroy and exec only inside a maintenance window, unless a break-glass
#     role grants the call, in which case it needs an approval instead;
#   - agents never mutate node-scope (configurable) tools;
#   - no mutation of a guest the gateway could not resolve;
#   - no removal of the tags other rules depend on (protected, risk-bearing);
#   - calls naming a URL reach only the hosts in guardrails.download_hosts;
#   - the organisation's extra deny rules from data.
# schemas:
#   - input: schema["policy_input.schema"]
package pvegate.guardrails

import data.pvegate.config
import data.pvegate.lib
import data.pvegate.obligations
import data.pvegate.rbac

# deny: the sentences of the denials below
deny contains r.message if some r in denials

# the denials of mutation_denials (below) hold for mutations only: one rule tests
# that for all of them, so a read evaluates none of them
denials contains r if {
	mutation
	some r in mutation_denials
}

# nor are a protected guest's volumes destroyed by their volume ids (storage_volume_delete),
# nor its backups unprotected (prunable and deletable afterwards): target.volume_of is the
# guest the volume's name says owns it, as the cluster knows it now
denials contains lib.reason("guardrail.protected_tag", "data.guardrails.protected_tags", msg) if {
	some risk in volume_risks
	owner := input.target.volume_of
	some tag in lib.tags_of(owner)
	tag in config.protected_tags
	msg := sprintf(
		concat("", [
			"volume %v belongs to guest %v, which is tagged %q: a protected guest's volumes are never %s ",
			"(remove the tag through change management first)",
		]),
		[owner.volume, owner.vmid, tag, risk],
	)
}

# Proxmox deletes a disk image by its volume id even while its guest uses it (the guest's
# config then names a volume that is gone): an existing guest's disks are removed through its
# configuration (detach, then delete the unused disk), for everyone
denials contains lib.reason("guardrail.guest_disk", "pvegate.guardrails.guest_disk", msg) if {
	input.tool.effect == "destroy"
	owner := input.target.volume_of
	owner.content == "images"
	owner.exists == true
	msg := sprintf(
		concat("", [
			"volume %v belongs to guest %v, which exists: detach/remove it through the guest's configuration ",
			"(deleted as a storage volume, Proxmox would remove it even while the guest uses it)",
		]),
		[owner.volume, owner.vmid],
	)
}

# a volume whose name says it is a guest's, but whose guest could not be checked (the name
# does not say which guest unambiguously, or the lookup failed): fail closed
denials contains lib.reason("guardrail.volume_owner_unknown", "pvegate.guardrails.volume_owner_unknown", msg) if {
	some risk in volume_risks
	owner := input.target.volume_of
	owner.content in {"images", "backup"}
	not is_boolean(owner.exists)
	msg := sprintf(
		concat("", [
			"volume %v is a guest's %s, but the guest it belongs to could not be checked ",
			"(its name does not say which guest, or the lookup failed); refusing: a volume is not %s unverified",
		]),
		[owner.volume, volume_content_text[owner.content], risk],
	)
}

# nor are a protected guest's backups deleted by a prune: target.prune_removes lists the guests
# whose backups the retention would delete, as Proxmox's preview marks them now (without a guest
# named, a prune reaches every guest's backups on the storage)
denials contains lib.reason("guardrail.protected_tag", "data.guardrails.protected_tags", msg) if {
	some guest in input.target.prune_removes.guests
	some tag in guest.tags
	tag in config.protected_tags
	msg := sprintf(
		concat("", [
			"the prune would delete backups of guest %v, which is tagged %q: a protected guest's backups are never ",
			"pruned (prune the other guests by vmid, or remove the tag through change management first)",
		]),
		[guest.vmid, tag],
	)
}

# a prune whose reach could not be checked (the preview, the backup job or the guests could not
# be read, a guest is hidden from the gateway's token): fail closed
denials contains lib.reason("guardrail.prune_unknown", "pvegate.guardrails.prune_unknown", msg) if {
	_ = input.target.prune_removes # the key is present (any value, null too), without building the set of keys
	not input.target.prune_removes.known == true
	msg := concat("", [
		"the backups this call would prune could not be checked (Proxmox's prune preview, the backup job, ",
		"its storage or the guests could not be read, or a guest is hidden from the gateway's token); refusing",
	])
}

# agents never mutate node-level (configurable) resources
denials contains lib.reason("guardrail.agent_scope", "data.guardrails.agent_no_mutation_scopes", msg) if {
	input.principal.kind == "agent"
	mutation
	input.tool.scope in config.agent_no_mutation_scopes
	msg := sprintf(
		"agents may not %s %s-level resources (tool %q); a human operator must do this",
		[input.tool.effect, input.tool.scope, input.tool.name],
	)
}

# a call naming a URL (a download, a URL lookup) reaches only allow-listed hosts; the
# gateway parses the host (target.url_host), null when the URL has none to trust
denials contains lib.reason("guardrail.download_host", "data.guardrails.download_hosts", msg) if {
	_ = input.target.url_host # the key is present (any value, null too), without building the set of keys
	not download_host_allowed
	msg := sprintf(
		"%s may only reach allow-listed hosts (%s); %s is not one of them",
		[input.tool.name, concat(", ", allowed_hosts_text), download_host_text],
	)
}

# the organisation's deny rules, filed under the call's effect, principal kind and
# tool name, or "*" (the lookups in the rule bodies, as in approval.matching_rules)
denials contains deny_rule_reason(rule) if {
	some i in deny_rule_index[input.tool.effect][input.principal.kind][input.tool.name]
	rule := config.deny_rules[i]
	lib.index_hit(deny_rule_exact[i], rule)
}

denials contains deny_rule_reason(rule) if {
	some i in deny_rule_index[input.tool.effect][input.principal.kind]["*"]
	rule := config.deny_rules[i]
	lib.index_hit(deny_rule_exact[i], rule)
}

# protected guests are never destroyed, nor changed for good (a tool tagged irreversible: a
# template never starts again)
mutation_denials contains lib.reason("guardrail.protected_tag", "data.guardrails.protected_tags", msg) if {
	some done in protected_risks
	some tag in lib.tags_of(input.target)
	tag in config.protected_tags
	msg := sprintf(
		"guest %v is tagged %q: protected guests are never %s (remove the tag through change management first)",
		[input.target.vmid, tag, done],
	)
}

# destroy and exec only inside a maintenance window (break-glass: see below)
mutation_denials contains lib.reason("guardrail.maintenance_window", "data.guardrails.maintenance_windows", msg) if {
	outside_window_risky
	not rbac.break_glass
	msg := sprintf(
		concat("", [
			"%s tools may only run inside a maintenance window (%s); now is %s %02d:00 UTC. ",
			"Retry in a window, run it as a dry run, or use a break-glass role with an approval",
		]),
		[input.tool.effect, windows_text, lib.weekday, lib.hour_utc],
	)
}

# no mutation of a guest the gateway could not resolve
mutation_denials contains lib.reason("guardrail.unresolved_target", "pvegate.guardrails.unresolved_target", msg) if {
	input.tool.scope == "guest"
	not target_known
	msg := sprintf(
		concat("", [
			"the target guest of %q could not be resolved (unknown node/vmid or inventory lookup failed); ",
			"refusing to mutate an unverified guest",
		]),
		[input.tool.name],
	)
}

# The tags that guard rails and risk read are not taken off through the gateway:
# otherwise the agent they constrain could disarm them (untag, then delete).
mutation_denials contains lib.reason("guardrail.guarded_tag_removal", "pvegate.guardrails.guarded_tags", msg) if {
	"tags" in object.keys(input.arguments)
	some tag in lib.tags_of(input.target)
	tag in guarded_tags
	not tag in requested_tags
	msg := sprintf(
		concat("", [
			"removing the tag %q from guest %v would weaken the guard rails that depend on it; ",
			"keep it in the new tags, or change guard-rail tags through change management",
		]),
		[tag, input.target.vmid],
	)
}

deny_rule_reason(rule) := lib.reason("guardrail.deny_rule", sprintf("data.guardrails.deny_rules[%s]", [name]), msg) if {
	name := object.get(rule, "name", "unnamed")
	msg := sprintf("%s (rule %q)", [object.get(rule, "reason", "denied by rule"), name])
}

# the deny rules by the effects, principal kinds and tool names they can match
# (lib.index_names)
deny_rule_index[effect][kind][name] contains i if {
	some i, sel in config.deny_rules
	some effect in lib.effects
	some kind in lib.principal_kinds
	lib.admits_call_kind(sel, effect, kind)
	some name in lib.index_names(sel)
}

deny_rule_exact[i] := lib.exact_selector(sel) if some i, sel in config.deny_rules

mutation if input.tool.effect in lib.mutating_effects

# what a call does to its target guest that the protected tag forbids: destroys it, or changes
# it for good (a mutation of a tool tagged irreversible, whatever its effect)
protected_risks contains "destroyed" if input.tool.effect == "destroy"

protected_risks contains "changed irreversibly" if {
	mutation
	"irreversible" in input.tool.tags
}

# what a call naming a volume (target.volume_of) does to it that a guard rail may refuse:
# destroys it, or takes a backup's protection away
volume_risks contains "destroyed" if {
	_ = input.target.volume_of # the key is present (any value, null too), without building the set of keys
	input.tool.effect == "destroy"
}

volume_risks contains "unprotected" if {
	_ = input.target.volume_of # the key is present (any value, null too), without building the set of keys
	input.tool.effect in lib.mutating_effects
	input.arguments.protected == false
}

volume_content_text := {"images": "disk", "backup": "backup"}

# tags that decide what other rules do: protected ones, and the ones that carry risk points
guarded_tags contains tag if some tag in config.protected_tags

guarded_tags contains tag if some tag, _ in config.risk.target_tag_points

# ... and the tags the data's restrictions key on: a deny rule, approval rule, critical call or
# quota selecting target_tags, or a binding whose role denies, scoped to guest_tags, holds on a
# guest only while it carries the tag (untagged, the guest would escape it)
guarded_tags contains tag if {
	some selectors in [config.deny_rules, config.approval.rules, config.risk.critical_calls, config.quotas, config.resource_quotas]
	some sel in selectors
	some tag in object.get(sel, "target_tags", [])
}

guarded_tags contains tag if {
	some b in config.bindings
	count(object.get(config.roles, [b.role, "deny"], [])) > 0
	some tag in object.get(b, ["scope", "guest_tags"], [])
}

# the tag list a call asks for (PVE separates tags with ';', and accepts ',' and spaces)
requested_tags contains tag if {
	some tag in regex.split(`[;, ]+`, input.arguments.tags)
	tag != ""
}

target_known if input.target.known == true

in_maintenance_window if {
	some w in config.maintenance_windows
	lib.in_window(w, lib.weekday, lib.hour_utc)
}

# destroy/exec outside any window, not a dry run
outside_window_risky if {
	input.tool.effect in {"destroy", "exec"}
	not obligations.dry_run
	not in_maintenance_window
}

# a break-glass role turns the window denial into an approval requirement
break_glass_approval_required if {
	outside_window_risky
	rbac.break_glass
}

default windows_text := "none configured"

windows_text := concat("; ", sort([window_text(w) | some w in config.maintenance_windows])) if {
	count(config.maintenance_windows) > 0
}

window_text(w) := sprintf(
	"%s %s %s:00-%s:00",
	[object.get(w, "name", "window"), concat(",", w.weekdays), hour_text(w.from_hour), hour_text(w.to_hour)],
)

# hour_text(h): two digits; a non-number (a data error, reported as such) as it is, not as %!d
hour_text(h) := sprintf("%02d", [h]) if is_number(h)

hour_text(h) := sprintf("%v", [h]) if not is_number(h)

# hidden_from_list(tool): a target-independent guard rail makes the tool
# useless to the lister (input.principal), so tools/list hides it: agents never
# mutate resources of the agent_no_mutation_scopes, and a deny rule of the
# lister that ignores the target matches the tool.
hidden_from_list(tool) if {
	input.principal.kind == "agent"
	tool.effect in lib.mutating_effects
	tool.scope in config.agent_no_mutation_scopes
}

hidden_from_list(tool) if {
	some c in lister_deny_rules
	lib.compiled_matches(c, tool)
}

# the lister's target-independent deny rules, compiled once per query
lister_deny_rules contains lib.compile(rule) if {
	some rule in config.deny_rules
	not "target_tags" in object.keys(rule)
	lib.principal_matches(rule, input.principal)
}

# --- download hosts: helpers of guardrail.download_host ---

download_host_allowed if {
	host := input.target.url_host
	is_string(host)
	some pattern in config.download_hosts
	host_matches(lower(host), lower(pattern))
}

host_matches(host, pattern) if host == pattern

host_matches(host, pattern) if {
	startswith(pattern, "*.")
	endswith(host, substring(pattern, 1, -1))
}

allowed_hosts_text := ["none"] if count(config.download_hosts) == 0

allowed_hosts_text := config.download_hosts if count(config.download_hosts) > 0

default download_host_text := "a URL without a trustworthy host"

download_host_text := sprintf("host %q", [input.target.url_host]) if is_string(input.target.url_host)
