# METADATA
# title: Shared helpers
# description: Selector matching, time helpers and small utilities used by every policy package.
# schemas:
#   - input: schema["policy_input.schema"]
package pvegate.lib

effects := {"read", "write", "destroy", "exec"}

mutating_effects := {"write", "destroy", "exec"}

# Windows the usage counters are kept for, in seconds.
window_seconds := {"1m": 60, "1h": 3600, "24h": 86400}

level_rank := {"low": 0, "medium": 1, "high": 2, "critical": 3}

# --- selectors -------------------------------------------------------------
# A selector is an object whose keys are all optional; an absent key matches
# anything. See policies/data/data.yaml for the vocabulary.

# glob_any(patterns, s) is true when s matches one of the globs; `*` spans any
# characters (no delimiters).
glob_any(patterns, s) if {
	some p in patterns
	glob.match(p, null, s)
}

# in_list(sel, key, value): sel[key] is absent, or value is listed in it.
in_list(sel, key, _) if not key in object.keys(sel)

in_list(sel, key, value) if value in sel[key]

# any_in_list(sel, key, values): sel[key] is absent, or some value is listed.
any_in_list(sel, key, _) if not key in object.keys(sel)

any_in_list(sel, key, values) if {
	some v in values
	v in sel[key]
}

# compile(sel): the selector's tool-side keys as sets, "*" standing for an
# absent key (or a "*" listed in it). Compiled once per query, matched often.
compile(sel) := {
	"effects": key_set(sel, "effects"),
	"domains": key_set(sel, "domains"),
	"scopes": key_set(sel, "scopes"),
	"tool_tags": key_set(sel, "tool_tags"),
	"any_name": any_name(sel),
	"names": {n | some n in object.get(sel, "tools", []); not is_glob(n)},
	"patterns": [p | some p in object.get(sel, "tools", []); is_glob(p)],
}

# is_glob(s): s uses glob syntax (* ? [..] {..}) rather than naming one tool
is_glob(s) if regex.match(`[*?\[{]`, s)

default any_name(_) := false

any_name(sel) if not "tools" in object.keys(sel)

any_name(sel) if "*" in sel.tools

key_set(sel, key) := {v | some v in sel[key]} if key in object.keys(sel)

key_set(sel, key) := {"*"} if not key in object.keys(sel)

# compiled_matches(c, tool): the compiled selector c matches the tool. The
# cheap set tests come first; no backtracking until the name globs.
compiled_matches(c, tool) if {
	count({tool.effect, "*"} & c.effects) > 0
	count({tool.domain, "*"} & c.domains) > 0
	count({tool.scope, "*"} & c.scopes) > 0
	tags_hit(c.tool_tags, object.get(tool, "tags", []))
	name_hit(c, tool.name)
}

# (else chains: stop at the first definition that holds)
tags_hit(wanted, tags) if {
	"*" in wanted
} else if {
	some t in tags
	t in wanted
}

# name_hit(c, name): the compiled selector's tool names/globs admit the name
name_hit(c, name) if {
	c.any_name
} else if {
	name in c.names
} else if {
	glob_any(c.patterns, name)
}

# tool_matches(sel, tool) tests a selector's tool-side keys, with the same
# meaning as compiled_matches(compile(sel), tool). It reads the raw selector:
# matching one tool (a tools/call) is cheaper than compiling the selector first.
tool_matches(sel, tool) if {
	admits(sel, "effects", tool.effect)
	admits(sel, "domains", tool.domain)
	admits(sel, "scopes", tool.scope)
	tags_admit(sel, object.get(tool, "tags", []))
	name_admits(sel, tool.name)
}

# admits(sel, key, value): sel[key] lists the value or "*", or is absent
# (present but null or empty admits nothing, as in compile)
admits(sel, key, value) if {
	value in sel[key]
} else if {
	"*" in sel[key]
} else if {
	not key in object.keys(sel)
}

tags_admit(sel, tags) if {
	admits(sel, "tool_tags", "*")
} else if {
	some t in tags
	t in sel.tool_tags
}

# name_admits(sel, name): as name_hit on the compiled selector: names listed
# without glob syntax match exactly, the others as globs
name_admits(sel, name) if {
	admits(sel, "tools", "*")
} else if {
	name in sel.tools
	not is_glob(name)
} else if {
	some p in sel.tools
	is_glob(p)
	glob.match(p, null, name)
}

# --- selector indexes ----------------------------------------------------------
# A call is tested only against the selectors that can match it. The index of a
# selector list depends on data only: the managed sidecar loads the policy
# partially evaluated with its data (gateway/policy/optimized.py), which turns
# each index into a constant, so a decision looks its candidates up instead of
# testing every selector. (Evaluated from plain files, an index is built once
# per query.)
#
# An index files each selector under the effects and principal kinds it admits
# (admits_call_kind) and the tool names of index_names; a rule using it looks up
# the call's effect, kind and tool name, and the call's effect, kind and "*", in
# two clauses, in the rule bodies themselves: partially evaluated, each clause
# then tests the call's effect, kind and tool name against constants, OPA's rule
# index picks the clauses that hold: a call no selector is filed for meets none,
# and calls no function. index_hit tests the rest of a candidate.

principal_kinds := {"agent", "human", "service"}

# admits_call_kind(sel, effect, kind): sel's `effects` and `principal_kinds`
# admit the effect and the principal kind: what the indexes below are keyed by
# (every other key is still tested by call_matches on the candidates)
admits_call_kind(sel, effect, kind) if {
	admits(sel, "effects", effect)
	in_list(sel, "principal_kinds", kind)
}

