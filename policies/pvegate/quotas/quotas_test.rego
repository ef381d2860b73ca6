package pvegate.quotas_test

import data.pvegate.fixtures_test as fx
import data.pvegate.quotas

with_usage(inp, usage) := object.union(inp, {"usage": usage})

destroy_call := fx.call_at(fx.admin, fx.guest_delete, fx.lab_guest, fx.sat_1000)

test_under_quota if {
	count(quotas.deny) == 0 with input as destroy_call
	quotas.result == null with input as destroy_call
}

test_destroy_quota_exceeded if {
	inp := with_usage(destroy_call, {"tool": {"1h": 3}})
	want := "quota \"destroy-per-hour\" exceeded: 3 calls to \"guest_delete\" in the last 1h (limit 3)"
	fx.has_reason(quotas.deny, want) with input as inp

	# Sat 10:00:00 is the start of an hour: the fixed window resets in a full hour
	quotas.result == {"name": "destroy-per-hour", "limit": 3, "window": "1h", "resets_in_seconds": 3600} with input as inp
}

test_reset_time_mid_window if {
	inp := with_usage(fx.call(fx.agent, fx.vm_stop, fx.prod_guest), {"tool": {"1m": 10}})

	# 15:40:00 -> the minute window resets in 60 s; the day window in 8h20m
	quotas.result.resets_in_seconds == 60 with input as inp
	inp2 := with_usage(fx.call(fx.agent, fx.vm_stop, fx.prod_guest), {"all": {"24h": 5000}})
	quotas.result.resets_in_seconds == 30000 with input as inp2
}

test_all_counter if {
	inp := with_usage(fx.call(fx.viewer, fx.guest_config_tool, fx.prod_guest), {"all": {"1m": 120}})
	fx.has_reason(quotas.deny, "quota \"calls-per-minute\" exceeded: 120 calls to any tool in the last 1m") with input as inp
}

test_the_quota_resetting_last_is_reported if {
	inp := with_usage(fx.call(fx.agent, fx.vm_stop, fx.prod_guest), {"tool": {"1m": 10}, "all": {"1m": 200, "24h": 6000}})
	count(quotas.deny) == 3 with input as inp
	quotas.result.name == "agent-calls-per-day" with input as inp
}

test_missing_counter_fails_closed if {
	inp := json.remove(destroy_call, ["usage/tool/1h"])
	fx.has_reason(quotas.deny, "quota \"destroy-per-hour\" exceeded") with input as inp
}

test_quota_kind_filter if {
	# the agent write quota does not apply to humans
	inp := with_usage(fx.call(fx.admin, fx.vm_stop, fx.prod_guest), {"tool": {"1m": 50}})
	count(quotas.deny) == 0 with input as inp
}

# a quota naming tools is filed under their names: it counts calls to those tools only
test_quota_naming_a_tool if {
	named := [{"name": "stops-per-minute", "tools": ["vm_stop"], "counter": "tool", "window": "1m", "limit": 2}]
	stop := with_usage(fx.call(fx.agent, fx.vm_stop, fx.prod_guest), {"tool": {"1m": 2}})
	quotas.result.name == "stops-per-minute" with input as stop with data.data.quotas as named
	start := with_usage(fx.call(fx.agent, fx.lxc_start, fx.prod_guest), {"tool": {"1m": 2}})
	quotas.result == null with input as start with data.data.quotas as named
}

# states (pvegate policy explain) lists every matching quota, exceeded or not
test_states_list_the_matching_quotas if {
	inp := with_usage(fx.call(fx.viewer, fx.guest_config_tool, fx.prod_guest), {"all": {"1m": 7}})
	{[s.quota.name, s.used, s.resets_in_seconds] | some s in quotas.states} == {["calls-per-minute", 7, 60]} with input as inp
	names := {s.quota.name | some s in quotas.states} with input as fx.call(fx.agent, fx.vm_stop, fx.prod_guest)
	names == {"agent-writes-per-minute", "calls-per-minute", "agent-calls-per-day"}
}

# a quota with keys the index does not settle (a domain, target tags) is tested with
# lib.call_matches, filed under the tools it names or under "*"
test_quota_beyond_the_index if {
	qs := [
		{"name": "guest-writes", "domains": ["guest"], "effects": ["write"], "counter": "tool", "window": "1m", "limit": 2},
		{"name": "prod-stops", "tools": ["vm_stop"], "target_tags": ["prod"], "counter": "tool", "window": "1h", "limit": 2},
	]
	used_up := {"tool": {"1m": 2, "1h": 2}}
	prod := with_usage(fx.call(fx.agent, fx.vm_stop, fx.prod_guest), used_up)
	{s.quota.name | some s in quotas.exceeded} == {"guest-writes", "prod-stops"} with input as prod with data.data.quotas as qs
	{s.quota.name | some s in quotas.states} == {"guest-writes", "prod-stops"} with input as prod with data.data.quotas as qs
	lab := with_usage(fx.call(fx.agent, fx.vm_stop, fx.lab_guest), used_up)
	{s.quota.name | some s in quotas.exceeded} == {"guest-writes"} with input as lab with data.data.quotas as qs
	read := with_usage(fx.call(fx.agent, fx.guest_config_tool, fx.prod_guest), used_up)
	count(quotas.exceeded) == 0 with input as read with data.data.quotas as qs
}

# exceeded (what a decision reads) is states (what `pvegate policy explain` shows) used up,
# whichever way the index files a quota, and for a call missing a part call_matches reads
test_exceeded_is_states_used_up if {
	qs := array.concat(data.data.quotas, [
		{"name": "named", "tools": ["vm_stop", "get_guest_config"], "counter": "all", "window": "1m", "limit": 3},
		{"name": "tagged", "target_tags": ["prod"], "counter": "tool", "window": "24h", "limit": 0},
	])
	no_domain := json.remove(fx.call(fx.agent, fx.vm_stop, fx.prod_guest), ["tool/domain"])
	every inp in [
		with_usage(fx.call(fx.agent, fx.vm_stop, fx.prod_guest), {"tool": {"1m": 10, "1h": 1}, "all": {"1m": 3}}),
		with_usage(fx.call(fx.viewer, fx.guest_config_tool, fx.lab_guest), {"all": {"1m": 200}}),
		with_usage(no_domain, {"tool": {"1m": 10}, "all": {"1m": 3}}),
		fx.call(fx.admin, fx.guest_delete, fx.prod_guest),
	] {
		states := {s | some s in quotas.states} with input as inp with data.data.quotas as qs
		exceeded := {s | some s in quotas.exceeded} with input as inp with data.data.quotas as qs
		exceeded == {s | some s in states; s.used >= s.quota.limit}
	}
}
