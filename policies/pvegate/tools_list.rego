# pvegate tools/list.
#
# Entry point data.pvegate.visible_tools: the names of the tools a principal
# may see. A tool is visible when some role bound to the principal grants
# it on some target (binding scopes are not applied: no target is known
# yet), no role bound to the principal without a scope denies it (deny
# overrides allow across roles), and no target-independent guard rail forbids
# it to the principal.
package pvegate

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
	some shape, m in name_rules
	some name in ({input.tools[i].name | some i in shape_tools[shape]} - m.names)
	not lib.glob_any(m.patterns, name)
}

visible_tools contains tool.name if {
	count(listing_problems) == 0
	some shape in checked
	some i in shape_tools[shape]
	tool := input.tools[i]
	rbac.tool_visible(tool, shape)
	not guardrails.hidden_from_list(tool, shape)
	not rbac.blanket_denied(tool, shape)
}

# shape_tools: shape -> the positions in input.tools of its tools. The tools
# are taken shape by shape: a name-rule shape's by set operations on their
# names, only a "check" shape's one by one. The inner comprehension closes
# over scalars (e, d, s), so OPA evaluates it once per query, indexed by them
# (comprehension indexing): one pass over the tools, then a lookup per shape.
# regal ignore:prefer-set-or-object-rule
shape_tools := {shape: positions |
	some shape in rbac.listed_shapes
	e := shape[0]
	d := shape[1]
	s := shape[2]
	positions := {i | some i, t in input.tools; t.effect == e; t.domain == d; t.scope == s}
}

# The listing decides per (effect, domain, scope) shape of the listed tools,
# once per query, so that most tools cost a lookup and a name test instead of
# a walk through every selector. shape_verdicts: shape -> one of
#   "hide":  no tool of the shape is listed;
#   "check": the full per-tool test (rbac.tool_visible, guard rails) decides;
#   {"names", "patterns"}: a tool is listed unless one of these names or
#     globs names it (both empty: every tool of the shape is listed).
# Each verdict agrees with the full per-tool test for every tool of its shape.
# regal ignore:prefer-set-or-object-rule
shape_verdicts := {shape: verdict(shape) | some shape in rbac.listed_shapes}

verdict(shape) := "hide" if {
	guardrails.hides_shape_in_list(shape)
} else := "check" if {
	guardrails.shape_needs_tool_check(shape)
} else := "check" if {
	rbac.blanket_needs_tool_check(shape)
} else := rbac.with_blanket_denies(rbac.listing_verdict(shape), shape)

# name_rules: shape -> names and globs hiding its tools (the globs as a set:
# roles and blanket denies often repeat one); checked: the shapes that need
# the full per-tool test
# regal ignore:prefer-set-or-object-rule
name_rules := {shape: {"names": v.names, "patterns": {p | some p in v.patterns}} |
	some shape, v in shape_verdicts
	is_object(v)
}

# regal ignore:prefer-set-or-object-rule
checked := {shape | some shape, v in shape_verdicts; v == "check"}
