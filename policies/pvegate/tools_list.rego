# pvegate tools/list.
#
# Entry point data.pvegate.visible_tools: the names of the tools a principal
# may see. A tool is visible when some role bound to the principal grants
# it on some target (binding scopes are not applied: no target is known
# yet), no role bound to the principal without a scope denies it (deny
# overrides allow across roles), and no target-independent guard rail forbids
# it to the principal.
package pvegate

import data.pvegate.config
import data.pvegate.guardrails
import data.pvegate.lib
import data.pvegate.rbac

listing_problems contains msg if some msg in input_problems

listing_problems contains msg if {
	is_object(input)
	object.get(input, "kind", null) != "list"
	msg := sprintf("input kind must be \"list\" for this entry point, got %v", [object.get(input, "kind", null)])
}

listing_problems contains "input.tools must be an array" if tools_ok == false

# (a default and `== false`, not `not tools_ok`: see input_problems)
default tools_ok := false

tools_ok if is_array(input.tools)

# METADATA
# title: Visible tools for tools/list
# description: Set of tool names (a JSON array over the REST API).
# entrypoint: true
# schemas:
#   - input: schema["list_input.schema"]
visible_tools contains name if {
	count(listing_problems) == 0
	some i in listed
	name := input.tools[i].name
}

# The listing works on sets of positions in input.tools rather than tool by
# tool, so that OPA does most of the work with native set operations: a
# selector meets the tools its effects, domains and scopes admit as one set
# (unions and intersections of the per-value indexes below), and only a
# selector that names tools or tags tests the tools of that set one by one.
# Its answer is, for every tool, that of rbac.tool_visible,
# rbac.blanket_denied and guardrails.hidden_from_list, for a composite tool
# for each of its leaves too (the tests compare them).

# listed: the positions of the tools some role of the lister grants and does
# not deny, that no role bound without a scope denies (rbac.blanket_roles), that
# no guard rail hides, and (a composite) none of whose leaves is hidden
# regal ignore:prefer-set-or-object-rule
listed := listable - leaf_hidden

# listable: the positions of the tools the listing lists as tools of their own
# regal ignore:prefer-set-or-object-rule
listable := ((granted - blanket_denied) - agent_hidden) - deny_rule_hidden

# leaf_hidden: the composite tools (input.tools[i].uses) a leaf of which the
# listing would hide: the decision denies a composite wherever a leaf is not
# granted or is denied (rbac composite.rego), so such a one is denied on every
# target. Only the composites' leaves are tested, tool by tool: a handful.
# regal ignore:prefer-set-or-object-rule
leaf_hidden := {i |
	some i, t in input.tools
	some leaf in t.uses
	not leaf_listed(leaf)
} | {i |
	some i, t in input.tools
	some leaf in t.uses
	rbac.fans_out(t, leaf) # called beyond any one target: rbac composite.rego
	not rbac.fan_out_listable(leaf)
}

# leaf_listed(leaf): the leaf is listable as a tool of its own (the same view at
# a position in listable: what leaf_listable would answer, from the sets above,
# without testing it tool by tool), or, a leaf the input does not list as it
# is, leaf_listable says so
leaf_listed(leaf) if {
	leaf in listable_views
} else if {
	leaf_listable(leaf)
}

# regal ignore:prefer-set-or-object-rule
listable_views := {input.tools[i] | some i in listable}

# leaf_listable(leaf): the listing's tests for one tool (rbac.tool_visible,
# rbac.blanket_denied, guardrails.hidden_from_list)
leaf_listable(leaf) if {
	rbac.tool_visible(leaf)
	not rbac.blanket_denied(leaf)
	not guardrails.hidden_from_list(leaf)
}

# granted: some role of the lister allows the tool and does not deny it
# regal ignore:prefer-set-or-object-rule
granted := union({role_grants |
	some role in rbac.lister_roles
	allowed := union({s | some id, s in allow_hits; id[0] == role})
	denied := union({s | some id, s in deny_hits; id[0] == role})
	role_grants := allowed - denied
})

# allow_hits: the lister's allow selector id -> positions of the tools it matches
# regal ignore:prefer-set-or-object-rule
allow_hits := {id: hits(c, admitted(c)) |
	some id, c in rbac.lister_selectors
	id[1] == "allow"
}

# deny_hits: deny selector id -> the tools it matches among those some role
# allows (only those can be listed, so only those are tested by name and tag)
# regal ignore:prefer-set-or-object-rule
deny_hits := {id: hits(c, allowed_any & admitted(c)) |
	some id, c in rbac.lister_selectors
	id[1] == "deny"
}

