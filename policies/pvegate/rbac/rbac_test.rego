package pvegate.rbac_test

import data.pvegate.fixtures_test as fx
import data.pvegate.lib
import data.pvegate.rbac

test_operator_token_role_grants_guest_power if {
	count(rbac.granting_bindings) == 1 with input as fx.call(fx.agent, fx.vm_stop, fx.prod_guest)
	count(rbac.deny) == 0 with input as fx.call(fx.agent, fx.vm_stop, fx.prod_guest)
	rbac.granting_roles == {"operator"} with input as fx.call(fx.agent, fx.vm_stop, fx.prod_guest)
}

test_unbound_principal_is_denied_with_reason if {
	reasons := rbac.deny with input as fx.call(fx.nobody, fx.vm_stop, fx.prod_guest)
	fx.has_reason(reasons, "no role of principal \"mallory\" permits write tool \"vm_stop\" on guest 101")
}

test_viewer_may_read_but_not_write if {
	count(rbac.deny) == 0 with input as fx.call(fx.viewer, fx.guest_config_tool, fx.prod_guest)
	count(rbac.deny) == 1 with input as fx.call(fx.viewer, fx.vm_stop, fx.prod_guest)
}

test_viewer_may_not_read_access_domain if {
	reasons := rbac.deny with input as fx.call(fx.viewer, fx.token_perms_tool, fx.unknown_target)
	fx.has_reason(reasons, "on an unresolved target")
}

test_auditor_reads_access_domain if {
	count(rbac.deny) == 0 with input as fx.call(fx.auditor, fx.token_perms_tool, fx.unknown_target)
}

test_role_deny_overrides_allow if {
	# operator allows write on guest_* but denies *guest_migrate
	reasons := rbac.deny with input as fx.call(fx.agent, fx.guest_migrate, fx.prod_guest)
	fx.has_reason(reasons, "role \"operator\" (binding \"operators\") forbids tool \"guest_migrate\"")
	count(rbac.granting_bindings) == 0 with input as fx.call(fx.agent, fx.guest_migrate, fx.prod_guest)
}

test_operators_create_no_guest_by_restore_or_clone if {
	# the operator's globs match vm_restore, lxc_restore and guest_clone; each makes a new guest
	# (a restore with the backup's privileges), which is the provisioner's, within quotas
	every name in ["vm_restore", "lxc_restore", "guest_clone", "vm_create", "lxc_create"] {
		reasons := rbac.deny with input as fx.call(fx.agent, fx.tool(name, "backup", "write", "guest", []), fx.prod_guest)
		fx.has_reason(reasons, sprintf("role \"operator\" (binding \"operators\") forbids tool %q", [name]))
	}
}

test_deny_from_one_role_beats_allow_from_another if {
	org := {
		"roles": {"a": {"allow": [{"tools": ["*"]}]}, "b": {"allow": [{"effects": ["read"]}], "deny": [{"tools": ["vm_stop"]}]}},
		"bindings": [{"name": "ba", "role": "a", "subjects": ["mallory"]}, {"name": "bb", "role": "b", "subjects": ["mallory"]}],
	}
	reasons := rbac.deny with input as fx.call(fx.nobody, fx.vm_stop, fx.prod_guest) with data.data as org
	fx.has_reason(reasons, "role \"b\" (binding \"bb\") forbids")
	count(rbac.granting_bindings) == 1 with input as fx.call(fx.nobody, fx.vm_stop, fx.prod_guest) with data.data as org
}

test_pool_scoped_binding_applies_only_in_pool if {
	count(rbac.deny) == 0 with input as fx.call(fx.web_dev, fx.vm_stop, fx.web_guest)
	reasons := rbac.deny with input as fx.call(fx.web_dev, fx.vm_stop, fx.lab_guest)
	fx.has_reason(reasons, "guest 205 on node pve1 (pool lab)")
}

