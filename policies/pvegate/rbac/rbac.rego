# METADATA
# title: Role-based access control
# description: |
#   Roles (data.data.roles) grant and deny tools through selectors; bindings
#   (data.data.bindings) give roles to principals, optionally scoped to
#   clusters, nodes, pools, guest tags and vmid ranges. A call is permitted
#   when a binding that applies to the principal and the target grants the
#   tool, and no applicable binding's role denies it (deny overrides allow).
# schemas:
#   - input: schema["policy_input.schema"]
package pvegate.rbac

import data.pvegate.config
import data.pvegate.lib

# --- which bindings belong to a principal ------------------------------------

# bindings_for(principal) is the set of bindings that name the principal by
# subject, group or token role claim (and allow its kind).
bindings_for(principal) := {b |
	some i in binding_ids(principal)
	b := config.bindings[i]
	lib.in_list(b, "principal_kinds", principal.kind)
	is_object(config.roles[b.role])
}

# binding_index: subject, group and token role -> the positions of the bindings
# naming it. It depends on data only: a constant once the policy is partially
# evaluated with its data (lib's selector indexes say more), so a call looks
# its principal's bindings up instead of testing every binding.
binding_index[key][name] contains i if {
	some i, b in config.bindings
	some key in ["subjects", "groups", "token_roles"]
	some name in object.get(b, key, [])
}

# caller_bindings: bindings_for(input.principal), as rules (not a function
# call) so that partial evaluation turns binding_index into a constant here
caller_bindings contains b if {
	some i in caller_binding_ids
	b := config.bindings[i]
	lib.in_list(b, "principal_kinds", input.principal.kind)
	is_object(config.roles[b.role])
}

caller_binding_ids contains i if some i in binding_index.subjects[input.principal.sub]

caller_binding_ids contains i if {
	some g in input.principal.groups
	some i in binding_index.groups[g]
}

caller_binding_ids contains i if {
	some r in input.principal.roles
	some i in binding_index.token_roles[r]
}

# binding_ids(principal): positions of the bindings naming the principal
binding_ids(principal) := (by_sub | by_groups) | by_roles if {
	by_sub := {i | some i in binding_index.subjects[principal.sub]}
	by_groups := {i | some g in object.get(principal, "groups", []); some i in binding_index.groups[g]}
	by_roles := {i | some r in object.get(principal, "roles", []); some i in binding_index.token_roles[r]}
}

# --- does a binding's scope cover the target ---------------------------------

# scope_covers(scope, target): every constraint present in scope holds for target.
# (an empty scope covers every target: no constraint to test)
scope_covers(scope, target) if {
	scope == {}
} else if {
	attr_listed(scope, "clusters", target, "cluster")
	attr_listed(scope, "nodes", target, "node")
	attr_listed(scope, "pools", target, "pool")
	guest_tags_ok(scope, target)
	vmid_ok(scope, target)
}

attr_listed(scope, key, _, _) if not key in object.keys(scope)

attr_listed(scope, key, target, attr) if {
	v := target[attr]
	v != null
	v in scope[key]
}

guest_tags_ok(scope, _) if not "guest_tags" in object.keys(scope)

guest_tags_ok(scope, target) if {
	some t in lib.tags_of(target)
	t in scope.guest_tags
}

vmid_ok(scope, _) if not "vmids" in object.keys(scope)

vmid_ok(scope, target) if {
	is_number(target.vmid)
	some r in scope.vmids
	target.vmid >= r.from
	target.vmid <= r.to
}

# applies(b, target): the binding's scope covers the target.
applies(b, target) if scope_covers(object.get(b, "scope", {}), target)

# --- role permissions ----------------------------------------------------------

# selector_index: role -> "allow"|"deny" -> effect -> [position, domain_only]
# of the role's selectors admitting the effect (data only: a constant once
# partially evaluated, as binding_index)
selector_index[name][kind][e] contains [i, domain_only(sel)] if {
	some name, role in config.roles
	is_object(role)
	some kind in ["allow", "deny"]
	some i, sel in object.get(role, kind, [])
	some e in lib.effects
	lib.admits(sel, "effects", e)
}

# role_grants(name, tool): some allow selector of the role matches the tool.
role_grants(name, tool) if {
	some [i, false] in selector_index[name].allow[tool.effect]
	lib.tool_matches(config.roles[name].allow[i], tool)
}

