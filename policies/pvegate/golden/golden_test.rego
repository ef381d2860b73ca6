# Golden decision cases: policies/golden/<scenario>.json, loaded by
# `opa test policies` at data.golden.<scenario> (each file holds one object
# keyed by its scenario name). Every case's input is decided by
# data.pvegate.decision and compared with its partial expectations. The same
# files are replayed against a live OPA server by tests/policy/test_golden_live.py.
package pvegate.golden_test

default cases := {}

cases := data.golden

# failures: [scenario, what went wrong] for every unmet expectation
failures contains [name, msg] if {
	some name, c in cases
	d := data.pvegate.decision with input as c.input
	some msg in mismatches(c.expect, d)
}

failures contains [name, "the case's name field must equal its key and file name"] if {
	some name, c in cases
	c.name != name
}

# a case the comparison cannot run, or runs without a word on part of it, must fail rather than
# pass vacuously: a misspelled key (`inputs`, `expect.deny_code`) would otherwise be ignored
failures contains [name, msg] if {
	some name, c in cases
	some msg in shape_problems(c)
}

# the keys of a case, and of its expect object: each expectation is one compared below
case_keys := {"name", "description", "input", "expect"}

expect_keys := {
	"allow", "risk_level", "approval_required", "approval_satisfied", "approver_groups", "min_approvals", "quota",
	"deny_contains", "deny_empty", "obligations", "risk_factors_include", "approval_reason_contains",
	"deny_codes", "approval_codes",
}

shape_problems(c) := (({sprintf("unknown case keys %v (known: %v)", [sort(unknown), sort(case_keys)]) |
	unknown := object.keys(c) - case_keys
	count(unknown) > 0
} | {"the case has no input object" |
	not has_input(c)
}) | {"the case has no expect object stating allow" |
	not expects_allow(c)
}) | {sprintf("unknown expect keys %v (known: %v)", [sort(unknown), sort(expect_keys)]) |
	unknown := object.keys(c.expect) - expect_keys
	count(unknown) > 0
}

# (helpers: `not is_object(c.input)` is not true when c.input is undefined)
has_input(c) if is_object(c.input)

expects_allow(c) if "allow" in object.keys(c.expect)

mismatches(exp, d) := union({
	value_mismatch(exp, d),
	deny_mismatch(exp, d),
	obligation_mismatch(exp, d),
	factor_mismatch(exp, d),
	reason_mismatch(exp, d),
	code_mismatch(exp, d),
	reasons_disagree(d),
})

# the decision facts that expectations of the same name compare by equality
observed(d) := {
	"allow": d.allow,
	"risk_level": d.risk.level,
	"approval_required": d.approval.required,
	"approval_satisfied": d.approval.satisfied,
	"approver_groups": d.approval.approver_groups,
	"min_approvals": d.approval.min_approvals,
	"quota": d.quota,
}

value_mismatch(exp, d) := {sprintf("%s: want %v, got %v", [key, exp[key], got]) |
	some key, got in observed(d)
	key in object.keys(exp)
	exp[key] != got
}

deny_mismatch(exp, d) := {sprintf("deny: no reason contains %q; got %v", [frag, d.deny]) |
	some frag in object.get(exp, "deny_contains", [])
	not has_fragment(d.deny, frag)
} | {sprintf("deny: want none, got %v", [d.deny]) |
	exp.deny_empty == true
	count(d.deny) > 0
}

obligation_mismatch(exp, d) := {sprintf("obligations.%s: want %v, got %v", [k, v, d.obligations[k]]) |
	some k, v in object.get(exp, "obligations", {})
	d.obligations[k] != v
}

factor_mismatch(exp, d) := {sprintf("risk factors: want %q among %v", [name, names]) |
	names := {f.name | some f in d.risk.factors}
	some name in object.get(exp, "risk_factors_include", [])
	not name in names
}

reason_mismatch(exp, d) := {sprintf("approval.reason: want it to contain %q, got %q", [frag, d.approval.reason]) |
	frag := exp.approval_reason_contains
	not contains(d.approval.reason, frag)
}

