package pvegate.guardrails_test

import data.pvegate.fixtures_test as fx
import data.pvegate.guardrails

vm_disk_attach := fx.tool("vm_disk_attach", "guest", "write", "guest", ["disk"])

attach(slot) := fx.call(fx.admin, vm_disk_attach, object.union(fx.lab_guest, {"slot": slot}))

test_an_attach_into_a_slot_in_use_is_refused if {
	inp := attach({"name": "scsi0", "in_use": true})
	{r.code | some r in guardrails.denials} == {"guardrail.slot_in_use"} with input as inp
	fx.has_reason(guardrails.deny, "scsi0 of guest 205 holds a disk: a new one there would detach it") with input as inp
}

test_an_attach_into_a_free_slot_passes if {
	count(guardrails.denials) == 0 with input as attach({"name": "scsi3", "in_use": false})
}

test_a_slot_that_could_not_be_checked_is_refused if {
	every in_use in [null, "yes", 1] {
		codes := {r.code | some r in guardrails.denials} with input as attach({"name": "mp0", "in_use": in_use})
		codes == {"guardrail.slot_unknown"}
	}
}

test_no_slot_rule_without_the_slot_fact if {
	codes := {r.code | some r in guardrails.denials} with input as fx.call(fx.admin, vm_disk_attach, fx.lab_guest)
	not "guardrail.slot_in_use" in codes
	not "guardrail.slot_unknown" in codes
}
