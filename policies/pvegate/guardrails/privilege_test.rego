package pvegate.guardrails_test

import data.pvegate.fixtures_test as fx
import data.pvegate.guardrails

lxc_restore_in_place := fx.tool("lxc_restore_in_place", "backup", "destroy", "guest", ["backup", "restore"])

restore(now, backup) := fx.call_at(
	fx.admin,
	lxc_restore_in_place,
	object.union(fx.lab_guest, {"type": "lxc", "privileged": now, "backup_of": {"vmid": 210, "privileged": backup}}),
	fx.sat_1000,
)

codes(inp) := c if {
	c := {r.code | some r in guardrails.denials} with input as inp
}

test_a_privileged_backup_over_an_unprivileged_container_is_refused if {
	inp := restore(false, true)
	"guardrail.privileged_restore" in codes(inp)
	fx.has_reason(guardrails.deny, "over unprivileged container 205 it would make it privileged") with input as inp
}

test_restores_that_keep_or_drop_privilege_pass if {
	every pair in [[false, false], [true, true], [true, false]] {
		inp := restore(pair[0], pair[1])
		not "guardrail.privileged_restore" in codes(inp)
		not "guardrail.privilege_unknown" in codes(inp)
	}
}

test_privileges_not_known_are_refused if {
	every pair in [[null, false], [false, null], ["no", true]] {
		"guardrail.privilege_unknown" in codes(restore(pair[0], pair[1]))
	}
}

test_no_privilege_rule_without_the_fact if {
	inp := fx.call_at(fx.admin, lxc_restore_in_place, fx.lab_guest, fx.sat_1000)
	not "guardrail.privilege_unknown" in codes(inp)
	not "guardrail.privileged_restore" in codes(inp)
}