test_pool_scope_fails_on_unknown_target if {
	count(rbac.granting_bindings) == 0 with input as fx.call(fx.web_dev, fx.vm_stop, fx.unknown_target)
}

test_node_text_in_reason if {
	reasons := rbac.deny with input as fx.call(fx.nobody, node_scoped_nodes_tool, fx.node_target)
	fx.has_reason(reasons, "on node pve1")
}

node_scoped_nodes_tool := object.union(fx.nodes_tool, {"scope": "node"})

scoped_org(scope) := {
	"roles": {"r": {"allow": [{"tools": ["*"]}]}},
	"bindings": [{"name": "scoped", "role": "r", "subjects": ["mallory"], "scope": scope}],
}

granted(scope, target) if {
	count(rbac.granting_bindings) == 1 with input as fx.call(fx.nobody, fx.vm_stop, target)
		with data.data as scoped_org(scope)
}

test_scope_clusters if {
	granted({"clusters": ["default"]}, fx.prod_guest)
	not granted({"clusters": ["other"]}, fx.prod_guest)
}

test_scope_nodes if {
	granted({"nodes": ["pve1"]}, fx.prod_guest)
	not granted({"nodes": ["pve2"]}, fx.prod_guest)
}

test_scope_guest_tags if {
	granted({"guest_tags": ["prod", "x"]}, fx.prod_guest)
	not granted({"guest_tags": ["x"]}, fx.prod_guest)
}

test_scope_vmid_ranges if {
	granted({"vmids": [{"from": 100, "to": 199}]}, fx.prod_guest)
	not granted({"vmids": [{"from": 200, "to": 299}]}, fx.prod_guest)
	not granted({"vmids": [{"from": 100, "to": 199}]}, fx.unknown_target)
}

test_scope_all_constraints_must_hold if {
	granted({"pools": ["web"], "nodes": ["pve1"]}, fx.prod_guest)
	not granted({"pools": ["web"], "nodes": ["pve9"]}, fx.prod_guest)
}

test_binding_by_group_and_kind_filter if {
	# admins binding is restricted to humans
	count(rbac.granting_bindings) == 1 with input as fx.call(fx.admin, fx.node_network_update, fx.node_target)
	agent_admin := object.union(fx.admin, {"kind": "agent"})
	count(rbac.granting_bindings) == 0 with input as fx.call(agent_admin, fx.node_network_update, fx.node_target)
}

test_binding_to_unknown_role_is_ignored if {
	org := {"roles": {}, "bindings": [{"name": "x", "role": "ghost", "subjects": ["mallory"]}]}
	count(rbac.bindings_for(fx.nobody)) == 0 with data.data as org
}

test_break_glass_role if {
	rbac.break_glass with input as fx.call(fx.breakglass, fx.guest_delete, fx.lab_guest)
	not rbac.break_glass with input as fx.call(fx.admin, fx.guest_delete, fx.lab_guest)
}

test_tool_visible_ignores_scope if {
	inp := fx.listing_input(fx.web_dev, [fx.vm_stop, fx.guest_delete, fx.guest_config_tool])
	rbac.tool_visible(fx.vm_stop) with input as inp
	rbac.tool_visible(fx.guest_config_tool) with input as inp
	not rbac.tool_visible(fx.guest_delete) with input as inp
}

test_may_approve if {
	rbac.may_approve(fx.alice, fx.prod_guest)
	rbac.may_approve(fx.bob, fx.prod_guest)
	not rbac.may_approve(fx.agent, fx.prod_guest)
}

test_listing_name_denies_in_plain_shapes if {
	org := {
		"roles": {"r": {
			"allow": [{"effects": ["write"]}],
			"deny": [{"tools": ["vm_stop", "lxc_*"]}, {"tools": ["*"], "domains": ["snapshot"]}],
		}},
		"bindings": [{"role": "r", "subjects": ["mallory"]}],
	}
	snap_create := fx.tool("snapshot_create", "snapshot", "write", "guest", [])
	vm_start := fx.tool("vm_start", "guest", "write", "guest", [])
	tools := [fx.vm_stop, fx.lxc_start, snap_create, vm_start]
	v := data.pvegate.visible_tools with input as fx.listing_input(fx.nobody, tools) with data.data as org
	v == {"vm_start"}
}

