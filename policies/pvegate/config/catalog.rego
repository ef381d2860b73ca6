# Policy data against the tool catalog.
# The data names tools and their arguments as plain strings; a misspelled
# one (node_rebot, arguments.cipasword, firewal) matches no call and the
# control it carries silently stops applying. catalog_problems names every
# reference the catalog the gateway serves does not know. The catalog is
# the gateway's (connectors/*.yaml), so it comes as the input, asked once
# per policy revision and by `pvegate policy check` / `bundle build`:
#   {"catalog": {"<tool>": {"parameters": ["<name>", ...],
#                           "parameter_types": {"<name>": {"type": ..., "enum": [...]}},
#                           "tags": ["<tag>", ...]}, ...}}
# A listed argument value is compared exactly with the call's argument, which
# the gateway validated against the parameter's schema first: a value of
# another type (firewall: [0] for a boolean) matches no call either.
# Without a catalog in the input there is nothing to report (nor any value
# check without parameter_types: a gateway older than it). These are not
# among `problems`: a bundle may serve gateways with other catalogs, so a
# reference one of them does not know refuses no call (docs/policy-contract.md).
package pvegate.config

import data.pvegate.lib

# catalog_problems: one line per reference to a tool or an argument the catalog
# does not know, named by its path from the data root
catalog_problems contains msg if {
	is_object(input.catalog)
	some [path, name] in tool_refs
	not lib.is_glob(name)
	not catalog_tool(name)
	msg := sprintf("%s: %s names no tool in the catalog (misspelled?)", [path, name])
}

catalog_problems contains msg if {
	is_object(input.catalog)
	some [path, name] in tool_refs
	lib.is_glob(name)
	count(catalog_matches([name])) == 0
	msg := sprintf("%s: the glob %s matches no tool in the catalog", [path, name])
}

# an argument named for a tool: the tool must declare it
catalog_problems contains msg if {
	some [path, names, arg] in argument_refs
	some name in names
	not lib.is_glob(name)
	catalog_tool(name)
	not arg in input.catalog[name].parameters
	msg := sprintf("%s: tool %s has no parameter %s (misspelled?)", [path, name, arg])
}

# ... for a glob (or a selector without tools: every tool), one tool it matches
# must declare it
catalog_problems contains msg if {
	some [path, names, arg] in argument_refs
	globs := [n | some n in names; lib.is_glob(n)]
	count(globs) > 0
	matched := catalog_matches(globs)
	count(matched) > 0
	not declared_by_one(matched, arg)
	msg := sprintf("%s: no tool matching %s has a parameter %s (misspelled?)", [path, concat(", ", globs), arg])
}

# a listed argument value no tool the entry names or matches takes (of another
# type than the parameter's, or not among its enum): it matches no call
catalog_problems contains msg if {
	some [path, names, arg, values] in argument_values
	tools := typed_tools(names, arg)
	count(tools) > 0
	some v in values
	not fits_one(v, tools)
	msg := sprintf("%s: %s (%s) matches no call: the parameter is %s", [path, json.marshal(v), type_name(v), kinds(tools)])
}

# ... and a tool the entry names exactly whose parameter takes none of the values
# others take: the entry never applies to it
catalog_problems contains msg if {
	some [path, names, arg, values] in argument_values
	tools := typed_tools(names, arg)
	some name in names
	not lib.is_glob(name)
	spec := tools[name]
	not takes_one(values, spec)
	some v in values
	fits_one(v, tools)
	msg := sprintf("%s: tool %s takes none of the values (its parameter %s is %s)", [path, name, arg, describe(spec)])
}

# a tool tag the data names: one tool must carry it
catalog_problems contains msg if {
	is_object(input.catalog)
	some [path, tag] in tag_refs
	not catalog_tag(tag)
	msg := sprintf("%s: no tool in the catalog carries the tag %s (misspelled?)", [path, tag])
}

catalog_tool(name) if is_object(input.catalog[name])

# catalog_matches(patterns): the catalog's tools matching one of the globs
catalog_matches(patterns) := {t | some t, _ in input.catalog; lib.glob_any(patterns, t)}

declared_by_one(tools, arg) if {
	some t in tools
	arg in input.catalog[t].parameters
}

# --- where the data names tools ----------------------------------------------

# selectors: [path, selector] of every selector whose `tools` names tools
selectors contains [sprintf("roles.%s.%s.%d", [name, kind, i]), sel] if {
	some name, role in roles
	some kind in ["allow", "deny"]
	some i, sel in object.get(role, kind, [])
}

selectors contains [sprintf("guardrails.deny_rules.%d", [i]), sel] if some i, sel in deny_rules

