# METADATA
# title: Quotas
# description: |
#   Per-principal call quotas from the usage counters in the input. A quota
#   (data.data.quotas) selects calls like any selector and counts either this
#   principal's calls to this tool (counter "tool") or to any tool (counter
#   "all") in a window of 1m, 1h or 24h. The counters hold the calls already
#   made in the window, not the current one: a quota denies when
#   used >= limit.
#
#   resets_in_seconds is an approximation: the counters are kept by the
#   gateway, so the policy assumes fixed windows aligned to the UTC epoch
#   (minute, hour, day boundaries) and reports the seconds left until the
#   current one ends.
# schemas:
#   - input: schema["decision_input.schema"]
package pvegate.quotas

import data.pvegate.config
import data.pvegate.lib

# the quotas by the effects, principal kinds and tool names they can match
# (lib.index_names), each with lib.exact_selector (a constant once the policy is
# partially evaluated with its data: the optimised rules below then hold the
# quotas themselves as constants, without reading config.quotas)
index[effect][kind][name] contains [q, lib.exact_selector(q)] if {
	some q in config.quotas
	some effect in lib.effects
	some kind in lib.principal_kinds
	lib.admits_call_kind(q, effect, kind)
	some name in lib.index_names(q)
}

# matching: the quotas filed under the call's effect, principal kind and tool name,
# or "*", that match it (the lookups in the rule bodies: partially evaluated, each
# clause tests the call's effect, kind and name, and OPA's rule index picks the
# few that hold)
matching contains q if {
	some [q, exact] in index[input.tool.effect][input.principal.kind][input.tool.name]
	lib.index_hit(exact, q)
}

matching contains q if {
	some [q, exact] in index[input.tool.effect][input.principal.kind]["*"]
	lib.index_hit(exact, q)
}

# matching quotas and their state (`pvegate policy explain`; the decision reads exceeded only)
states contains state if {
	some q in matching
	counter := object.get(q, "counter", "tool")
	state := {
		"quota": q,
		"counter": counter,
		"used": used(counter, q.window),
		"resets_in_seconds": resets_in_seconds(q.window),
	}
}

# used(counter, window): the count from input.usage; a missing counter counts
# as exhausted (fail closed) so a gateway that forgets usage cannot bypass quotas.
used(counter, window) := n if {
	n := input.usage[counter][window]
	is_number(n)
} else := 9223372036854775807

# resets_in_seconds(window): seconds until the current fixed window ends.
resets_in_seconds(window) := w - (floor(lib.now_ns / 1000000000) % w) if {
	w := lib.window_seconds[window]
}

# the states of the matching quotas used up; the same as states filtered by used >= limit,
# written apart so a decision computes resets_in_seconds only for the quotas it reports.
# The quotas are looked up in the index itself, as matching does, in a clause for the
# exact ones (lib.index_hit's first branch: the call has the parts call_matches reads) and
# one for the others: partially evaluated, each clause holds its quota as a constant and
# an exact one is tested without a function call.
exceeded contains {"quota": q, "counter": counter, "used": n, "resets_in_seconds": resets_in_seconds(q.window)} if {
	lib.call_parts_defined
	some [q, true] in index[input.tool.effect][input.principal.kind][input.tool.name]
	counter := object.get(q, "counter", "tool")
	n := used(counter, q.window)
	n >= q.limit
}

exceeded contains {"quota": q, "counter": counter, "used": n, "resets_in_seconds": resets_in_seconds(q.window)} if {
	some [q, false] in index[input.tool.effect][input.principal.kind][input.tool.name]
	lib.reaching_call_matches(q)
	counter := object.get(q, "counter", "tool")
	n := used(counter, q.window)
	n >= q.limit
}

exceeded contains {"quota": q, "counter": counter, "used": n, "resets_in_seconds": resets_in_seconds(q.window)} if {
	lib.call_parts_defined
	some [q, true] in index[input.tool.effect][input.principal.kind]["*"]
	counter := object.get(q, "counter", "tool")
	n := used(counter, q.window)
	n >= q.limit
}

exceeded contains {"quota": q, "counter": counter, "used": n, "resets_in_seconds": resets_in_seconds(q.window)} if {
	some [q, false] in index[input.tool.effect][input.principal.kind]["*"]
	lib.reaching_call_matches(q)
	counter := object.get(q, "counter", "tool")
	n := used(counter, q.window)
	n >= q.limit
}

# deny: the sentences of the denials below
deny contains r.message if some r in denials

denials contains lib.reason("quota.exceeded", sprintf("data.quotas[%s]", [state.quota.name]), msg) if {
	some state in exceeded
	msg := sprintf(
		"quota %q exceeded: %s in the last %s (limit %d); it resets in about %d s",
		[state.quota.name, usage_text(state), state.quota.window, state.quota.limit, state.resets_in_seconds],
	)
}

usage_text(state) := sprintf("%d calls to %q", [state.used, input.tool.name]) if state.counter == "tool"

usage_text(state) := sprintf("%d calls to any tool", [state.used]) if state.counter != "tool"

# the exceeded quota reported in the decision: the one that resets last
# (ties broken by name), because retrying is pointless before then.
default result := null

result := q if {
	count(exceeded) > 0
	ordered := sort([[s.resets_in_seconds, s.quota.name] | some s in exceeded])
	last := ordered[count(ordered) - 1]
	some s in exceeded
	s.quota.name == last[1]
	q := {
		"name": s.quota.name,
		"limit": s.quota.limit,
		"window": s.quota.window,
		"resets_in_seconds": s.resets_in_seconds,
	}
}
