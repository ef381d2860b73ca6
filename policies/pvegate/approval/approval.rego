# METADATA
# title: Approval requirements and presented approvals
# description: |
#   Decides whether a call needs a human approval (from the risk level
#   threshold in data, from approval rules, or from the break-glass guard
#   rail), who may give it, how many and for how long; and checks an approval
#   presented with the call against the exact call it was granted for.
# schemas:
#   - input: schema["decision_input.schema"]
package pvegate.approval

import data.pvegate.config
import data.pvegate.guardrails
import data.pvegate.lib
import data.pvegate.obligations
import data.pvegate.rbac
import data.pvegate.risk

cfg := config.approval

# --- is an approval required ---------------------------------------------------

# reasons: the sentences of the approval reasons below
reasons contains r.message if some r in requirements

requirements contains lib.reason("approval.risk_level", "data.approval.required_from_level", msg) if {
	not waived
	risk.level in levels_needing_approval
	msg := sprintf(
		"risk %s (score %d) is at or above the approval threshold %s",
		[risk.level, risk.score, cfg.required_from_level],
	)
}

requirements contains lib.reason("approval.rule", sprintf("data.approval.rules[%s]", [name]), msg) if {
	not waived
	some rule in matching_rules
	name := object.get(rule, "name", "unnamed")
	msg := object.get(rule, "reason", sprintf("approval rule %q", [name]))
}

requirements contains lib.reason("approval.break_glass", "pvegate.guardrails.break_glass_approval_required", msg) if {
	guardrails.break_glass_approval_required
	msg := sprintf("break-glass: %s outside the maintenance window needs an approval", [input.tool.effect])
}

# a four-eyes role (e.g. iam-admin): every mutation it grants needs two distinct
# approvers; like break-glass it is a property of the role, so no waiver lifts it
requirements contains lib.reason("approval.four_eyes_role", sprintf("data.roles.%s.four_eyes", [name]), msg) if {
	input.tool.effect in lib.mutating_effects
	not obligations.dry_run
	some name in four_eyes_roles
	msg := sprintf("role %q is four-eyes: every change it grants needs a second approver", [name])
}

four_eyes_roles contains name if {
	some name in rbac.granting_roles
	config.roles[name].four_eyes == true
}

four_eyes_min_approvals := 2 if count(four_eyes_roles) > 0

# an active waiver (e.g. declared for an incident) lifts the risk-level and rule
# approvals of the calls it matches (selector keys as in rules); the break-glass
# approval is a guard rail and stays
waived if {
	some w in cfg.waivers
	w.active == true
	lib.call_matches(w, input.principal, input.tool, input.target)
}

# approval rules do not apply to dry runs (nothing changes) unless the rule
# says `include_dry_run: true`
# the approval rules by the effects, principal kinds and tool names they can match
# (lib.index_names)
rule_index[effect][kind][name] contains i if {
	some i, sel in cfg.rules
	some effect in lib.effects
	some kind in lib.principal_kinds
	lib.admits_call_kind(sel, effect, kind)
	some name in lib.index_names(sel)
}

rule_exact[i] := lib.exact_selector(sel) if some i, sel in cfg.rules

# the rules filed under the call's effect, principal kind and tool name, or "*"
# (the lookups in the rule bodies, so that partially evaluated each clause tests
# the call's effect, kind and name, and OPA's rule index picks the few that hold)
matching_rules contains rule if {
	some i in rule_index[input.tool.effect][input.principal.kind][input.tool.name]
	rule := cfg.rules[i]
	lib.index_hit(rule_exact[i], rule)
	applies_to_this_run(rule)
}

matching_rules contains rule if {
	some i in rule_index[input.tool.effect][input.principal.kind]["*"]
	rule := cfg.rules[i]
	lib.index_hit(rule_exact[i], rule)
	applies_to_this_run(rule)
}

applies_to_this_run(_) if not obligations.dry_run

applies_to_this_run(rule) if rule.include_dry_run == true

default required := false

# (the requirements, not their sentences: a call that needs no approval, most calls,
# then does not build `reasons`)
required if count(requirements) > 0

# the risk levels at or above cfg.required_from_level (data only: a constant
# once partially evaluated, so a decision tests its level in one step)
levels_needing_approval contains level if {
	some level, rank in lib.level_rank
	rank >= lib.level_rank[cfg.required_from_level]
}

# rules with their own approver groups replace the default groups
rule_groups contains g if {
	some rule in matching_rules
	some g in object.get(rule, "approver_groups", [])
}

approver_groups := sort(rule_groups) if count(rule_groups) > 0

approver_groups := sort({g | some g in cfg.default_approver_groups}) if count(rule_groups) == 0