health_summary(leaves) := object.union(
	fx.tool("guest_health_summary", "guest", "read", "guest", []),
	{"connector": "composite", "uses": leaves},
)

test_composite_granted_when_every_leaf_is if {
	leaves := [fx.guest_config_tool, fx.tool("list_snapshots", "snapshot", "read", "guest", [])]
	count(rbac.deny) == 0 with input as fx.call(fx.viewer, health_summary(leaves), fx.prod_guest)
}

test_composite_denied_when_a_leaf_is_not if {
	# the viewer may not read the access domain, so a composite reading through it is denied
	leaves := [fx.guest_config_tool, fx.token_perms_tool]
	reasons := rbac.deny with input as fx.call(fx.viewer, health_summary(leaves), fx.prod_guest)
	fx.has_reason(reasons, sprintf("reads through %q", [fx.token_perms_tool.name]))
}

# a selector with effects and domains only is matched without lib.tool_matches:
# the same answers, also for a tool missing a part tool_matches reads
test_domain_only_selectors_match_as_tool_matches if {
	roles := {"r": {
		"allow": [{"effects": ["read"], "domains": ["guest", "node"]}, {"effects": ["*"]}],
		"deny": [{"domains": ["node"]}],
	}}
	every tool in [
		{"name": "a", "effect": "read", "domain": "guest", "scope": "guest"},
		{"name": "a", "effect": "read", "domain": "node", "scope": "node"},
		{"name": "a", "effect": "write", "domain": "guest", "scope": "guest"},
		{"name": "a", "effect": "read", "domain": "guest"},
		{"effect": "read", "domain": "node", "scope": "node"},
		{"name": "a", "effect": "read", "scope": "guest"},
	] {
		grants := {i | some i, sel in roles.r.allow; lib.tool_matches(sel, tool)}
		denies := {i | some i, sel in roles.r.deny; lib.tool_matches(sel, tool)}
		count([1 | rbac.role_grants("r", tool)]) == min([1, count(grants)]) with data.data.roles as roles
		count([1 | rbac.role_denies("r", tool)]) == min([1, count(denies)]) with data.data.roles as roles
	}
}

test_caller_bindings_keep_the_kind_filter_and_defined_roles if {
	call := fx.call(fx.admin, fx.node_network_update, fx.node_target)
	count(rbac.caller_bindings) > 0 with input as call

	# the admins binding admits humans only
	"admins" in {b.name | some b in rbac.caller_bindings} with input as call
	as_agent := rbac.caller_bindings with input as call with input.principal.kind as "agent"
	not "admins" in {b.name | some b in as_agent}

	# a kind the contract does not know finds no binding
	count(rbac.caller_bindings) == 0 with input as call with input.principal.kind as "robot"

	# a binding to a role the data does not define is no binding
	org := {"roles": {}, "bindings": [{"name": "x", "role": "ghost", "subjects": [fx.admin.sub]}]}
	count(rbac.caller_bindings) == 0 with input as call with data.data as org
}

# --- where a call puts a guest (target.destination) -----------------------------

clone_tool := fx.tool("guest_clone", "guest", "write", "guest", ["provision"])

sandbox_org := {
	"roles": {"provisioner": {"allow": [{"tools": ["guest_clone", "guest_migrate"]}], "approve": true}},
	"bindings": [{
		"name": "sandbox-only", "role": "provisioner", "subjects": ["mallory"],
		"scope": {"pools": ["sandbox"], "nodes": ["pve1"]},
	}],
}

sandbox_guest := fx.guest(189, [], "sandbox", null)