role_grants(name, tool) if {
	some [i, true] in selector_index[name].allow[tool.effect]
	domain_selector_matches(config.roles[name].allow[i], tool)
}

# role_denies(name, tool): some deny selector of the role matches the tool.
role_denies(name, tool) if {
	some [i, false] in selector_index[name].deny[tool.effect]
	lib.tool_matches(config.roles[name].deny[i], tool)
}

role_denies(name, tool) if {
	some [i, true] in selector_index[name].deny[tool.effect]
	domain_selector_matches(config.roles[name].deny[i], tool)
}

# domain_selector_matches(sel, tool): lib.tool_matches(sel, tool) for a selector
# with effects and domains only (domain_only: most role grants): no scope, tag and
# name tests, just a tool that has those parts. The index files each selector
# with domain_only(sel), a constant once partially evaluated, so a call meets
# the role_grants/role_denies clause for its kind only.
domain_selector_matches(sel, tool) if {
	lib.admits(sel, "effects", tool.effect)
	lib.admits(sel, "domains", tool.domain)
	is_array([tool.scope, tool.name])
}

default domain_only(_) := false

domain_only(sel) if count(object.keys(sel) - {"effects", "domains"}) == 0

# --- the current tools/call ---------------------------------------------------
# Each rule below is computed once per query; the role selectors are matched
# against input.tool once per applicable role, not once per use.

# bindings of the caller that apply to the call's target
applicable_bindings contains b if {
	some b in caller_bindings
	applies(b, input.target)
}

applicable_roles contains b.role if some b in applicable_bindings

# applicable roles whose selectors allow / forbid the tool
roles_allowing_tool contains name if {
	some name in applicable_roles
	role_grants(name, input.tool)
}

roles_denying_tool contains name if {
	some name in applicable_roles
	role_denies(name, input.tool)
}

# applicable bindings whose role grants the tool (and does not itself deny it)
granting_bindings contains b if {
	some b in applicable_bindings
	b.role in roles_allowing_tool
	not b.role in roles_denying_tool
}

leaf_granted(leaf) if {
	some name in applicable_roles
	role_grants(name, leaf)
	not role_denies(name, leaf)
}

# granting_roles: names of the roles that grant this call
granting_roles contains b.role if some b in granting_bindings

# break_glass: a break-glass role grants this call
break_glass if {
	some b in granting_bindings
	config.roles[b.role].break_glass == true
}

# deny: the sentences of the denials below
deny contains r.message if some r in denials

denials contains lib.reason("rbac.role_denies", sprintf("data.roles.%s.deny", [b.role]), msg) if {
	some b in applicable_bindings
	b.role in roles_denying_tool
	msg := sprintf("role %q (binding %q) forbids tool %q", [b.role, object.get(b, "name", "unnamed"), input.tool.name])
}

# a composite tool reads through leaf tools: it is granted only where each leaf is
denials contains lib.reason("rbac.composite_leaf_not_granted", "pvegate.rbac.leaf_granted", msg) if {
	some leaf in object.get(input.tool, "uses", [])
	not leaf_granted(leaf)
	msg := sprintf(
		"composite tool %q reads through %q, which no role of principal %q permits on %s",
		[input.tool.name, leaf.name, input.principal.sub, target_text],
	)
}

denials contains lib.reason("rbac.not_granted", "pvegate.rbac.granting_bindings", msg) if {
	count(granting_bindings) == 0
	msg := sprintf(
		"no role of principal %q permits %s tool %q on %s; ask an administrator for a role binding that covers it",
		[input.principal.sub, input.tool.effect, input.tool.name, target_text],
	)
}

# target_text describes the target for messages.
default target_text := "an unresolved target"

target_text := sprintf("guest %v on node %v (pool %v)", [input.target.vmid, input.target.node, input.target.pool]) if {
	input.target.known == true
	input.target.vmid != null
}

target_text := sprintf("node %v", [input.target.node]) if {
	input.target.known == true
	input.target.vmid == null
}

# --- tools/list ---------------------------------------------------------------
# A listing checks every catalog tool against the lister's role selectors. To
# keep that fast for hundreds of tools, the selectors are indexed once per
# query by effect, domain and scope: a tool only meets the few selectors its
# (effect, domain, scope) admits, and only those test tags and name globs.

