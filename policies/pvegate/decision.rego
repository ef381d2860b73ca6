# METADATA
# title: pvegate decisions
# description: |
#   Entry point data.pvegate.decision for MCP tools/call (contract version 1,
#   see docs/policy-contract.md). It validates the input, collects the deny
#   reasons of RBAC, guard rails, approvals and quotas, and assembles risk,
#   approval and obligations. It is always defined: any input it cannot
#   decide yields allow false with a reason.
# schemas:
#   - input: schema["policy_input.schema"]
package pvegate

import data.pvegate.approval
import data.pvegate.config
import data.pvegate.guardrails
import data.pvegate.lib
import data.pvegate.obligations
import data.pvegate.quotas
import data.pvegate.rbac
import data.pvegate.resources
import data.pvegate.risk

# contract versions this policy understands
known_contract_versions := {1}

contract_version := 1

kinds := {"agent", "human", "service"}

scopes := {"guest", "node", "cluster", "storage"}

# --- input validation --------------------------------------------------------------

# input_problems: why the input cannot be decided (shared with tools/list)
# NOTE: `not is_string(x)` and `not x in s` are never true when x is undefined
# (OPA evaluates the arguments outside the negation), so every check below
# tests a helper rule that defaults to false. (`== false`, not `not helper`:
# partially evaluated (opa build -O=1), OPA 1.22 gave two of the support rules
# it writes for such negations one name, and the optimised policy answered an
# input without a principal differently from the plain one.)
input_problems contains "no input document" if input_is_object == false

input_problems contains msg if {
	is_object(input)
	v := object.get(input, "contract_version", null)
	not v in known_contract_versions
	msg := sprintf("unsupported contract_version %v; this policy knows %v", [v, known_contract_versions])
}

input_problems contains "input.principal.sub must be a non-empty string" if principal_ok == false

input_problems contains "input.principal.kind must be agent, human or service" if principal_kind_ok == false

input_problems contains "input.principal.roles and .groups must be arrays" if principal_lists_ok == false

input_problems contains "input.request.time must be an RFC 3339 time" if request_time_ok == false

default input_is_object := false

input_is_object if is_object(input)

default principal_kind_ok := false

principal_kind_ok if input.principal.kind in kinds

default principal_ok := false

principal_ok if {
	is_string(input.principal.sub)
	input.principal.sub != ""
}

default principal_lists_ok := false

principal_lists_ok if {
	is_array(input.principal.roles)
	is_array(input.principal.groups)
}

default request_time_ok := false

request_time_ok if lib.now_ns

# call_problems: additionally, for tools/call
call_problems contains msg if some msg in input_problems

call_problems contains msg if {
	is_object(input)
	object.get(input, "kind", null) != "call"
	msg := sprintf("input kind must be \"call\" for this entry point, got %v", [object.get(input, "kind", null)])
}

call_problems contains "input.tool.name must be a string" if tool_name_ok == false

call_problems contains "input.tool.effect must be read, write, destroy or exec" if tool_effect_ok == false

call_problems contains "input.tool.scope must be guest, node, cluster or storage" if tool_scope_ok == false

call_problems contains "input.target must be an object" if target_ok == false

call_problems contains "input.arguments must be an object" if arguments_ok == false

call_problems contains "input.arguments_digest must be a string" if digest_ok == false

call_problems contains "input.usage must hold the usage counters" if usage_ok == false

default tool_name_ok := false

tool_name_ok if is_string(input.tool.name)

default tool_effect_ok := false

tool_effect_ok if input.tool.effect in lib.effects

default tool_scope_ok := false

tool_scope_ok if input.tool.scope in scopes

default target_ok := false

target_ok if is_object(input.target)

# (the rules reading the arguments, critical calls by argument value among them, would
# not hold without them: a call without its arguments is not decided)
default arguments_ok := false

arguments_ok if is_object(input.arguments)

default digest_ok := false

digest_ok if is_string(input.arguments_digest)

default usage_ok := false

usage_ok if is_object(input.usage)

# call_input_ok: none of the call_problems above holds, tested in one rule body. A
# well-formed call (every call the gateway sends) is decided without evaluating a
# rule per problem; call_problems is computed only for the calls it refuses.
# (A default, so that the decision tests `call_input_ok == false` for the fallback:
# `not call_input_ok` is a support rule of its own once partially evaluated.)
default call_input_ok := false