level_min_approvals := object.get(cfg.min_approvals_by_level, risk.level, cfg.default_min_approvals)

# (object.get, not r.min_approvals: partially evaluated with the data known
# (opa build -O=1), a ref to a key that some rules lack fails the type check)
rule_min_approvals contains n if {
	some r in matching_rules
	n := object.get(r, "min_approvals", null)
	is_number(n)
}

rule_min_approvals contains four_eyes_min_approvals

# the strictest of the level's, the matching rules' and a four-eyes role's minimums
min_approvals := max(rule_min_approvals | {level_min_approvals})

level_ttl_seconds := object.get(cfg.ttl_seconds_by_level, risk.level, cfg.default_ttl_seconds)

rule_ttl_seconds contains n if {
	some r in matching_rules
	n := object.get(r, "ttl_seconds", null)
	is_number(n)
}

# the shortest of the level's and the matching rules' ttls
ttl_seconds := min(rule_ttl_seconds | {level_ttl_seconds})

# --- the approval presented with the call ----------------------------------------

presented := input.approval if is_object(input.approval)

# problems: ways in which the presented approval does not fit this call
problems contains "it was granted for another tool" if presented.tool != input.tool.name

problems contains "it was granted for other arguments" if presented.arguments_digest != input.arguments_digest

problems contains "it was granted to another requester" if presented.requester != input.principal.sub

problems contains "it was granted for another target" if {
	some attr in ["cluster", "node", "vmid"]
	object.get(presented.target, attr, null) != object.get(input.target, attr, null)
}

problems contains "it has expired" if time.parse_rfc3339_ns(presented.expires_at) <= lib.now_ns

# an approval lasts what the policy asks now for this call, from when it was granted: a lifetime
# shortened since (a rollout) applies to approvals granted before it too. (`presented` and
# `required` first: only a call that presents an approval and needs one computes it)
problems contains msg if {
	presented
	required
	time.parse_rfc3339_ns(presented.approved_at) + (ttl_seconds * 1000000000) <= lib.now_ns
	msg := sprintf(
		"it was approved at %s, longer ago than the %d s an approval of this call lasts now",
		[presented.approved_at, ttl_seconds],
	)
}

problems contains "its approval time is unreadable" if {
	presented
	required
	not granted_time_readable
}

problems contains "its expiry time is unreadable" if {
	presented
	not expiry_readable
}

problems contains "the requester approved their own request (four-eyes)" if input.principal.sub in presented.approvers

problems contains "it is malformed" if {
	presented
	not well_formed
}

expiry_readable if time.parse_rfc3339_ns(presented.expires_at)

granted_time_readable if time.parse_rfc3339_ns(presented.approved_at)

well_formed if {
	is_string(presented.tool)
	is_string(presented.arguments_digest)
	is_string(presented.requester)
	is_object(presented.target)
	is_string(presented.expires_at)
	is_array(presented.approvers)
}

# enough distinct approvers, at least one from a required group
sufficient if {
	count({a | some a in presented.approvers}) >= min_approvals
	group_ok
}

group_ok if count(approver_groups) == 0

group_ok if {
	some g in object.get(presented, "approver_groups", [])
	g in approver_groups
}

default satisfied := false

satisfied if {
	presented
	count(problems) == 0
	sufficient
}

# deny: the sentences of the denials below
deny contains r.message if some r in denials

# (`presented` first: every problem reads it, and a call without an approval,
# most calls, then skips the problem rules)
denials contains lib.reason("approval.not_for_this_call", "pvegate.approval.problems", msg) if {
	presented
	count(problems) > 0
	msg := sprintf(
		"the approval %v presented with this call is not valid for it: %s; retry without it to request a new approval",
		[object.get(presented, "id", "(no id)"), concat("; ", sort(problems))],
	)
}

denials contains lib.reason("approval.insufficient", "pvegate.approval.sufficient", msg) if {
	required
	presented
	count(problems) == 0
	not sufficient
	msg := sprintf(
		"the approval %v is not enough: it needs %d approver(s) from %v; retry without it to request a new approval",
		[object.get(presented, "id", "(no id)"), min_approvals, approver_groups],
	)
}

result := {
	"required": true,
	"satisfied": satisfied,
	"approver_groups": approver_groups,
	"min_approvals": min_approvals,
	"ttl_seconds": ttl_seconds,
	"reason": concat("; ", sort(reasons)),
	"reasons": sort(requirements),
} if {
	required
}

result := {
	"required": false,
	"satisfied": satisfied,
	"approver_groups": [],
	"min_approvals": 0,
	"ttl_seconds": 0,
	"reason": "",
	"reasons": [],
} if {
	required == false
}