# the lister's bindings are caller_bindings (computed once per query)
lister_roles contains b.role if some b in caller_bindings

# lister_selectors: [role, "allow"|"deny", index] -> compiled selector
lister_selectors[[name, kind, i]] := c if {
	some name in lister_roles
	some kind in ["allow", "deny"]
	some i, c in config.compiled_roles[name][kind]
}

# selector ids by each value they accept ("*": any value)
ids_by_effect[v] contains id if {
	some id, c in lister_selectors
	some v in c.effects
}

ids_by_domain[v] contains id if {
	some id, c in lister_selectors
	some v in c.domains
}

ids_by_scope[v] contains id if {
	some id, c in lister_selectors
	some v in c.scopes
}

# per value present in the listed tools: the ids accepting it. Complete rules
# on purpose: each is computed once per query (a partial object rule would be
# re-evaluated for every tool that looks a key up).
accepting(index, v) := object.get(index, v, set()) | object.get(index, "*", set())

# regal ignore:prefer-set-or-object-rule
effect_ids := {v: accepting(ids_by_effect, v) |
	some v in {shape[0] | some shape in listed_shapes}
}

# regal ignore:prefer-set-or-object-rule
domain_ids := {v: accepting(ids_by_domain, v) |
	some v in {shape[1] | some shape in listed_shapes}
}

# regal ignore:prefer-set-or-object-rule
scope_ids := {v: accepting(ids_by_scope, v) |
	some v in {shape[2] | some shape in listed_shapes}
}

# shape_ids: (effect, domain, scope) of the listed tools -> selector ids admitting it
# listed_shapes: the distinct (effect, domain, scope) of the listed tools
# (a comprehension: one pass over the tools, cheaper than a partial set rule)
# regal ignore:prefer-set-or-object-rule
listed_shapes := {[t.effect, t.domain, t.scope] | some t in input.tools}

# regal ignore:prefer-set-or-object-rule
shape_ids := {shape: ids |
	some shape in listed_shapes
	ids := (effect_ids[shape[0]] & domain_ids[shape[1]]) & scope_ids[shape[2]]
}

# plain_shapes: shapes visible whatever the tool's name and tags: a role
# grants them with a selector that constrains neither, and denies nothing there
plain_shapes contains shape if {
	some shape, ids in shape_ids
	some id in ids
	id[1] == "allow"
	"*" in lister_selectors[id].tool_tags
	lister_selectors[id].any_name
	not role_denies_in(ids, id[0])
}

# plain_grants: shape -> roles granting it with a selector that constrains
# neither name nor tags. (Complete rules here and below on purpose: computed
# once per query, then looked up per tool.)
# regal ignore:prefer-set-or-object-rule
plain_grants := {shape: roles |
	some shape, ids in shape_ids
	roles := {id[0] |
		some id in ids
		id[1] == "allow"
		"*" in lister_selectors[id].tool_tags
		lister_selectors[id].any_name
	}
	count(roles) > 0
}

# name_denies: [shape, role] -> the role's deny selectors admitting the shape,
# merged into one name matcher, when none of them looks at tags
# regal ignore:prefer-set-or-object-rule
name_denies := {[shape, role]: merged |
	some shape, roles in plain_grants
	some role in roles
	denies := [lister_selectors[id] | some id in shape_ids[shape]; id[0] == role; id[1] == "deny"]
	count(denies) > 0
	every c in denies {
		"*" in c.tool_tags
	}
	merged := {
		"any_name": any_true([c.any_name | some c in denies]),
		"names": {n | some c in denies; some n in c.names},
		"patterns": [p | some c in denies; some p in c.patterns],
	}
}

default any_true(_) := false

any_true(bools) if true in bools

role_denies_in(ids, role) if {
	some id in ids
	id[0] == role
	id[1] == "deny"
}

# plain_only(shape): every allow selector admitting the shape constrains
# neither name nor tags; then tool_visible is decided by the roles' name denies
plain_only(shape) if {
	plain_grants[shape]
	not constrained_allow(shape)
}

constrained_allow(shape) if {
	some id in shape_ids[shape]
	id[1] == "allow"
	not plain_selector(lister_selectors[id])
}

plain_selector(c) if {
	"*" in c.tool_tags
	c.any_name
}

# any_allow(shape): some allow selector of the lister admits the shape
any_allow(shape) if {
	some id in shape_ids[shape]
	id[1] == "allow"
}

