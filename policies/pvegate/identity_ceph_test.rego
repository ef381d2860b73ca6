# Identity and Ceph changes in the example data: critical_calls make identity writes
# and an OSD set out critical (two approvers), the rebalance tool tag Ceph OSD writes high; the
# iam-admin role is four-eyes whatever the risk; a new token's secret is revealed
# to humans only.
package pvegate_test

import data.pvegate
import data.pvegate.fixtures_test as fx

iam_admin := fx.principal("ivan", "human", [], ["iam-admins"])

cluster_target := {
	"cluster": "default", "node": null, "vmid": null, "type": null, "name": null, "tags": [],
	"pool": null, "status": null, "ha_state": null, "known": true,
}

user_create := fx.tool("user_create", "access", "write", "cluster", ["access", "user"])

token_create := fx.tool("token_create", "access", "write", "cluster", ["access", "token"])

users_read := fx.tool("list_users", "access", "read", "cluster", ["access", "user"])

osd_out := fx.tool("ceph_osd_out", "ceph", "write", "node", ["ceph", "osd", "rebalance"])

osd_in := fx.tool("ceph_osd_in", "ceph", "write", "node", ["ceph", "osd", "rebalance"])

codes(reasons) := {r.code | some r in reasons}

test_identity_write_is_critical_and_needs_two_approvers if {
	d := pvegate.decision with input as fx.call(fx.admin, user_create, cluster_target)
	d.risk.level == "critical"
	"critical_call:identity-changes" in {f.name | some f in d.risk.factors}
	d.approval.required
	d.approval.min_approvals == 2
	not d.allow
}

test_identity_write_runs_with_two_approvers if {
	inp := fx.with_approval(fx.call(fx.admin, user_create, cluster_target), ["alice", "bob"], ["ops-approvers"])
	pvegate.decision.allow with input as inp
}

test_identity_write_one_approver_is_not_enough if {
	inp := fx.with_approval(fx.call(fx.admin, user_create, cluster_target), ["alice"], ["sre-leads"])
	d := pvegate.decision with input as inp
	not d.allow
	"approval.insufficient" in codes(d.deny_reasons)
}

test_identity_read_needs_no_approval if {
	d := pvegate.decision with input as fx.call(fx.auditor, users_read, cluster_target)
	d.allow
	not d.approval.required
}

test_iam_admin_is_four_eyes_even_when_waived if {
	waiver := {"name": "all", "active": true, "reason": "incident", "domains": ["access"]}
	d := pvegate.decision with input as fx.call(iam_admin, user_create, cluster_target)
		with data.data.approval.waivers as [waiver]
	d.approval.required
	d.approval.min_approvals == 2
	codes(d.approval.reasons) == {"approval.four_eyes_role"}
}

test_iam_admin_dry_run_needs_no_approver if {
	inp := object.union(fx.call(iam_admin, user_create, cluster_target), {"dry_run": true})
	d := pvegate.decision with input as inp
	not "approval.four_eyes_role" in codes(d.approval.reasons)
}

test_iam_admin_reads_freely if {
	pvegate.decision.allow with input as fx.call(iam_admin, users_read, cluster_target)
}

test_iam_admin_may_not_touch_guests if {
	d := pvegate.decision with input as fx.call(iam_admin, fx.vm_stop, fx.lab_guest)
	not d.allow
	"rbac.not_granted" in codes(d.deny_reasons)
}

test_agents_never_change_identity if {
	d := pvegate.decision with input as fx.call(fx.agent, user_create, cluster_target)
	not d.allow
	"guardrail.deny_rule" in codes(d.deny_reasons)
}

test_token_secret_revealed_to_humans_only if {
	pvegate.decision.obligations.reveal_secrets with input as fx.call(fx.admin, token_create, cluster_target)
	not pvegate.decision.obligations.reveal_secrets with input as fx.call(fx.admin, user_create, cluster_target)
	bot := fx.principal("bot", "agent", [], ["pve-admins"])
	not pvegate.decision.obligations.reveal_secrets with input as fx.call(bot, token_create, cluster_target)
}

test_osd_out_is_critical_osd_in_high if {
	out := pvegate.decision with input as fx.call(fx.admin, osd_out, fx.node_target)
	out.risk.level == "critical"
	out.approval.min_approvals == 2
	d_in := pvegate.decision with input as fx.call(fx.admin, osd_in, fx.node_target)
	d_in.risk.level == "high"
	d_in.approval.required
	d_in.approval.min_approvals == 1
}

test_agents_never_set_osds_out if {
	d := pvegate.decision with input as fx.call(fx.agent, osd_out, fx.node_target)
	"guardrail.agent_scope" in codes(d.deny_reasons)
}