# regal ignore:prefer-set-or-object-rule
allowed_any := union({s | some s in allow_hits})

# blanket_denied: the tools a role bound without a scope denies
# regal ignore:prefer-set-or-object-rule
blanket_denied := union({s |
	some id, s in deny_hits
	id[0] in rbac.blanket_roles
})

# agent_hidden: for an agent, the mutations of agent_no_mutation_scopes resources
default agent_hidden := set()

agent_hidden := effects & scopes if {
	input.principal.kind == "agent"
	effects := union({tools | some e in lib.mutating_effects; tools := tools_by_effect[e]})
	scopes := union({tools | some s in config.agent_no_mutation_scopes; tools := tools_by_scope[s]})
}

# deny_rule_hidden: the granted tools a target-independent deny rule of the
# lister matches
# regal ignore:prefer-set-or-object-rule
deny_rule_hidden := union({hits(c, granted & admitted(c)) | some c in guardrails.lister_deny_rules})

# admitted(c): positions of the tools whose effect, domain and scope the
# compiled selector c admits
admitted(c) := (along(c.effects, tools_by_effect) & along(c.domains, tools_by_domain)) & along(c.scopes, tools_by_scope)

# along(values, index): positions of the tools with one of the values ("*": any)
along(values, index) := tool_positions if {
	"*" in values
} else := union({tools | some v in values; tools := index[v]})

# hits(c, positions): those of the positions whose tool's tags and name the
# compiled selector c admits (lib.compiled_matches' tag and name tests). Written
# out as comprehensions, not as a call per tool: a function call per tool costs
# several times the tests themselves. (A selector naming neither tags nor names
# returns positions at once: tagged and named each return their input then.)
hits(c, positions) := named(c, tagged(c, positions))

# tagged(c, positions): those whose tool carries a tag c names ("*": all)
tagged(c, positions) := positions if {
	"*" in c.tool_tags
} else := {i |
	some i in positions
	some tag in object.get(input.tools[i], "tags", [])
	tag in c.tool_tags
}

# named(c, positions): those whose tool c names, by name or by glob
named(c, positions) := positions if {
	c.any_name
} else := by_name(c.names, positions) | by_glob(c.patterns, positions)

# by_name(names, positions), by_glob(patterns, positions): those whose tool's
# name is one of names, matches one of the globs
by_name(names, positions) := {i |
	count(names) > 0
	some i in positions
	input.tools[i].name in names
}

by_glob(patterns, positions) := {i |
	count(patterns) > 0
	some i in positions
	some p in patterns
	glob.match(p, null, input.tools[i].name)
}

# tool_positions: the positions of the tools that have an effect, a domain and
# a scope (a tool without one is never listed)
# regal ignore:prefer-set-or-object-rule
tool_positions := {i |
	some i, t in input.tools
	_ = t.effect
	_ = t.domain
	_ = t.scope
}

# tools_by_effect, tools_by_domain, tools_by_scope: value -> the positions of
# the tools with it, for the values the listing's selectors name. The inner
# comprehension closes over v alone, so OPA computes it in one pass over the
# tools, indexed by v (comprehension indexing), and then looks each value up.
# regal ignore:prefer-set-or-object-rule
tools_by_effect := {v: {i | some i, t in input.tools; t.effect == v} | some v in index_values("effects")}

# regal ignore:prefer-set-or-object-rule
tools_by_domain := {v: {i | some i, t in input.tools; t.domain == v} | some v in index_values("domains")}

# regal ignore:prefer-set-or-object-rule
tools_by_scope := {v: {i | some i, t in input.tools; t.scope == v} | some v in index_values("scopes")}

# index_values(key): the values of key the listing's selectors (the lister's
# roles and deny rules) name, and those the agent guard rail needs
index_values(key) := {v |
	some c in listing_selectors
	some v in c[key]
	v != "*"
} | agent_values[key]

# regal ignore:prefer-set-or-object-rule
listing_selectors := {c | some c in rbac.lister_selectors} | guardrails.lister_deny_rules

default agent_values := {"effects": set(), "domains": set(), "scopes": set()}

agent_values := {
	"effects": lib.mutating_effects,
	"domains": set(),
	"scopes": {s | some s in config.agent_no_mutation_scopes},
} if {
	input.principal.kind == "agent"
}