# listing_verdict(shape): what decides tools/list for tools of the shape,
# in agreement with tool_visible for each of them (guard rails aside):
#   "hide" (none is visible), "check" (tool_visible decides per tool), or
#   {"names", "patterns"}: visible unless one of these names or globs names
#   the tool (both empty: all are visible)
listing_verdict(shape) := {"names": set(), "patterns": []} if {
	shape in plain_shapes
} else := "hide" if {
	not any_allow(shape)
} else := name_rule(denies) if {
	# one role grants the shape outright, nothing else does, and that role
	# denies there by name only
	plain_only(shape)
	count(plain_grants[shape]) == 1
	some role in plain_grants[shape]
	denies := name_denies[[shape, role]]
} else := "check"

# name_rule(m): the granting role's merged name denies m as a verdict
name_rule(m) := "hide" if {
	m.any_name
} else := {"names": m.names, "patterns": m.patterns}

# tool_visible(tool, shape): some bound role grants the tool on some target,
# and that role does not deny it; shape is [effect, domain, scope] of the tool.
tool_visible(tool, shape) if {
	shape in plain_shapes
} else if {
	# a role grants the shape outright and only denies some names there
	some role in plain_grants[shape]
	not lib.name_hit(name_denies[[shape, role]], tool.name)
} else if {
	ids := shape_ids[shape]
	some id in ids
	id[1] == "allow"
	rest_hits(lister_selectors[id], tool)
	not role_denies_among(ids, id[0], tool)
}

role_denies_among(ids, role, tool) if {
	some id in ids
	id[0] == role
	id[1] == "deny"
	rest_hits(lister_selectors[id], tool)
}

# rest_hits(c, tool): the tag and name parts of a compiled selector
rest_hits(c, tool) if {
	lib.tags_hit(c.tool_tags, object.get(tool, "tags", []))
	lib.name_hit(c, tool.name)
}

# --- listing follows denial ---------------------------------------------------
# Deny overrides allow across roles: a deny selector of a role bound to the
# lister WITHOUT a scope denies the tool on every target, whichever role grants
# it (a `contractors` group's restriction on an operator). Such a tool is
# useless to the lister, so tools/list hides it too. A scoped binding's deny
# only holds on some targets and hides nothing.

# blanket_denies: the compiled deny selectors of the lister's unscoped bindings
blanket_denies contains c if {
	some b in caller_bindings
	count(object.get(b, "scope", {})) == 0
	some c in config.compiled_roles[b.role].deny
}

# blanket_by_shape: listed shape -> the blanket denies admitting it
# regal ignore:prefer-set-or-object-rule
blanket_by_shape := {shape: cs |
	some shape in listed_shapes
	cs := [c | some c in blanket_denies; shape_admits(c, shape)]
	count(cs) > 0
}

shape_admits(c, shape) if {
	count({shape[0], "*"} & c.effects) > 0
	count({shape[1], "*"} & c.domains) > 0
	count({shape[2], "*"} & c.scopes) > 0
}

# blanket_denied(tool, shape): an unscoped binding's role denies the tool
blanket_denied(tool, shape) if {
	some c in blanket_by_shape[shape]
	rest_hits(c, tool)
}

# blanket_needs_tool_check(shape): a blanket deny admitting the shape looks at
# tool tags, so only the per-tool test can apply it
blanket_needs_tool_check(shape) if {
	some c in blanket_by_shape[shape]
	not "*" in c.tool_tags
}

# with_blanket_denies(v, shape): the listing verdict v of the shape, with the
# (name-only) blanket denies admitting the shape merged into its name rule
with_blanket_denies(v, shape) := v if {
	not is_object(v)
} else := v if {
	not blanket_by_shape[shape]
} else := "hide" if {
	some c in blanket_by_shape[shape]
	c.any_name
} else := {
	"names": (v.names | {n | some c in blanket_by_shape[shape]; some n in c.names}),
	"patterns": array.concat(v.patterns, [p | some c in blanket_by_shape[shape]; some p in c.patterns]),
}

# --- approvers ------------------------------------------------------------------

# may_approve(approver, target): a binding of the approver whose role has
# `approve: true` applies to the target.
may_approve(approver, target) if {
	some b in bindings_for(approver)
	config.roles[b.role].approve == true
	applies(b, target)
}
