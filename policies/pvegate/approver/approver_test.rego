package pvegate.approver_test

import data.pvegate.approver
import data.pvegate.fixtures_test as fx

groups := ["sre-leads"]

test_alice_may_approve_agent_request if {
	d := approver.decision with input as fx.approve_input(fx.alice, "demo-agent", groups, [])
	d == {"allow": true, "deny": [], "deny_reasons": [], "groups": ["sre-leads"]}
}

test_decision_names_the_groups_the_approver_qualified_through if {
	# bob qualifies for ops-approvers through the data's member list, not his token
	d := approver.decision with input as fx.approve_input(fx.bob, "demo-agent", ["ops-approvers", "sre-leads"], [])
	d.groups == ["ops-approvers"]
}

test_membership_from_data if {
	# bob carries no group in his token; data lists him in ops-approvers
	approver.allow with input as fx.approve_input(fx.bob, "demo-agent", ["ops-approvers"], [])
	d := approver.decision with input as fx.approve_input(fx.bob, "demo-agent", groups, [])
	fx.has_reason(d.deny, "bob is not in any of the approver groups [\"sre-leads\"]")
}

test_membership_by_token_role if {
	inp := fx.approve_input(fx.bob, "demo-agent", ["dba"], [])
	approver.allow with input as inp with data.data.approver_groups.dba as {"token_roles": ["dba-lead"]}
		with input.approver.roles as ["dba-lead"]
}

test_no_groups_means_any_approver if {
	approver.allow with input as fx.approve_input(fx.bob, "demo-agent", [], [])
}

test_requester_may_not_approve_own_request if {
	d := approver.decision with input as fx.approve_input(fx.alice, "alice", groups, [])
	d.allow == false
	fx.has_reason(d.deny, "four-eyes")
}

test_no_double_approval if {
	inp := object.union(fx.approve_input(fx.alice, "demo-agent", groups, [{"approver": "alice"}]), {"pending": {"min_approvals": 2}})
	d := approver.decision with input as inp
	fx.has_reason(d.deny, "alice has already approved this request")
}

test_fully_approved_request if {
	d := approver.decision with input as fx.approve_input(fx.alice, "demo-agent", groups, [{"approver": "bob"}])
	fx.has_reason(d.deny, "already has all the approvals it needs")
}

test_agents_may_not_approve if {
	a := object.union(fx.alice, {"kind": "agent", "sub": "robot"})
	d := approver.decision with input as fx.approve_input(a, "demo-agent", groups, [])
	fx.has_reason(d.deny, "only humans may approve; robot is of kind agent")
}

test_needs_approve_role if {
	# in the group by token, but no role with approve: true
	p := object.union(fx.nobody, {"groups": ["ops-approvers"]})
	d := approver.decision with input as fx.approve_input(p, "demo-agent", ["ops-approvers"], [])
	fx.has_reason(d.deny, "no role of mallory may approve requests on this target")
}

test_malformed_input if {
	d := approver.decision with input as {"contract_version": 2, "kind": "call"}
	d.allow == false
	fx.has_reason(d.deny, "unsupported contract_version 2")
	fx.has_reason(d.deny, "input kind must be \"approve\"")
	fx.has_reason(d.deny, "input.approver.sub is missing")
	fx.has_reason(d.deny, "input.pending.requester is missing")
	fx.has_reason(d.deny, "input.pending.approver_groups is missing")
}

test_no_input if {
	d := approver.decision with input as "nonsense"
	d.allow == false
	fx.has_reason(d.deny, "no input document")
}

# --- step-up: approval.step_up_max_age_seconds_by_level -----------------------------------------

critical_input(auth) := object.union_n([
	fx.approve_input(fx.alice, "demo-agent", groups, []),
	{"authentication": auth},
	{"pending": {"risk": {"score": 90, "level": "critical", "factors": []}}},
])

# wed_1540 in seconds
signed_in_at := 1795621200

test_step_up_recent_sign_in_may_vote if {
	d := approver.decision with input as critical_input({"auth_time": signed_in_at - 60, "via": "console"})
		with data.data.approval.step_up_max_age_seconds_by_level as {"critical": 300}
	d.allow
	d.step_up_max_age_seconds == 300
}

test_step_up_old_sign_in_is_refused_with_its_code if {
	d := approver.decision with input as critical_input({"auth_time": signed_in_at - 301, "via": "console"})
		with data.data.approval.step_up_max_age_seconds_by_level as {"critical": 300}
	not d.allow
	fx.has_reason(d.deny, "within the last 300 seconds")
	some r in d.deny_reasons
	r.code == "approver.step_up_required"
}

test_step_up_without_auth_time_is_refused if {
	d := approver.decision with input as critical_input({"auth_time": null})
		with data.data.approval.step_up_max_age_seconds_by_level as {"critical": 300}
	not d.allow
}

test_no_step_up_for_levels_not_listed if {
	d := approver.decision with input as fx.approve_input(fx.alice, "demo-agent", groups, [])
		with data.data.approval.step_up_max_age_seconds_by_level as {"critical": 300}
	d.allow
	not "step_up_max_age_seconds" in object.keys(d)
}
