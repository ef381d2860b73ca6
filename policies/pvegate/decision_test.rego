package pvegate_test

import data.pvegate
import data.pvegate.fixtures_test as fx

prod_stop := fx.call(fx.agent, fx.vm_stop, fx.prod_guest)

test_read_allowed if {
	d := pvegate.decision with input as fx.call(fx.viewer, fx.guest_config_tool, fx.prod_guest)
	d.allow == true
	d.deny == []
	d.contract_version == 1
	d.approval.required == false
	d.obligations.redact == ["config.cipassword", "config.sshkeys"]
	d.quota == null
}

test_approval_required_means_no_deny_reasons if {
	d := pvegate.decision with input as prod_stop
	d.allow == false
	d.deny == []
	d.approval.required == true
	d.approval.satisfied == false
}

test_valid_approval_allows if {
	d := pvegate.decision with input as fx.with_approval(prod_stop, ["alice"], ["sre-leads"])
	d.allow == true
	d.approval.satisfied == true
}

test_deny_with_approval_required_is_plain_denial if {
	# viewer: not permitted, and the call is high risk
	d := pvegate.decision with input as fx.call(fx.viewer, fx.vm_stop, fx.prod_guest)
	d.allow == false
	d.approval.required == true
	count(d.deny) > 0
}

test_denied_even_with_approval if {
	d := pvegate.decision with input as fx.with_approval(fx.call(fx.viewer, fx.vm_stop, fx.prod_guest), ["alice"], ["sre-leads"])
	d.allow == false
}

test_low_risk_write_allowed if {
	d := pvegate.decision with input as fx.call(fx.agent, fx.vm_stop, fx.web_guest)
	d.allow == true
	d.risk.level == "low"
}

test_empty_data_denies_everything if {
	every inp in [
		fx.call(fx.viewer, fx.guest_config_tool, fx.prod_guest),
		fx.call(fx.admin, fx.vm_stop, fx.web_guest),
		fx.call_at(fx.breakglass, fx.guest_delete, fx.lab_guest, fx.sat_1000),
		fx.with_approval(prod_stop, ["alice"], ["sre-leads"]),
	] {
		d := pvegate.decision with input as inp with data.data as {}
		d.allow == false
		count(d.deny) > 0
	}
}

test_unknown_contract_version_denied if {
	d := pvegate.decision with input as object.union(prod_stop, {"contract_version": 2})
	d.allow == false
	fx.has_reason(d.deny, "unsupported contract_version 2; this policy knows {1}")
	d.risk.level == "critical"
}

test_missing_contract_version_denied if {
	d := pvegate.decision with input as json.remove(prod_stop, ["contract_version"])
	fx.has_reason(d.deny, "unsupported contract_version null")
}

test_no_input_denied if {
	d := pvegate.decision with input as []
	d.allow == false
	fx.has_reason(d.deny, "no input document")
}

test_malformed_call_denied if {
	bad := {
		"contract_version": 1, "kind": "list", "principal": {"sub": "", "kind": "robot"},
		"request": {"time": "yesterday"}, "tool": {"effect": "nuke", "scope": "galaxy"},
	}
	d := pvegate.decision with input as bad
	d.allow == false
	every frag in [
		"input kind must be \"call\"", "input.principal.sub", "input.principal.kind", "roles and .groups",
		"input.request.time", "input.tool.name", "input.tool.effect", "input.tool.scope", "input.target",
		"input.arguments_digest", "input.usage",
	] {
		fx.has_reason(d.deny, frag)
	}
}

# the arguments are part of the contract (decision_input.schema.json requires them):
# without them the rules that read them (critical calls by argument value, guarded
# tag removal, the address scope) could not hold, and a firewall turned off by an
# admin was allowed outright instead of waiting for two approvers
test_call_without_arguments_denied if {
	fw_off := object.union(
		fx.call(fx.admin, fx.tool("firewall_guest_options_set", "firewall", "write", "guest", []), fx.web_guest),
		{"arguments": {"vmid": 101, "enable": false}},
	)
	pvegate.decision.approval.required with input as fw_off
	every args in [null, "enable=0", []] {
		d := pvegate.decision with input as object.union(fw_off, {"arguments": args})
		d.allow == false
		fx.has_reason(d.deny, "input.arguments must be an object")
	}
	d := pvegate.decision with input as json.remove(fw_off, ["arguments"])
	d.allow == false
	some r in d.deny_reasons
	r.code == "input.invalid"
	fx.has_reason(d.deny, "input.arguments must be an object")
}

test_undecidable_input_falls_back_to_deny if {
	# non-numeric risk points make the score uncomputable
	d := pvegate.decision with input as prod_stop with data.data.risk.effect_points.write as "twenty"
	d.allow == false
	d.deny == ["the policy could not compute a decision for this input; denied by default"]
}

test_request_time_fallbacks if {
	inp := json.remove(prod_stop, ["request/time_ns", "request/weekday", "request/hour_utc"])
	d := pvegate.decision with input as inp
	d.approval.required == true
	not "off_hours" in {f.name | some f in d.risk.factors}
}

# The data is checked apart from the decision (data_check, once per revision);
# while it is invalid every call gets its refusal (checked_decision is what the
# gateway answers).
test_data_error_denies if {
	inp := fx.call(fx.viewer, fx.guest_config_tool, fx.prod_guest)
	bad := [{"name": "weekly", "window": "7d", "limit": 5}]
	c := pvegate.data_check with data.data.quotas as bad
	c.valid == false
	c.refusal.allow == false
	fx.has_reason(c.refusal.deny, "policy data error: quota weekly needs")
	d := pvegate.checked_decision with input as inp with data.data.quotas as bad
	d == c.refusal
}

test_valid_data_checks_clean if {
	c := pvegate.data_check
	c == {"valid": true, "problems": [], "refusal": null}
	inp := fx.call(fx.viewer, fx.guest_config_tool, fx.prod_guest)
	d := pvegate.checked_decision with input as inp
	d == pvegate.decision with input as inp
	d.allow == true
}

# A misspelled data key (protected_tag) must not leave a guest deletable after one
# approval, and hours given as strings must not print as %!d(string=00): the data
# errors deny every call, named by path, with the code data.invalid.
test_data_errors_deny_every_call_naming_the_path if {
	bad := object.union(data.data, {"guardrails": object.union(data.data.guardrails, {
		"protected_tag": ["crown-jewel"],
		"maintenance_windows": [{"name": "nights", "weekdays": ["Wed"], "from_hour": "00", "to_hour": "05"}],
	})})
	inp := fx.call_at(fx.admin, fx.guest_delete, fx.lab_guest, fx.sat_1000)
	d := pvegate.checked_decision with input as inp with data.data as bad
	d.allow == false
	d.risk.level == "critical"
	{r.code | some r in d.deny_reasons} == {"data.invalid"}
	some m in d.deny
	contains(m, "guardrails.protected_tag: unknown key")
	some n in d.deny
	contains(n, "guardrails.maintenance_windows.0.from_hour: Invalid type. Expected: integer, given: string")
	every r in d.deny {
		not contains(r, "%!")
	}

	# with the data fixed the same call only needs an approval (the denial is the data's doing)
	ok := pvegate.checked_decision with input as inp
	ok.deny == []
	ok.approval.required == true
}

test_window_text_shows_bad_hours_as_given if {
	pvegate.guardrails.window_text({"name": "w", "weekdays": ["Mon"], "from_hour": "00", "to_hour": 5}) == "w Mon 00:00-05:00"
}