# into(target, changes): the target with a destination: the same guest, changed as the call says
into(target, changes) := object.union(target, {"destination": object.union(
	{"cluster": target.cluster, "node": target.node, "vmid": target.vmid, "pool": target.pool, "tags": target.tags},
	changes,
)})

test_a_clone_must_land_inside_the_bindings_scope if {
	inside := into(sandbox_guest, {"vmid": 190})
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, clone_tool, inside) with data.data as sandbox_org

	prod := into(sandbox_guest, {"vmid": 190, "pool": "prod"})
	reasons := rbac.deny with input as fx.call(fx.nobody, clone_tool, prod) with data.data as sandbox_org
	fx.has_reason(reasons, "on guest 189 on node pve1 (pool sandbox) into guest 190 on node pve1 (pool prod)")

	no_pool := into(sandbox_guest, {"vmid": 191, "pool": null}) # Proxmox puts it in no pool
	count(rbac.granting_bindings) == 0 with input as fx.call(fx.nobody, clone_tool, no_pool) with data.data as sandbox_org
}

test_a_migration_must_land_on_a_node_of_the_scope if {
	stays := into(sandbox_guest, {"node": "pve1"})
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, fx.guest_migrate, stays) with data.data as sandbox_org
	leaves := into(sandbox_guest, {"node": "pve2"})
	count(rbac.granting_bindings) == 0 with input as fx.call(fx.nobody, fx.guest_migrate, leaves) with data.data as sandbox_org
}

# an HA group moves the guest to a node the HA manager picks (destination node null): a
# node-scoped binding does not cover it, a binding without a node constraint does
test_an_ha_group_is_set_only_without_a_node_constraint if {
	ha_tool := fx.tool("ha_resource_group_set", "ha", "write", "guest", ["ha", "group"])
	grant := {"op": "replace", "path": "/roles/provisioner/allow/0/tools", "value": ["ha_resource_group_set"]}
	org := json.patch(sandbox_org, [grant])
	anywhere := into(sandbox_guest, {"node": null})
	count(rbac.granting_bindings) == 0 with input as fx.call(fx.nobody, ha_tool, anywhere) with data.data as org

	pool_only := json.patch(org, [{"op": "remove", "path": "/bindings/0/scope/nodes"}])
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, ha_tool, anywhere) with data.data as pool_only
}

test_an_approver_must_cover_the_destination_too if {
	approver := fx.principal("mallory", "human", [], [])
	rbac.may_approve(approver, into(sandbox_guest, {"vmid": 190})) with data.data as sandbox_org
	not rbac.may_approve(approver, into(sandbox_guest, {"vmid": 190, "pool": "prod"})) with data.data as sandbox_org
}

# --- a restore copies the guest its backup was taken of (target.backup_of) ------

restore_tool := fx.tool("vm_restore", "backup", "write", "guest", ["restore"])

restore_org := {
	"roles": {"restorer": {"allow": [{"tools": ["vm_restore"]}]}},
	"bindings": [{"name": "lab-only", "role": "restorer", "subjects": ["mallory"], "scope": {"pools": ["lab"]}}],
}

new_lab_guest := object.union(fx.guest(151, [], "lab", null), {"status": null})

from_backup_of(target, vmid, pool) := object.union(target, {"backup_of": source}) if {
	source := {"cluster": "default", "node": "pve1", "vmid": vmid, "pool": pool, "tags": []}
}

test_a_restore_must_copy_a_guest_inside_the_bindings_scope if {
	mine := from_backup_of(new_lab_guest, 205, "lab")
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, restore_tool, mine) with data.data as restore_org

	prod := from_backup_of(new_lab_guest, 101, "prod")
	reasons := rbac.deny with input as fx.call(fx.nobody, restore_tool, prod) with data.data as restore_org
	fx.has_reason(reasons, "guest 151 on node pve1 (pool lab) from a backup of guest 101 (pool prod)")

	gone := from_backup_of(new_lab_guest, 999, null) # the backed-up guest no longer exists: unknown pool
	count(rbac.granting_bindings) == 0 with input as fx.call(fx.nobody, restore_tool, gone) with data.data as restore_org
}

