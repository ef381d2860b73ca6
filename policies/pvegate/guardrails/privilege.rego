# Container privilege (part of the guard rails; the package's METADATA is in guardrails.rego).
# A restore over an existing container takes the backup's privilege unless the call sets
# it: another container's privileged backup restored over an unprivileged one makes it
# privileged, and root in a privileged container is root on the node. The gateway reads
# both (target.privileged, target.backup_of.privileged) for such a restore; the guard
# rails refuse that escalation, and a restore whose privileges could not be read.
package pvegate.guardrails

import data.pvegate.lib

denials contains lib.reason("guardrail.privileged_restore", "pvegate.guardrails.privileged_restore", msg) if {
	input.target.privileged == false
	input.target.backup_of.privileged == true
	msg := sprintf(
		"the backup is of a privileged container: restored over unprivileged container %v it would make it privileged",
		[input.target.vmid],
	)
}

denials contains lib.reason("guardrail.privilege_unknown", "pvegate.guardrails.privilege_unknown", msg) if {
	_ = input.target.privileged # the key is present (any value, null too), without building the set of keys
	not privileges_known
	msg := sprintf(
		"whether container %v or the backup restored over it is privileged could not be read; refusing: retry",
		[input.target.vmid],
	)
}

privileges_known if {
	is_boolean(input.target.privileged)
	is_boolean(input.target.backup_of.privileged)
}
