# A scoped deny holds wherever the call reaches its scope
# (package pvegate.rbac_test: the fixtures of rbac_test.rego are shared)
package pvegate.rbac_test

import data.pvegate.fixtures_test as fx
import data.pvegate.rbac

# --- a scoped deny holds wherever the call reaches its scope ---------------------------
# (a grant needs the target and every guest the call reaches covered; a deny holds when any is)

fenced_org(scope) := {
	"roles": {
		"all": {"allow": [{"tools": ["*"]}]},
		"fence": {"deny": [{"tools": ["guest_clone", "guest_migrate", "vm_restore", "storage_volume_delete", "backup_prune"]}]},
	},
	"bindings": [
		{"name": "everything", "role": "all", "subjects": ["mallory"]},
		{"name": "fenced", "role": "fence", "subjects": ["mallory"], "scope": scope},
	],
}

fence_reasons(scope, tool, target) := reasons if {
	reasons := rbac.deny with input as fx.call(fx.nobody, tool, target) with data.data as fenced_org(scope)
}

fence_holds(scope, tool, target) if {
	fx.has_reason(fence_reasons(scope, tool, target), sprintf("role \"fence\" (binding \"fenced\") forbids tool %q", [tool.name]))
}

test_a_pool_scoped_deny_holds_on_a_clones_source_and_destination if {
	web := {"pools": ["web"]}
	fence_holds(web, clone_tool, into(fx.prod_guest, {"vmid": 190})) # web into web
	fence_holds(web, clone_tool, into(fx.prod_guest, {"vmid": 190, "pool": "sandbox"})) # out of web
	fence_holds(web, clone_tool, into(sandbox_guest, {"vmid": 190, "pool": "web"})) # into web
	count(fence_reasons(web, clone_tool, into(sandbox_guest, {"vmid": 190}))) == 0 # nowhere near web
}

test_a_node_scoped_deny_holds_on_a_migrations_source_and_destination if {
	pve2 := {"nodes": ["pve2"]}
	fence_holds(pve2, fx.guest_migrate, into(fx.lab_guest, {"node": "pve2"})) # to pve2
	fence_holds(pve2, fx.guest_migrate, into(object.union(fx.lab_guest, {"node": "pve2"}), {"node": "pve1"})) # from pve2
	count(fence_reasons(pve2, fx.guest_migrate, into(fx.lab_guest, {"node": "pve3"}))) == 0
}

test_a_pool_scoped_deny_holds_on_the_guest_a_backup_was_taken_of if {
	prod := {"pools": ["prod"]}
	fence_holds(prod, restore_tool, from_backup_of(new_lab_guest, 101, "prod"))
	fence_holds(prod, restore_tool, from_backup_of(object.union(new_lab_guest, {"pool": "prod"}), 205, "lab"))
	count(fence_reasons(prod, restore_tool, from_backup_of(new_lab_guest, 205, "lab"))) == 0
}

test_a_scoped_deny_holds_on_a_volumes_owner if {
	prod := {"pools": ["prod"]}
	theirs := on_volume("local:backup/vzdump-qemu-101-x.vma.zst", "backup", 101, "pve2", "prod")
	fence_holds(prod, volume_delete_tool, theirs)
	mine := on_volume("local:backup/vzdump-qemu-205-x.vma.zst", "backup", 205, "pve1", "lab")
	count(fence_reasons(prod, volume_delete_tool, mine)) == 0
	iso := on_volume("local:iso/debian.iso", null, null, null, null)
	count(fence_reasons(prod, volume_delete_tool, iso)) == 0
}

test_a_scoped_deny_holds_on_every_guest_a_prune_reaches if {
	pve2 := {"nodes": ["pve2"]}
	fence_holds(pve2, prune_tool, pruning([removes(205, "pve1"), removes(101, "pve2")]))
	count(fence_reasons(pve2, prune_tool, pruning([removes(205, "pve1")]))) == 0
	count(fence_reasons(pve2, prune_tool, pruning([]))) == 0

	# what it would delete, unknown, may be in the scope: the deny holds (fail closed)
	unknown := object.union(fx.node_target, {"storage": "local", "prune_removes": {"known": false, "guests": []}})
	fence_holds(pve2, prune_tool, unknown)
}

test_a_pool_scoped_deny_holds_where_a_hidden_pool_is_reached if {
	# a clone of a visible sandbox guest into a guest whose pool is hidden: the fence may apply there
	hidden_dest := into(sandbox_guest, {"vmid": 190, "pool": null, "pool_known": false})
	fx.has_reason(
		fence_reasons({"pools": ["web"]}, clone_tool, hidden_dest),
		"role \"fence\" (binding \"fenced\") forbids tool \"guest_clone\" in pool web",
	)
	count(fence_reasons({"pools": ["web"]}, clone_tool, into(sandbox_guest, {"vmid": 190}))) == 0
}

test_a_node_scoped_deny_holds_where_a_reached_guests_node_is_not_known if {
	pve2 := {"nodes": ["pve2"]}

	# an HA group move: the HA manager picks the node (destination node null)
	fence_holds(pve2, fx.guest_migrate, into(fx.lab_guest, {"node": null}))

	# a restore of a backup whose guest is gone or could not be read
	gone := object.union(new_lab_guest, {"backup_of": {"cluster": "default", "node": null, "vmid": 101, "pool": null, "tags": []}})
	fence_holds(pve2, restore_tool, gone)

	# a volume whose owner could not be looked up; an ISO (nobody's) stays outside the fence
	unread := on_volume("local:backup/vzdump-qemu-101-x.vma.zst", "backup", 101, null, null)
	fence_holds(pve2, volume_delete_tool, object.union(unread, {"volume_of": object.union(unread.volume_of, {"exists": null})}))
	count(fence_reasons(pve2, volume_delete_tool, on_volume("local:iso/debian.iso", null, null, null, null))) == 0

	# a deny fencing another cluster's nodes does not hold here
	count(fence_reasons({"clusters": ["other"], "nodes": ["pve2"]}, fx.guest_migrate, into(fx.lab_guest, {"node": null}))) == 0

	# a known node elsewhere: no fence
	count(fence_reasons(pve2, fx.guest_migrate, into(fx.lab_guest, {"node": "pve3"}))) == 0
}

test_a_pool_scoped_deny_holds_on_a_restore_whose_backups_guest_is_gone if {
	# the gateway cannot tell the pool of a backup's guest that is gone or could not be read
	# (pool null, pool_known false): it may have been in the fenced pool (fail closed)
	gone := {"cluster": "default", "node": null, "vmid": 101, "pool": null, "pool_known": false, "tags": []}
	prod := {"pools": ["prod"]}
	fx.has_reason(
		fence_reasons(prod, restore_tool, object.union(new_lab_guest, {"backup_of": gone})),
		"role \"fence\" (binding \"fenced\") forbids tool \"vm_restore\" in pool prod",
	)
	fx.has_reason(fence_reasons(prod, restore_tool, object.union(new_lab_guest, {"backup_of": gone})), "or the guest is gone")

	# nor does a pool-scoped grant cover it
	restore_org_reasons := rbac.deny with input as fx.call(fx.nobody, restore_tool, object.union(new_lab_guest, {"backup_of": gone}))
		with data.data as restore_org
	fx.has_reason(restore_org_reasons, "no role of principal")

	# a guest known to be in no pool stays outside the fence
	count(fence_reasons(prod, restore_tool, from_backup_of(new_lab_guest, 101, null))) == 0
}