# --- a guest's volume, and the backups a prune deletes, are that guest's -----------

storage_org := {
	"roles": {"storage-keeper": {"allow": [{"tools": ["storage_volume_delete", "backup_prune"]}]}},
	"bindings": [{"name": "pve1-only", "role": "storage-keeper", "subjects": ["mallory"], "scope": {"nodes": ["pve1"]}}],
}

volume_delete_tool := fx.tool("storage_volume_delete", "storage", "destroy", "storage", ["content"])

prune_tool := fx.tool("backup_prune", "backup", "destroy", "storage", ["backup", "prune"])

# on_volume(volume, content, vmid, node, pool): pve1's storage, a volume the guest on `node` owns
on_volume(volume, content, vmid, node, pool) := object.union(fx.node_target, {"storage": "local", "volume_of": {
	"cluster": "default", "volume": volume, "content": content, "vmid": vmid,
	"node": node, "pool": pool, "tags": [], "exists": node != null,
}})

test_a_volume_is_its_guests_the_scope_must_cover_it if {
	mine := on_volume("local:backup/vzdump-qemu-205-x.vma.zst", "backup", 205, "pve1", "lab")
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, volume_delete_tool, mine) with data.data as storage_org

	theirs := on_volume("local:backup/vzdump-qemu-101-x.vma.zst", "backup", 101, "pve2", "prod")
	reasons := rbac.deny with input as fx.call(fx.nobody, volume_delete_tool, theirs) with data.data as storage_org
	fx.has_reason(reasons, "node pve1 (volume local:backup/vzdump-qemu-101-x.vma.zst of guest 101, pool prod)")

	gone := on_volume("local:backup/vzdump-qemu-777-x.vma.zst", "backup", 777, null, null) # where it was: unknown
	count(rbac.granting_bindings) == 0 with input as fx.call(fx.nobody, volume_delete_tool, gone) with data.data as storage_org

	iso := on_volume("local:iso/debian.iso", null, null, null, null) # nobody's: the storage's
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, volume_delete_tool, iso) with data.data as storage_org
}

# pruning(guests): a prune on pve1's storage that deletes backups of these guests
pruning(guests) := object.union(fx.node_target, {"storage": "local", "prune_removes": {"known": true, "guests": guests}})

removes(vmid, node) := {"vmid": vmid, "node": node, "pool": null, "tags": [], "exists": node != null}

test_a_prune_must_delete_only_backups_of_guests_in_scope if {
	mine := pruning([removes(205, "pve1")])
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, prune_tool, mine) with data.data as storage_org
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, prune_tool, pruning([])) with data.data as storage_org

	theirs := pruning([removes(205, "pve1"), removes(101, "pve2")])
	reasons := rbac.deny with input as fx.call(fx.nobody, prune_tool, theirs) with data.data as storage_org
	fx.has_reason(reasons, "node pve1 (deleting backups of guests 205, 101)")

	gone := pruning([removes(777, null)])
	count(rbac.granting_bindings) == 0 with input as fx.call(fx.nobody, prune_tool, gone) with data.data as storage_org
}

test_a_prune_of_unknown_reach_is_in_no_scoped_bindings_scope if {
	unknown := object.union(fx.node_target, {"storage": "local", "prune_removes": {"known": false, "guests": []}})
	count(rbac.granting_bindings) == 0 with input as fx.call(fx.nobody, prune_tool, unknown) with data.data as storage_org
}

# --- a guest whose pool Proxmox hides from the gateway's token (pool_known false) ----------