# the call keys call_matches tests that the indexes do not settle
unsettled_keys := {"domains", "scopes", "tool_tags", "principal_groups", "principal_roles", "target_tags"}

default exact_selector(_) := false

exact_selector(sel) if {
	count(unsettled_keys & object.keys(sel)) == 0
	index_names(sel) == {"*"}
	not "tools" in object.keys(sel)
}

exact_selector(sel) if {
	count(unsettled_keys & object.keys(sel)) == 0
	names_only(sel)
}

# names_only(sel): sel.tools lists plain tool names only (no globs)
names_only(sel) if {
	is_array(sel.tools)
	every n in sel.tools {
		is_string(n)
		not is_glob(n)
	}
}

# index_names(sel): the tools sel names by plain name, or {"*"} when it names none
# so (no tools key, a glob): the tool-name keys of an index
index_names(sel) := {n | some n in sel.tools} if names_only(sel)

else := {"*"}

# index_hit(exact, sel): a candidate the index found for the call matches it;
# exact is exact_selector(sel) (data only, a constant once partially evaluated):
# its effects, principal kinds and tool names settle every key call_matches tests.
# For a selector that restricts (a deny rule, an approval rule, a quota): its
# target_tags hold where the target or a guest the call reaches carries one.
index_hit(exact, sel) if {
	exact == true
	call_parts_defined
} else if {
	reaching_call_matches(sel)
}

# index_hit_on_target(exact, sel): index_hit for a selector that permits (a secret
# revealed): its target_tags hold on the target's own tags only, never widened by
# another guest's
index_hit_on_target(exact, sel) if {
	exact == true
	call_parts_defined
} else if {
	call_matches(sel, input.principal, input.tool, input.target)
}

# reaching_call_matches(sel): call_matches on the call decided, a restricting
# selector's target_tags tested against the tags of the target and of every guest
# the call reaches besides it (reached_tags): a rule on `critical` guests holds on
# an HA rule, a pool move or a prune reaching one
reaching_call_matches(sel) if {
	tool_matches(sel, input.tool)
	principal_matches(sel, input.principal)
	any_in_list(sel, "target_tags", reached_tags)
}

# reached_tags: the tags of the call's target and of the guests it reaches besides it
reached_tags contains tag if {
	some tag in tags_of(input.target)
}

reached_tags contains tag if {
	some guest in beyond_target
	some tag in tags_of(guest)
}

# beyond_target: the guests a call reaches besides its target: a clone's or a
# migration's destination, a restore's backed-up guest, a volume's owner, the
# guests whose backups a prune deletes, the guests of a member list
beyond_target contains guest if {
	some k in ["destination", "backup_of", "volume_of"]
	guest := input.target[k]
	is_object(guest)
}

beyond_target contains guest if {
	some k in ["prune_removes", "members"]
	some guest in input.target[k].guests
}

# call_parts_defined: the call has every part call_matches reads (whatever their
# values), so an exact selector admitted by the indexes matches without testing it
default call_parts_defined := false

call_parts_defined if {
	_ = input.principal
	_ = input.tool.domain
	_ = input.tool.scope
	_ = input.tool.name
	_ = input.target
}

# call_matches(sel, principal, tool, target) also tests the principal (kind,
# token groups and roles) and the target's tags.
call_matches(sel, principal, tool, target) if {
	tool_matches(sel, tool)
	principal_matches(sel, principal)
	any_in_list(sel, "target_tags", tags_of(target))
}

# principal_matches(sel, principal): the selector's principal-side keys admit
# the principal: principal_kinds lists its kind, principal_groups one of its
# token groups, principal_roles one of its token role claims
principal_matches(sel, principal) if {
	in_list(sel, "principal_kinds", principal.kind)
	any_in_list(sel, "principal_groups", object.get(principal, "groups", []))
	any_in_list(sel, "principal_roles", object.get(principal, "roles", []))
}

# reason(code, rule, message): one reason of a decision. code is stable (a
# dashboard, an alert or a test keys on it; docs/policy-contract.md lists
# them), rule names the policy rule or data entry that produced it, message
# is the sentence for humans.
reason(code, rule, message) := {"code": code, "rule": rule, "message": message}

# tags_of(target) is the target's tag list, [] when it has none.
tags_of(target) := t if {
	t := target.tags
	is_array(t)
} else := []

# --- time ------------------------------------------------------------------

# now_ns: request time in ns since the epoch, from request.time_ns or request.time.
now_ns := input.request.time_ns if {
	is_number(input.request.time_ns)
} else := time.parse_rfc3339_ns(input.request.time)

# weekday ("Mon") and UTC hour of the request, as the gateway computed them
# (falling back to request time).
weekday := input.request.weekday if {
	is_string(input.request.weekday)
} else := substring(time.weekday(now_ns), 0, 3)

hour_utc := input.request.hour_utc if {
	is_number(input.request.hour_utc)
} else := time.clock(now_ns)[0]

# in_hours(from, to, h): from <= h < to, wrapping past midnight when from > to.
in_hours(from, to, h) if {
	from <= to
	h >= from
	h < to
}

in_hours(from, to, h) if {
	from > to
	h >= from
}

in_hours(from, to, h) if {
	from > to
	h < to
}

# in_window(w, day, h): window w ({weekdays, from_hour, to_hour}) contains the instant.
in_window(w, day, h) if {
	day in w.weekdays
	in_hours(w.from_hour, w.to_hour, h)
}