selectors contains [sprintf("risk.critical_calls.%d", [i]), sel] if some i, sel in risk.critical_calls

selectors contains [sprintf("approval.rules.%d", [i]), sel] if some i, sel in approval.rules

selectors contains [sprintf("approval.waivers.%d", [i]), sel] if some i, sel in approval.waivers

selectors contains [sprintf("obligations.reveal_secrets.%d", [i]), sel] if some i, sel in reveal_secrets

selectors contains [sprintf("quotas.%d", [i]), sel] if some i, sel in quotas

selectors contains [sprintf("resource_quotas.%d", [i]), sel] if some i, sel in resource_quotas

# tool_refs: [path, tool name or glob] of every tool the data names
tool_refs contains [sprintf("%s.tools", [path]), name] if {
	some [path, sel] in selectors
	some name in sel.tools
	is_string(name)
}

tool_refs contains ["ip_scope.tools", name] if {
	some name in ip_scope.tools
	is_string(name)
}

# (a redact key is a tool-name glob)
tool_refs contains ["obligations.redact", name] if some name, _ in redact

# argument_refs: [path, the tool names or globs, argument name] of every
# argument the data names
argument_refs contains [sprintf("risk.critical_calls.%d.arguments.%s", [i, arg]), selector_tools(c), arg] if {
	some i, c in risk.critical_calls
	some arg, _ in c.arguments
}

# `arguments.<name>...` redacts an argument in the audit log (`*`: every one)
argument_refs contains [sprintf("obligations.redact.%s: %s", [name, path]), [name], arg] if {
	some name, paths in redact
	some path in paths
	is_string(path)
	[first, arg] := array.slice(split(path, "."), 0, 2)
	first == "arguments"
	arg != "*"
}

# ip_scope scopes the `ip` argument: a tool without one is scoped to nothing
argument_refs contains ["ip_scope.tools", [name], "ip"] if {
	some name in ip_scope.tools
	is_string(name)
}

# argument_values: [path, the tool names or globs, argument name, the values]
# of every argument condition listing values (risk.critical_calls: the only ones)
argument_values contains [sprintf("risk.critical_calls.%d.arguments.%s", [i, arg]), selector_tools(c), arg, values] if {
	some i, c in risk.critical_calls
	some arg, values in c.arguments
	is_array(values)
}

# typed_tools(names, arg): {tool: its parameter's type and enum} of the catalog's
# tools the names or globs match that declare arg
typed_tools(names, arg) := {t: spec |
	some t, tool in input.catalog
	lib.glob_any(names, t)
	spec := tool.parameter_types[arg]
	is_object(spec)
}

fits_one(v, tools) if {
	some spec in tools
	fits(v, spec)
}

takes_one(values, spec) if {
	some v in values
	fits(v, spec)
}

# fits(v, spec): v has the parameter's type and is among its enum (a type
# list, or none, is not checked)
fits(v, spec) if {
	fits_type(v, spec)
	fits_enum(v, spec)
}

json_types := {"integer", "number", "string", "boolean", "array", "object", "null"}

fits_type(_, spec) if not object.get(spec, "type", null) in json_types

fits_type(v, spec) if {
	spec.type == "integer"
	is_number(v)
	round(v) == v
}

fits_type(v, spec) if {
	spec.type != "integer"
	type_name(v) == spec.type
}

fits_enum(_, spec) if not is_array(object.get(spec, "enum", null))

fits_enum(v, spec) if v in spec.enum

# what a parameter takes, in words
describe(spec) := sprintf("one of %s", [json.marshal(spec.enum)]) if {
	is_array(spec.enum)
} else := spec.type if {
	spec.type in json_types
} else := "any value"

# kinds(tools): what each tool's parameter takes, with the tools taking it
kinds(tools) := concat("; ", {sprintf("%s for %s", [d, concat(", ", sort([t | some t, s in tools; describe(s) == d]))]) |
	some spec in tools
	d := describe(spec)
})

# the tool names or globs a selector matches ("*" without a tools key)
selector_tools(sel) := [n | some n in sel.tools; is_string(n)] if is_array(sel.tools)

else := ["*"]

# --- where the data names tool tags -------------------------------------------

catalog_tag(tag) if {
	some t in input.catalog
	tag in t.tags
}

# tag_refs: [path, tag] of every tool tag the data names ("*" is any)
tag_refs contains [sprintf("%s.tool_tags", [path]), tag] if {
	some [path, sel] in selectors
	some tag in sel.tool_tags
	is_string(tag)
	tag != "*"
}

tag_refs contains ["risk.tool_tag_points", tag] if some tag, _ in risk.tool_tag_points