# mallory operates everything, but a pool-scoped binding forbids her deleting and migrating in prod
prod_fenced_org := {
	"roles": {
		"all": {"allow": [{"tools": ["*"]}]},
		"prod-fence": {"deny": [{"tools": ["guest_delete", "guest_migrate", "vm_restore_in_place"]}]},
	},
	"bindings": [
		{"name": "everything", "role": "all", "subjects": ["mallory"]},
		{"name": "not-in-prod", "role": "prod-fence", "subjects": ["mallory"], "scope": {"pools": ["prod"], "nodes": ["pve1"]}},
	],
}

# a guest listed without a pool: hidden (the token may not see every pool) or in none
hidden_guest := object.union(fx.guest(101, [], null, null), {"pool_known": false})

no_pool_guest := object.union(fx.guest(101, [], null, null), {"pool_known": true})

fenced(target, tool) := reasons if {
	reasons := rbac.deny with input as fx.call(fx.nobody, tool, target) with data.data as prod_fenced_org
}

test_a_pool_scoped_deny_holds_on_a_guest_whose_pool_is_hidden if {
	in_prod := object.union(hidden_guest, {"pool": "prod", "pool_known": true})
	fx.has_reason(fenced(in_prod, fx.guest_delete), "forbids tool \"guest_delete\"")
	fx.has_reason(
		fenced(hidden_guest, fx.guest_delete),
		concat("", [
			"role \"prod-fence\" (binding \"not-in-prod\") forbids tool \"guest_delete\" in pool prod, ",
			"and Proxmox hides the guest's pool from the gateway's token",
		]),
	)
	count(fenced(hidden_guest, fx.vm_stop)) == 0 # what the role does not forbid is still granted

	# a guest in no pool, the token seeing every pool (or an input recorded before the field)
	count(fenced(no_pool_guest, fx.guest_delete)) == 0
	count(fenced(fx.guest(101, [], null, null), fx.guest_delete)) == 0

	# the binding's other constraints still hold: off its nodes, it cannot apply
	count(fenced(object.union(hidden_guest, {"node": "pve2"}), fx.guest_delete)) == 0
}

test_a_hidden_pool_grants_nothing_a_pool_scoped_binding_allows if {
	hidden := object.union(fx.guest(189, [], null, null), {"pool_known": false})
	count(rbac.granting_bindings) == 0 with input as fx.call(fx.nobody, clone_tool, hidden) with data.data as sandbox_org
}

test_a_pool_scoped_deny_holds_on_every_guest_the_call_reaches if {
	# a migration keeps the guest's pool: its destination's is hidden too
	migrates := into(hidden_guest, {"node": "pve1", "pool_known": false})
	fx.has_reason(fenced(migrates, fx.guest_migrate), "forbids tool \"guest_migrate\" in pool prod")

	# a restore in place from the guest's own backup: the backed-up guest's pool is hidden too
	restore := fx.tool("vm_restore_in_place", "backup", "write", "guest", ["restore"])
	own := object.union(hidden_guest, {"backup_of": {
		"cluster": "default", "node": "pve1", "vmid": 101, "pool": null, "pool_known": false,
		"tags": [],
	}})
	fx.has_reason(fenced(own, restore), "forbids tool \"vm_restore_in_place\" in pool prod")
}

test_every_hidden_pool_is_revealed_as_the_bindings if {
	target := object.union(hidden_guest, {
		"volume_of": {"pool": null, "pool_known": false},
		"prune_removes": {"known": true, "guests": [{"vmid": 7, "pool": null, "pool_known": false}, {"vmid": 8, "pool": "lab"}]},
	})
	out := rbac.in_pool(target, "prod")
	out.pool == "prod"
	out.volume_of.pool == "prod"
	[g.pool | some g in out.prune_removes.guests] == ["prod", "lab"]
	rbac.in_pool(fx.lab_guest, "prod") == fx.lab_guest

	with_prune := object.union(fx.node_target, {"prune_removes": {"known": true, "guests": [{"pool_known": false}]}})
	rbac.pool_hidden with input as fx.call(fx.nobody, fx.vm_stop, with_prune)
	rbac.pool_hidden with input as fx.call(fx.nobody, fx.vm_stop, object.union(fx.node_target, {"volume_of": {"pool_known": false}}))
	not rbac.pool_hidden with input as fx.call(fx.nobody, fx.vm_stop, fx.node_target)
	every key in ["destination", "backup_of"] {
		rbac.pool_hidden with input as fx.call(fx.nobody, fx.vm_stop, object.union(fx.node_target, {key: {"pool_known": false}}))
	}
}