# deny_codes / approval_codes: each code is among the decision's reasons
code_mismatch(exp, d) := {sprintf("deny_codes: want %q among %v", [code, codes]) |
	codes := sort({r.code | some r in d.deny_reasons})
	some code in object.get(exp, "deny_codes", [])
	not code in codes
} | {sprintf("approval_codes: want %q among %v", [code, codes]) |
	codes := sort({r.code | some r in d.approval.reasons})
	some code in object.get(exp, "approval_codes", [])
	not code in codes
}

# every case, whatever it expects: the sentences are exactly the coded reasons' messages
reasons_disagree(d) := {sprintf("deny %v is not the messages of deny_reasons %v", [d.deny, d.deny_reasons]) |
	d.deny != sort({r.message | some r in d.deny_reasons})
} | {sprintf("approval.reason %q is not the messages of approval.reasons %v", [d.approval.reason, d.approval.reasons]) |
	d.approval.reason != concat("; ", sort({r.message | some r in d.approval.reasons}))
}

has_fragment(reasons, frag) if {
	some r in reasons
	contains(r, frag)
}

test_golden_cases_are_loaded if {
	count(cases) >= 20
}

# every key observed() compares is one a case may expect
test_golden_expect_keys_cover_the_observed_facts if {
	d := data.pvegate.decision with input as cases.viewer_reads_guest_config.input
	count(object.keys(observed(d)) - expect_keys) == 0
}

# A failing run names each case and what it expected against what it got
# (opa test shows the print output of a failing test).
test_golden_cases_decide_as_expected if {
	failures_printed
	count(failures) == 0
}

failures_printed if {
	every f in sort(failures) {
		# regal ignore:print-or-trace-call
		print("golden case", f[0], "-", f[1])
	}
}

# the comparison itself can fail: a wrong expectation is reported
test_golden_comparison_detects_mismatch if {
	c := cases.viewer_reads_guest_config
	d := data.pvegate.decision with input as c.input
	bad := {
		"allow": false, "deny_contains": ["nope"], "deny_empty": true, "risk_level": "critical",
		"obligations": {"max_items": 1}, "risk_factors_include": ["x"], "approval_reason_contains": "x",
		"deny_codes": ["rbac.not_granted"], "approval_codes": ["approval.rule"],
	}
	count(mismatches(bad, d)) == 8
	count(mismatches(c.expect, d)) == 0
}

test_golden_reasons_must_agree_with_sentences if {
	d := data.pvegate.decision with input as cases.viewer_cannot_stop_guest.input
	count(reasons_disagree(d)) == 0
	count(reasons_disagree(object.union(d, {"deny": ["another sentence"]}))) == 1
	bad_approval := object.union(d.approval, {"reason": "x"})
	count(reasons_disagree(object.union(d, {"approval": bad_approval}))) == 1
}

test_golden_refuses_a_case_it_cannot_compare if {
	c := cases.viewer_reads_guest_config
	count(shape_problems(c)) == 0
	typo := object.union(c, {"expect": object.union(c.expect, {"deny_code": ["rbac.not_granted"]})})
	no_input := object.remove(c, ["input"])
	no_expect := object.remove(c, ["expect"])
	no_allow := object.union(no_expect, {"expect": {"deny_empty": true}}) # (object.union merges nested objects)
	misspelt := object.union(no_input, {"inputs": c.input})
	got := failures with data.golden as {
		"typo": object.union(typo, {"name": "typo"}),
		"no_input": object.union(no_input, {"name": "no_input"}),
		"no_expect": object.union(no_expect, {"name": "no_expect"}),
		"no_allow": object.union(no_allow, {"name": "no_allow"}),
		"misspelt": object.union(misspelt, {"name": "misspelt"}),
	}
	{f[0] | some f in got} == {"typo", "no_input", "no_expect", "no_allow", "misspelt"}
	some f in got
	f == ["typo", sprintf("unknown expect keys [\"deny_code\"] (known: %v)", [sort(expect_keys)])]
}

test_golden_deny_empty_detects_reasons if {
	c := cases.viewer_cannot_stop_guest
	d := data.pvegate.decision with input as c.input
	count(mismatches({"deny_empty": true}, d)) == 1
}
