package pvegate.config_test

import data.pvegate.config

test_safe_defaults_without_data if {
	config.roles == {} with data.data as {}
	config.bindings == [] with data.data as {}
	config.approver_groups == {} with data.data as {}
	config.protected_tags == ["protected"] with data.data as {}
	config.maintenance_windows == [] with data.data as {}
	config.agent_no_mutation_scopes == ["node"] with data.data as {}
	config.deny_rules == [] with data.data as {}
	config.risk == config.default_risk with data.data as {}
	config.approval == config.default_approval with data.data as {}
	config.default_max_items == 100 with data.data as {}
	config.redact == {} with data.data as {}
	config.quotas == [] with data.data as {}
}

test_wrong_types_fall_back_to_defaults if {
	bad := {
		"roles": [], "bindings": {}, "approver_groups": [], "quotas": {},
		"guardrails": {"protected_tags": "protected", "maintenance_windows": {}, "agent_no_mutation_scopes": "node", "deny_rules": {}},
		"risk": [], "approval": [], "obligations": {"default_max_items": "many", "redact": []},
	}
	config.roles == {} with data.data as bad
	config.bindings == [] with data.data as bad
	config.protected_tags == ["protected"] with data.data as bad
	config.maintenance_windows == [] with data.data as bad
	config.risk == config.default_risk with data.data as bad
	config.default_max_items == 100 with data.data as bad
	config.quotas == [] with data.data as bad
}

test_data_overrides_merge_with_defaults if {
	r := config.risk with data.data.risk as {"ha_points": 99}
	r.ha_points == 99
	r.effect_points.write == 20
}

test_data_problems if {
	bad := {
		"quotas": [{"name": "weekly", "window": "7d", "limit": 5}, {"window": "1m", "limit": 1}, {"name": "x", "window": "1m"}],
		"approval": {"required_from_level": "extreme"},
		"risk": {"level_thresholds": {"medium": "25"}},
	}
	p := config.problems with data.data as bad
	semantic := {
		"quota weekly needs a name, a window of 1m/1h/24h and a numeric limit",
		"quota (unnamed) needs a name, a window of 1m/1h/24h and a numeric limit",
		"quota x needs a name, a window of 1m/1h/24h and a numeric limit",
		"approval.required_from_level extreme is not a risk level",
		"risk.level_thresholds needs numeric medium, high and critical",
	}
	semantic == semantic & p

	# the schema names the same mistakes by path
	"quotas.0.window: quotas.0.window must be one of the following: \"1m\", \"1h\", \"24h\"" in p
	"risk.level_thresholds.medium: Invalid type. Expected: integer, given: string" in p
}

test_thresholds_that_do_not_rise_are_a_problem if {
	p := config.problems with data.data.risk.level_thresholds as {"medium": 10, "high": 80, "critical": 50}
	p == {"risk.level_thresholds must rise: medium 10 < high 80 < critical 50"}
	count(config.problems) == 0 with data.data.risk.level_thresholds as {"medium": 1, "high": 2, "critical": 3}
	flat := {"medium": 25, "high": 25, "critical": 75}
	p2 := config.problems with data.data.risk.level_thresholds as flat
	"risk.level_thresholds must rise: medium 25 < high 25 < critical 75" in p2
}

# a score is clamped to 0-100: a critical threshold above 100 is never reached, so no
# call would be critical by its score
test_critical_threshold_above_the_highest_score_is_a_problem if {
	p := config.problems with data.data.risk.level_thresholds as {"medium": 25, "high": 50, "critical": 101}
	p == {"risk.level_thresholds.critical 101 is above 100, the highest risk score: no score would ever be critical"}
	count(config.problems) == 0 with data.data.risk.level_thresholds as {"medium": 25, "high": 50, "critical": 100}
}

# the security engineer's findings: a misspelled key and hours given as strings
misspelled := object.union(data.data, {"guardrails": object.union(data.data.guardrails, {
	"protected_tag": ["crown-jewel"],
	"maintenance_windows": [{"name": "weeknights", "weekdays": ["Mon"], "from_hour": "22", "to_hour": "05"}],
})})

test_unknown_key_and_string_hours_are_problems_naming_the_path if {
	p := config.problems with data.data as misspelled
	p == {
		"guardrails.protected_tag: unknown key (not in the data schema; misspelled?)",
		"guardrails.maintenance_windows.0.from_hour: Invalid type. Expected: integer, given: string",
		"guardrails.maintenance_windows.0.to_hour: Invalid type. Expected: integer, given: string",
	}
}

test_unknown_top_level_key_and_role_key if {
	p := config.problems with data.data as object.union(data.data, {"quota": [], "roles": {"viewer": {"alow": []}}})
	"quota: unknown key (not in the data schema; misspelled?)" in p
	"roles.viewer.alow: unknown key (not in the data schema; misspelled?)" in p
}

# a guest's tags reach the policy lower-cased (Proxmox compares them without case): a tag
# written with a capital in the data would match no guest, and a guard rail on it none
test_guest_tags_with_capitals_are_problems if {
	count(config.problems) == 0 with data.data.guardrails.protected_tags as ["protected", "do-not-touch"]
	p := config.problems with data.data.guardrails.protected_tags as ["Protected"]
	p == {`guardrails.protected_tags.0: Does not match pattern '^[^A-Z]+$'`}
	q := config.problems with data.data.risk.target_tag_points as {"Prod": 10}
	`risk.target_tag_points: Property name of "Prod" does not match` in q
}

test_binding_to_an_undefined_role_is_a_problem if {
	bindings := array.concat(data.data.bindings, [{"name": "typo", "role": "operater", "groups": ["x"]}])
	p := config.problems with data.data.bindings as bindings
	p == {"bindings: binding typo names role operater, which roles does not define"}
}

# a resource quota selects calls by the roles granting them: a misspelt role grants nothing, so
# the quota would silently cap nothing
test_resource_quota_naming_an_undefined_role_is_a_problem if {
	quotas := array.concat(data.data.resource_quotas, [{"name": "typo", "roles": ["provisioner", "provisoner"]}])
	p := config.problems with data.data.resource_quotas as quotas
	i := count(data.data.resource_quotas)
	p == {sprintf("resource_quotas.%d: resource quota typo names role provisoner, which roles does not define", [i])}
	count(config.problems) == 0 with data.data.resource_quotas as [{"name": "ok", "roles": ["provisioner"]}]
}

# rbac matches a vmid range as from <= vmid <= to: a reversed one would match no guest
test_reversed_vmid_range_is_a_problem if {
	scoped := {"name": "ops-range", "role": "operator", "groups": ["x"], "scope": {"vmids": [
		{"from": 100, "to": 199},
		{"from": 999, "to": 100},
	]}}
	bindings := array.concat(data.data.bindings, [scoped])
	p := config.problems with data.data.bindings as bindings
	i := count(data.data.bindings)
	p == {sprintf(
		"bindings.%d.scope.vmids.1: binding ops-range has the range from 999 to 100, %s",
		[i, "which is reversed (from > to) and matches no guest"],
	)}
}

test_vmid_range_of_one_guest_is_no_problem if {
	one := {"name": "one", "role": "operator", "groups": ["x"], "scope": {"vmids": [{"from": 150, "to": 150}]}}
	count(config.problems) == 0 with data.data.bindings as array.concat(data.data.bindings, [one])
}

test_no_data_is_no_schema_problem if {
	# no data at all denies every call anyway (no role is bound); it is not a data error
	count(config.problems) == 0 with data.data as {}
}

test_demo_data_has_no_problems if {
	count(config.problems) == 0
}