# --- a pool membership change moves the guests of target.members ------------------------------
# mallory may change any pool; a binding scoped to pool prod forbids it there

members_tool := fx.tool("pool_members_add", "cluster", "write", "cluster", ["pools"])

pools_fenced_org := {
	"roles": {
		"pools": {"allow": [{"tools": ["pool_*"]}]},
		"prod-fence": {"deny": [{"tools": ["pool_*"]}]},
	},
	"bindings": [
		{"name": "pools", "role": "pools", "subjects": ["mallory"]},
		{"name": "not-prod", "role": "prod-fence", "subjects": ["mallory"], "scope": {"pools": ["prod"]}},
	],
}

moving(known, guests) := object.union_n([
	fx.node_target,
	{"node": null, "name": null},
	{"members": {"known": known, "guests": guests}},
])

member(vmid, pool, pool_known) := {
	"vmid": vmid, "node": "pve1", "pool": pool, "pool_known": pool_known,
	"tags": [], "exists": true,
}

test_a_pool_scoped_deny_holds_on_a_guest_the_change_moves if {
	lab := moving(true, [member(205, "lab", true)])
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, members_tool, lab) with data.data as pools_fenced_org
	prod := moving(true, [member(205, "lab", true), member(101, "prod", true)])
	reasons := rbac.deny with input as fx.call(fx.nobody, members_tool, prod) with data.data as pools_fenced_org
	fx.has_reason(reasons, "role \"prod-fence\"")
}

test_a_moved_guest_of_unknown_or_hidden_pool_meets_the_pools_deny if {
	unknown := moving(false, [])
	fx.has_reason(rbac.deny, "role \"prod-fence\"") with input as fx.call(fx.nobody, members_tool, unknown)
		with data.data as pools_fenced_org
	hidden := moving(true, [member(101, null, false)])
	fx.has_reason(rbac.deny, "role \"prod-fence\"") with input as fx.call(fx.nobody, members_tool, hidden)
		with data.data as pools_fenced_org
	no_pool := moving(true, [member(101, null, true)])
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, members_tool, no_pool) with data.data as pools_fenced_org
}

test_a_grant_covers_a_move_only_when_its_reach_is_known if {
	org := {
		"roles": {"pools": {"allow": [{"tools": ["pool_*"]}]}},
		"bindings": [{"name": "cluster-pools", "role": "pools", "subjects": ["mallory"], "scope": {"clusters": ["default"]}}],
	}
	count(rbac.granting_bindings) > 0 with input as fx.call(fx.nobody, members_tool, moving(true, [member(205, "lab", true)]))
		with data.data as org
	count(rbac.granting_bindings) == 0 with input as fx.call(fx.nobody, members_tool, moving(false, []))
		with data.data as org
	other := object.union(org, {"bindings": [object.union(org.bindings[0], {"scope": {"clusters": ["other"]}})]})
	reasons := rbac.deny with input as fx.call(fx.nobody, members_tool, moving(true, [member(101, "prod", true)]))
		with data.data as other
	fx.has_reason(reasons, "(reaching guests 101)")
}

test_an_unknown_reach_meets_only_the_fences_of_its_cluster if {
	org := json.patch(pools_fenced_org, [{"op": "add", "path": "/bindings/1/scope/clusters", "value": ["other"]}])
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, members_tool, moving(false, [])) with data.data as org
}
