# How a call's target reads in the denial messages (part of RBAC; the package's METADATA is
# in rbac.rego): the guest or node, and where the call puts it or what else it reaches.
package pvegate.rbac

# target_text describes the target, and where the call puts it, for messages.
target_text := concat("", [subject_text, destination_text, backup_of_text, volume_of_text, prune_text, members_text])

default subject_text := "an unresolved target"

subject_text := sprintf("guest %v on node %v (pool %v)", [input.target.vmid, input.target.node, input.target.pool]) if {
	input.target.known == true
	input.target.vmid != null
}

subject_text := sprintf("node %v", [input.target.node]) if {
	input.target.known == true
	input.target.vmid == null
}

default backup_of_text := ""

backup_of_text := sprintf(" from a backup of guest %v (pool %v)", [b.vmid, b.pool]) if {
	b := input.target.backup_of
}

default volume_of_text := ""

volume_of_text := sprintf(" (volume %v of guest %v, pool %v)", [v.volume, v.vmid, v.pool]) if {
	v := input.target.volume_of
	v.content != null
}

default prune_text := ""

prune_text := sprintf(" (deleting backups of guests %v)", [concat(", ", pruned_vmids)]) if {
	count(input.target.prune_removes.guests) > 0
}

pruned_vmids := [sprintf("%v", [g.vmid]) | some g in input.target.prune_removes.guests]

default members_text := ""

members_text := sprintf(" (reaching guests %v)", [concat(", ", member_vmids)]) if {
	count(input.target.members.guests) > 0
}

member_vmids := [sprintf("%v", [g.vmid]) | some g in input.target.members.guests]

default destination_text := ""

destination_text := sprintf(" into guest %v on node %v (pool %v)", [d.vmid, d.node, d.pool]) if {
	d := input.target.destination
}