call_input_ok if {
	input.contract_version in known_contract_versions
	input.kind == "call"
	sub := input.principal.sub
	is_string(sub)
	sub != ""
	input.principal.kind in kinds
	is_array(input.principal.roles)
	is_array(input.principal.groups)
	lib.now_ns
	is_string(input.tool.name)
	input.tool.effect in lib.effects
	input.tool.scope in scopes
	is_object(input.target)
	is_object(input.arguments)
	is_string(input.arguments_digest)
	is_object(input.usage)
}

# --- the decision ------------------------------------------------------------------

# denials: every reason to deny the call, each {code, rule, message} (one rule body
# for the union, not a rule body per package)
denials := (((rbac.denials | guardrails.denials) | approval.denials) | quotas.denials) | resources.denials

# deny_reasons: their sentences (the decision's `deny`)
deny_reasons contains r.message if some r in denials

# the reasons for an input that cannot be decided
input_denials contains lib.reason(problem_code(msg), "pvegate.call_problems", msg) if some msg in call_problems

problem_code(msg) := "input.unsupported_contract_version" if {
	startswith(msg, "unsupported contract_version")
} else := "input.invalid"

default allow := false

allow if {
	call_input_ok
	count(deny_reasons) == 0
	approval.required == false
}

allow if {
	call_input_ok
	count(deny_reasons) == 0
	approval.required
	approval.satisfied
}

# --- the policy data ----------------------------------------------------------------
# The data is checked once per policy revision, not on every call: it depends on
# data only, and OPA keeps no rule results across queries, so a check inside the
# decision costs every call (the JSON Schema validation alone is most of a
# decision). The gateway asks data_check when it first sees a revision, and in its
# readiness probe; while the data is invalid it answers every call with the
# refusal below and is not ready (docs/policy-contract.md).

# data_denials: one reason per problem of the data
data_denials contains lib.reason("data.invalid", "pvegate.config.problems", msg) if {
	some problem in config.problems
	msg := sprintf("policy data error: %s; denied until the data is fixed", [problem])
}

# METADATA
# title: Policy data check
# description: |
#   Whether the policy data is usable, its problems, and the decision that
#   stands for every call while it is not (null when valid).
# entrypoint: true
data_check := {
	"valid": count(config.problems) == 0,
	"problems": sort(config.problems),
	"refusal": data_refusal,
}

default data_refusal := null

data_refusal := fallback(data_denials) if count(data_denials) > 0

# checked_decision: what the gateway answers, in one query (for tools that
# evaluate a policy tree once: explain, tests): the data's refusal while the data
# is invalid, else the decision
checked_decision := data_refusal if {
	count(data_denials) > 0
} else := decision

# returned when the input cannot be decided at all
fallback(reasons) := {
	"contract_version": contract_version,
	"allow": false,
	"deny": sort({r.message | some r in reasons}),
	"deny_reasons": sort(reasons),
	"risk": {"score": 100, "level": "critical", "factors": []},
	"approval": {
		"required": false,
		"satisfied": false,
		"approver_groups": [],
		"min_approvals": 0,
		"ttl_seconds": 0,
		"reason": "",
		"reasons": [],
	},
	"obligations": {"dry_run": true, "redact": [], "max_items": 0},
	"quota": null,
}

# METADATA
# title: Decision for tools/call
# description: The decision document of contract version 1 (gateway/schemas/decision.schema.json).
# entrypoint: true
# schemas:
#   - input: schema["decision_input.schema"]
default decision := {
	"contract_version": 1,
	"allow": false,
	"deny": ["the policy could not compute a decision for this input; denied by default"],
	"deny_reasons": [{
		"code": "policy.undecidable",
		"rule": "pvegate.decision",
		"message": "the policy could not compute a decision for this input; denied by default",
	}],
	"risk": {"score": 100, "level": "critical", "factors": []},
	"approval": {
		"required": false,
		"satisfied": false,
		"approver_groups": [],
		"min_approvals": 0,
		"ttl_seconds": 0,
		"reason": "",
		"reasons": [],
	},
	"obligations": {"dry_run": true, "redact": [], "max_items": 0},
	"quota": null,
}

decision := fallback(input_denials) if call_input_ok == false

decision := {
	"contract_version": contract_version,
	"allow": allow,
	"deny": sort(deny_reasons),
	"deny_reasons": sort(denials),
	"risk": risk.result,
	"approval": approval.result,
	"obligations": obligations.result,
	"quota": quotas.result,
} if {
	call_input_ok
}
