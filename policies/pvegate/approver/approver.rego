# METADATA
# title: Four-eyes approval of pending requests
# description: |
#   Entry point data.pvegate.approver.decision: may this approver approve this
#   pending request? The approver must not be the requester, must not have
#   approved it already, must be a human with a role that may approve on the
#   request's target, and must belong to one of the request's approver
#   groups (through a token group, or as a listed member in
#   data.data.approver_groups).
# schemas:
#   - input: schema["approve_input.schema"]
package pvegate.approver

import data.pvegate.config
import data.pvegate.lib
import data.pvegate.rbac

known_contract_versions := {1}

candidate := input.approver

pending := input.pending

# (negate helper rules: `not is_string(x)` is never true for an undefined x)
problems contains "no input document" if not input_is_object

problems contains msg if {
	is_object(input)
	v := object.get(input, "contract_version", null)
	not v in known_contract_versions
	msg := sprintf("unsupported contract_version %v; this policy knows %v", [v, known_contract_versions])
}

problems contains msg if {
	is_object(input)
	object.get(input, "kind", null) != "approve"
	msg := sprintf("input kind must be \"approve\", got %v", [object.get(input, "kind", null)])
}

problems contains "input.approver.sub is missing" if not candidate_ok

problems contains "input.pending.requester is missing" if not requester_ok

problems contains "input.pending.approver_groups is missing" if not groups_ok

input_is_object if is_object(input)

candidate_ok if is_string(candidate.sub)

requester_ok if is_string(pending.requester)

groups_ok if is_array(pending.approver_groups)

# deny: the sentences of the denials below
deny contains r.message if some r in denials

denials contains lib.reason("input.invalid", "pvegate.approver.problems", msg) if some msg in problems

denials contains lib.reason(
	"approver.self_approval", "pvegate.approver.four_eyes",
	"four-eyes: a requester may not approve their own request",
) if {
	candidate.sub == pending.requester
}

denials contains lib.reason("approver.already_approved", "pvegate.approver.four_eyes", msg) if {
	some a in object.get(pending, "approvals_so_far", [])
	a.approver == candidate.sub
	msg := sprintf("%s has already approved this request; a second approval must come from someone else", [candidate.sub])
}

denials contains lib.reason("approver.not_human", "pvegate.approver.humans_only", msg) if {
	not candidate.kind == "human"
	msg := sprintf("only humans may approve; %s is of kind %v", [candidate.sub, object.get(candidate, "kind", null)])
}

denials contains lib.reason("approver.not_in_group", "data.approver_groups", msg) if {
	count(problems) == 0
	not in_required_group
	msg := sprintf("%s is not in any of the approver groups %v for this request", [candidate.sub, pending.approver_groups])
}

denials contains lib.reason("approver.no_role", "data.roles.*.approve", msg) if {
	count(problems) == 0
	not rbac.may_approve(candidate, object.get(pending, "target", {}))
	msg := sprintf("no role of %s may approve requests on this target", [candidate.sub])
}

denials contains lib.reason(
	"approver.enough_approvals", "pvegate.approver.min_approvals",
	"this request already has all the approvals it needs",
) if {
	count(object.get(pending, "approvals_so_far", [])) >= pending.min_approvals
}

# a request without approver groups can be approved by any approver role
denials contains lib.reason("approver.step_up_required", "data.approval.step_up_max_age_seconds_by_level", msg) if {
	count(problems) == 0
	not authenticated_within(step_up_max_age)
	msg := sprintf(
		"voting on a %v-risk request needs a sign-in within the last %v seconds; sign in again",
		[pending.risk.level, step_up_max_age],
	)
}

in_required_group if count(pending.approver_groups) == 0

in_required_group if {
	some g in pending.approver_groups
	member(candidate, g)
}

# the request's approver groups this approver belongs to: recorded with the vote, they
# become input.approval.approver_groups when the approval is redeemed
qualified_groups contains g if {
	some g in pending.approver_groups
	member(candidate, g)
}

member(principal, group) if group in object.get(principal, "groups", [])

member(principal, group) if principal.sub in object.get(config.approver_groups, [group, "members"], [])

member(principal, group) if {
	some r in object.get(config.approver_groups, [group, "token_roles"], [])
	r in object.get(principal, "roles", [])
}

# Step-up: a request of a listed risk level may be voted on only by someone who authenticated
# recently (input.authentication.auth_time: the console's sign-in, or a bearer token's auth_time,
# else its iat). No auth_time at all is too old.
step_up_max_age := config.approval.step_up_max_age_seconds_by_level[object.get(pending, ["risk", "level"], "")]

authenticated_within(n) if {
	t := input.authentication.auth_time
	is_number(t)
	(input.request.time_ns / 1000000000) - t <= n
}

default step_up := {}

step_up := {"step_up_max_age_seconds": step_up_max_age}

default allow := false

allow if count(deny) == 0

# METADATA
# title: Approver decision
# description: |
#   {"allow": bool, "deny": [sentences], "deny_reasons": [{code, rule, message}],
#   "groups": [qualified groups], "step_up_max_age_seconds"?: n} for input kind
#   "approve". Not an optimiser entrypoint: it is asked once per vote, and OPA 1.22's
#   `opa build -O=1` gives support rules of two entrypoints the same names
#   (gateway/policy/optimized.py).
# schemas:
#   - input: schema["approve_input.schema"]
decision := object.union(
	{
		"allow": allow,
		"deny": sort(deny),
		"deny_reasons": sort(denials),
		"groups": sort(qualified_groups),
	},
	step_up,
)
