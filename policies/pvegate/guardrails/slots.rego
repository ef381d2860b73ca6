# Slots (part of the guard rails; the package's METADATA is in guardrails.rego).
# A tool that adds a disk or mount point names its config key (target.slot: scsi3, mp0).
# Proxmox does not refuse a key in use: it puts the new volume there and keeps the old
# one as unusedN, unplugged from a running VM. That is a detach, which the catalogue
# classes as destroy, so an attach into a slot in use is refused, whatever the tool's
# effect, and so is one whose slot could not be checked.
package pvegate.guardrails

import data.pvegate.lib

denials contains lib.reason("guardrail.slot_in_use", "pvegate.guardrails.slot_in_use", msg) if {
	input.target.slot.in_use == true
	msg := sprintf(
		"%s of guest %v holds a disk: a new one there would detach it (Proxmox keeps it as unused); use a free slot",
		[input.target.slot.name, input.target.vmid],
	)
}

denials contains lib.reason("guardrail.slot_unknown", "pvegate.guardrails.slot_unknown", msg) if {
	_ = input.target.slot # the key is present (any value, null too), without building the set of keys
	not is_boolean(input.target.slot.in_use)
	msg := sprintf(
		"whether %v of guest %v is free could not be checked (its config could not be read); refusing: retry",
		[object.get(input.target.slot, "name", "the slot"), input.target.vmid],
	)
}
