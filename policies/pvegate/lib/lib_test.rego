package pvegate.lib_test

import data.pvegate.fixtures_test as fx
import data.pvegate.lib

test_glob_any if {
	lib.glob_any(["vm_*", "lxc_*"], "lxc_start")
	lib.glob_any(["*snapshot_delete"], "vm_snapshot_delete")
	not lib.glob_any(["vm_*"], "guest_delete")
	not lib.glob_any([], "vm_stop")
}

test_tool_matches if {
	lib.tool_matches({}, fx.vm_stop)
	lib.tool_matches({"tools": ["vm_*"], "effects": ["write"], "domains": ["guest"], "scopes": ["guest"]}, fx.vm_stop)
	lib.tool_matches({"tool_tags": ["power", "x"]}, fx.vm_stop)
	not lib.tool_matches({"tool_tags": ["x"]}, fx.vm_stop)
	not lib.tool_matches({"effects": ["read"]}, fx.vm_stop)
	not lib.tool_matches({"tools": []}, fx.vm_stop)
}

# tool_matches reads raw selectors; compiled_matches (tools/list) compiled ones:
# both must mean the same
test_tool_matches_agrees_with_compiled if {
	selectors := [
		{}, {"effects": ["*"]}, {"effects": null}, {"effects": []}, {"tools": ["*"]}, {"tools": ["vm_stop"]},
		{"tools": ["vm_?top", "x"]}, {"tools": ["{vm,lxc}_st*"]}, {"tool_tags": ["*"]}, {"tool_tags": ["x", "power"]},
		{"tool_tags": []}, {"domains": ["guest"], "scopes": ["node", "*"]}, {"scopes": ["node"]},
	]
	every sel in selectors {
		every t in [fx.vm_stop, fx.lxc_start, fx.nodes_tool, fx.guest_delete] {
			raw_match(sel, t) == compiled_match(sel, t)
		}
	}
}

default raw_match(_, _) := false

raw_match(sel, t) if lib.tool_matches(sel, t)

default compiled_match(_, _) := false

compiled_match(sel, t) if lib.compiled_matches(lib.compile(sel), t)

test_call_matches if {
	lib.call_matches({"principal_kinds": ["agent"], "target_tags": ["prod"]}, fx.agent, fx.vm_stop, fx.prod_guest)
	not lib.call_matches({"principal_kinds": ["human"]}, fx.agent, fx.vm_stop, fx.prod_guest)
	not lib.call_matches({"target_tags": ["prod"]}, fx.agent, fx.vm_stop, fx.unknown_target)
	not lib.call_matches({"target_tags": ["prod"]}, fx.agent, fx.vm_stop, {"known": false})
}

test_in_hours if {
	lib.in_hours(8, 18, 8)
	not lib.in_hours(8, 18, 18)
	lib.in_hours(22, 5, 23)
	lib.in_hours(22, 5, 0)
	not lib.in_hours(22, 5, 5)
	not lib.in_hours(22, 5, 12)
}

# from_hour inclusive, to_hour exclusive: from_hour == to_hour holds no hour at all (an empty
# window, not a whole day: a whole day is 0 to 24), whatever the hour
test_in_hours_with_equal_bounds_is_empty if {
	every h in numbers.range(0, 24) {
		not lib.in_hours(3, 3, h)
		not lib.in_hours(0, 0, h)
	}
	every h in numbers.range(0, 23) {
		lib.in_hours(0, 24, h)
	}
}

test_time_from_input if {
	lib.now_ns == 1795621200000000000 with input as fx.call(fx.agent, fx.vm_stop, fx.prod_guest)
	lib.weekday == "Wed" with input as fx.call(fx.agent, fx.vm_stop, fx.prod_guest)
	lib.hour_utc == 15 with input as fx.call(fx.agent, fx.vm_stop, fx.prod_guest)
}

test_time_computed_from_rfc3339 if {
	inp := {"request": {"time": "2026-11-29T15:40:00Z"}}
	lib.now_ns == 1795966800000000000 with input as inp
	lib.weekday == "Sun" with input as inp
	lib.hour_utc == 15 with input as inp
}

test_compiled_names_and_globs if {
	c := lib.compile({"tools": ["vm_stop", "lxc_?tart", "snap*", "{a,b}_x"]})
	c.names == {"vm_stop"}
	c.any_name == false
	lib.name_hit(c, "vm_stop")
	lib.name_hit(c, "lxc_start")
	lib.name_hit(c, "snapshot_delete")
	lib.name_hit(c, "b_x")
	not lib.name_hit(c, "vm_start")
	lib.compile({"tools": ["x", "*"]}).any_name
	lib.compile({}).any_name
}

test_absent_and_null_keys_differ if {
	lib.in_list({}, "principal_kinds", "agent")
	not lib.in_list({"principal_kinds": null}, "principal_kinds", "agent")
	lib.admits({}, "effects", "read")
	not lib.admits({"effects": null}, "effects", "read")
}

# --- call indexes: an index built with call_keys and looked up as the policy's
# rules do (the call's keys and "*", then index_hit) selects exactly the
# selectors call_matches admits ---

index_sels := [
	{"name": "exact-any", "effects": ["read"]},
	{"name": "exact-named", "tools": ["get_guest_config", "vm_stop"], "principal_kinds": ["human"]},
	{"name": "named-other", "tools": ["sdn_apply"]},
	{"name": "glob", "tools": ["get_*"]},
	{"name": "star", "tools": ["*"], "domains": ["guest"]},
	{"name": "checked", "principal_groups": ["contractors"], "tools": ["get_guest_config"]},
	{"name": "no-tools", "tools": []},
	{"name": "target-tags", "target_tags": ["prod"], "effects": ["read", "write"]},
]

sel_index[effect][kind][name] contains i if {
	some i, sel in index_sels
	some effect in lib.effects
	some kind in lib.principal_kinds
	lib.admits_call_kind(sel, effect, kind)
	some name in lib.index_names(sel)
}

sel_exact[i] := lib.exact_selector(sel) if some i, sel in index_sels

by_index contains i if {
	some i in sel_index[input.tool.effect][input.principal.kind][input.tool.name]
	lib.index_hit(sel_exact[i], index_sels[i])
}

by_index contains i if {
	some i in sel_index[input.tool.effect][input.principal.kind]["*"]
	lib.index_hit(sel_exact[i], index_sels[i])
}

by_call_matches contains i if {
	some i, sel in index_sels
	lib.call_matches(sel, input.principal, input.tool, input.target)
}

index_call(name, domain) := {
	"principal": {"sub": "u", "kind": "human", "groups": [], "roles": []},
	"tool": {"name": name, "effect": "read", "domain": domain, "scope": "guest", "tags": []},
	"target": {"tags": ["prod"]},
}

test_index_agrees_with_call_matches if {
	every name in ["get_guest_config", "vm_stop", "get_*", "sdn_apply", "other", "*"] {
		every effect in ["read", "write"] {
			every kind in ["human", "agent"] {
				inp := json.patch(index_call(name, "guest"), [
					{"op": "replace", "path": "/tool/effect", "value": effect},
					{"op": "replace", "path": "/principal/kind", "value": kind},
				])
				by_index == by_call_matches with input as inp
			}
		}
	}
}

test_index_finds_named_and_any_selectors if {
	by_index == {0, 1, 3, 4, 7} with input as index_call("get_guest_config", "guest")
	by_index == {0, 2, 4, 7} with input as index_call("sdn_apply", "guest")
}

test_exact_selectors_still_need_the_call_parts if {
	# no tool domain: call_matches admits nothing, and neither does the index
	inp := json.remove(index_call("get_guest_config", "guest"), ["tool/domain"])
	count(by_call_matches) == 0 with input as inp
	count(by_index) == 0 with input as inp
}

test_index_keys if {
	object.keys(sel_index) == lib.effects
	sel_index.read.human.get_guest_config == {1, 5}
	sel_index.read.agent.get_guest_config == {5}
	[i | some i, sel in index_sels; lib.exact_selector(sel)] == [0, 1, 2, 6]
	every kind in lib.principal_kinds {
		sel_index.read[kind]["*"] == {0, 3, 4, 7}
		sel_index.write[kind]["*"] == {3, 4, 7}
		sel_index.read[kind].sdn_apply == {2}
	}
}
