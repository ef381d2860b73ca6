# METADATA
# title: Role-based access control
# description: |
#   Roles (data.data.roles) grant and deny tools through selectors; bindings
#   (data.data.bindings) give roles to principals, optionally scoped to
#   clusters, nodes, pools, guest tags and vmid ranges. A call is permitted
#   when a binding that applies to the principal and the target grants the
#   tool, and no binding whose deny holds there denies it (deny overrides
#   allow). A grant's scope must cover the target and every guest the call
#   reaches (a destination, a backup's guest, a volume's owner, a prune's
#   guests); a deny holds where its scope covers any one of them. A
#   pool-scoped binding's deny also holds on a guest whose pool Proxmox
#   hides from the gateway's token (pool_known false), where it may apply.
#   Composite tools (composite.rego) are granted only where each leaf is.
# schemas:
#   - input: schema["policy_input.schema"]
package pvegate.rbac

import data.pvegate.config
import data.pvegate.lib

# --- which bindings belong to a principal ------------------------------------

# bindings_for(principal) is the set of bindings that name the principal by
# subject, group or token role claim (and allow its kind).
bindings_for(principal) := {b |
	some b in ((by_sub | by_groups) | by_roles)
	lib.in_list(b, "principal_kinds", principal.kind)
} if {
	by_sub := {b | some b in binding_index.subjects[principal.sub]}
	by_groups := {b | some g in object.get(principal, "groups", []); some b in binding_index.groups[g]}
	by_roles := {b | some r in object.get(principal, "roles", []); some b in binding_index.token_roles[r]}
}

# binding_index: subject, group and token role -> the bindings naming it (those
# of a defined role: a binding of an unknown role gives nothing). It depends on
# data only: a constant once the policy is partially evaluated with its data
# (lib's selector indexes say more), so a call looks its principal's bindings up
# instead of testing every binding.
binding_index[key][name] contains b if {
	some b in config.bindings
	is_object(config.roles[b.role])
	some key in ["subjects", "groups", "token_roles"]
	some name in object.get(b, key, [])
}

# caller_bindings: bindings_for(input.principal), as rules (not a function
# call) so that partial evaluation turns binding_index into a constant here.
# (object.get on the whole index, not a path into it: partial evaluation then
# writes the index as one constant looked up per call, instead of one clause per
# subject, group and token role tested one after the other; the principal kind
# tested as lib.in_list does, without a function call)
caller_bindings contains b if {
	some b in object.get(binding_index, ["subjects", input.principal.sub], [])
	kind := input.principal.kind
	kind in object.get(b, "principal_kinds", [kind])
}

caller_bindings contains b if {
	some g in input.principal.groups
	some b in object.get(binding_index, ["groups", g], [])
	kind := input.principal.kind
	kind in object.get(b, "principal_kinds", [kind])
}

caller_bindings contains b if {
	some r in input.principal.roles
	some b in object.get(binding_index, ["token_roles", r], [])
	kind := input.principal.kind
	kind in object.get(b, "principal_kinds", [kind])
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

# applies(b, target): the binding's scope covers the target, and where the call
# puts a guest (target.destination: a clone, a migration), that too: a binding
# scoped to a pool or nodes never lets a guest out of them. A binding without a
# scope covers every target: nothing to test.
applies(b, _) if object.get(b, "scope", {}) == {}

applies(b, target) if {
	scope := object.get(b, "scope", {})
	scope != {}
	scope_covers(scope, target)
	destination_covered(scope, target)
	backup_of_covered(scope, target)
	volume_of_covered(scope, target)
	guests_covered(scope, target)
}

destination_covered(_, target) if not "destination" in object.keys(target)

destination_covered(scope, target) if scope_covers(scope, target.destination)

# a restore copies the guest its backup was taken of: the scope must cover that guest too
backup_of_covered(_, target) if not "backup_of" in object.keys(target)

backup_of_covered(scope, target) if scope_covers(scope, target.backup_of)

# a guest's volume (target.volume_of: deleted or changed by its id) is that guest's: the scope
# must cover the guest as it is now (gone, or not known: no node or pool, which a scoped binding
# does not cover); a volume whose name says nobody owns it (an ISO, a template) is the storage's
volume_of_covered(_, target) if not "volume_of" in object.keys(target)

volume_of_covered(_, target) if target.volume_of.content == null

volume_of_covered(scope, target) if scope_covers(scope, target.volume_of)

# the lists of guests a call reaches besides its target: a prune deletes the backups of every
# guest in target.prune_removes, a pool membership change moves every guest in target.members
reach_lists := ["prune_removes", "members"]

# guests_covered(scope, target): the scope covers every guest of each list the target has (what
# a list reaches, unknown, is not known to be in scope)
guests_covered(scope, target) if {
	every k in reach_lists {
		reach_covered(scope, target, k)
	}
}

reach_covered(_, target, k) if not k in object.keys(target)

reach_covered(scope, target, k) if {
	target[k].known == true
	every guest in target[k].guests {
		scope_covers(scope, object.union(guest, {"cluster": target.cluster}))
	}
}

# deny_applies(b, target): the binding's deny holds on the call. applies() needs the target
# AND every guest the call reaches covered, which is right for a grant but would let a caller
# escape a deny by choosing where the call reaches (a clone out of a fenced pool, a migration
# onto a fenced node): a deny holds where its scope covers the target OR any guest reached.
deny_applies(b, _) if object.get(b, "scope", {}) == {}

deny_applies(b, target) if {
	scope := object.get(b, "scope", {})
	scope != {}
	some guest in reached(target)
	scope_covers(scope, guest)
}

# a prune or a pool membership change whose reach is unknown may reach guests in the scope:
# fail closed
deny_applies(b, target) if {
	scope := object.get(b, "scope", {})
	scope != {}
	attr_listed(scope, "clusters", target, "cluster") # a deny fencing another cluster stays there
	some k in reach_lists
	_ = target[k] # the key is present (any value, null too)
	not target[k].known == true
}

# reached(target): the target and every guest the call reaches (as applies() tests them; a
# volume nobody owns, content null, has no node, pool or tags for a scope to cover)
reached(target) := ({target} | {v |
	some k in ["destination", "backup_of", "volume_of"]
	v := object.get(target, k, null)
	is_object(v)
}) | {object.union(g, {"cluster": target.cluster}) |
	some k in reach_lists
	some g in target[k].guests
}

# --- role permissions ----------------------------------------------------------

# selector_index: role -> "allow"|"deny" -> effect -> [selector, domain_only] of
# the role's selectors admitting the effect (data only: a constant once partially
# evaluated, as binding_index; the selector itself, not its position, so that the
# optimised rules below hold it as a constant instead of reading config.roles)
selector_index[name][kind][e] contains [sel, domain_only(sel)] if {
	some name, role in config.roles
	is_object(role)
	some kind in ["allow", "deny"]
	some sel in object.get(role, kind, [])
	some e in lib.effects
	lib.admits(sel, "effects", e)
}

# role_grants(name, tool): some allow selector of the role matches the tool.
# A selector with effects and domains only (domain_only: most role grants) is
# lib.tool_matches(sel, tool) by its domains alone: found through selector_index
# by the tool's effect, its effect is admitted already, so no effect, scope, tag
# and name tests, just a tool that has those parts (tested in the rule body, not
# by a function). The index files each selector with domain_only(sel), a
# constant once partially evaluated, so a call meets the clause for its kind only.
role_grants(name, tool) if {
	some [sel, false] in selector_index[name].allow[tool.effect]
	lib.tool_matches(sel, tool)
}

role_grants(name, tool) if {
	some [sel, true] in selector_index[name].allow[tool.effect]
	lib.admits(sel, "domains", tool.domain)
	_ = tool.scope # present, whatever its value
	_ = tool.name
}

# role_denies(name, tool): some deny selector of the role matches the tool (as role_grants).
role_denies(name, tool) if {
	some [sel, false] in selector_index[name].deny[tool.effect]
	lib.tool_matches(sel, tool)
}

role_denies(name, tool) if {
	some [sel, true] in selector_index[name].deny[tool.effect]
	lib.admits(sel, "domains", tool.domain)
	_ = tool.scope
	_ = tool.name
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
	some name in deny_roles
	role_denies(name, input.tool)
}

# bindings of the caller whose deny holds on the call's target (deny_applies)
deny_bindings contains b if {
	some b in caller_bindings
	deny_applies(b, input.target)
}

# the roles whose denies hold on the call: those of deny_bindings, and those of bindings whose
# deny would hold were the hidden pool theirs (nothing to add while no pool is hidden)
deny_roles contains b.role if some b in deny_bindings

deny_roles contains b.role if some b in hidden_pool_deny_bindings

# --- a guest whose pool the gateway cannot see ---------------------------------
# Proxmox hides a guest's pool from a token without Pool.Audit on it: the guest is listed
# as in no pool, and the gateway says its pool is not known (pool_known false on the target,
# its destination, the guest a backup was taken of, a volume's owner, a guest a prune
# reaches). The same holds for the guest a backup was taken of when it is gone or could not
# be read: it may have been in any pool. A pool-scoped binding's allow does not cover such a guest (its pool, null, is in
# no list); its deny must not be escaped that way: a binding that would apply were the hidden
# pool one of its pools counts for denial (deny overrides allow).

pool_hidden if input.target.pool_known == false

pool_hidden if input.target.destination.pool_known == false

pool_hidden if input.target.backup_of.pool_known == false

pool_hidden if input.target.volume_of.pool_known == false

pool_hidden if {
	some k in reach_lists
	some guest in input.target[k].guests
	guest.pool_known == false
}

# bindings of the caller that apply to the call's target only if a hidden pool is theirs
hidden_pool_bindings contains b if {
	pool_hidden
	some b in caller_bindings
	not applies(b, input.target)
	some pool in object.get(b, ["scope", "pools"], [])
	applies(b, in_pool(input.target, pool))
}

# bindings of the caller whose deny holds on the call only if a hidden pool is theirs
hidden_pool_deny_bindings contains b if {
	pool_hidden
	some b in caller_bindings
	not deny_applies(b, input.target)
	some pool in object.get(b, ["scope", "pools"], [])
	deny_applies(b, in_pool(input.target, pool))
}

# in_pool(target, pool): the target with every pool it does not know (pool_known false) as `pool`
in_pool(target, pool) := object.union_n([
	revealed(target, pool),
	{k: revealed(target[k], pool) |
		some k in ["destination", "backup_of", "volume_of"]
		is_object(target[k])
	},
	revealed_lists(target, pool),
])

revealed(obj, pool) := object.union(obj, {"pool": pool}) if obj.pool_known == false

else := obj

revealed_lists(target, pool) := {k: object.union(target[k], {"guests": [revealed(g, pool) | some g in target[k].guests]}) |
	some k in reach_lists
	is_object(target[k])
}

# roles that would grant the call were a hidden pool their binding's: a resource quota for
# such a role may apply (pvegate.resources)
hidden_pool_granting_roles contains b.role if {
	some b in hidden_pool_bindings
	role_grants(b.role, input.tool)
	not role_denies(b.role, input.tool)
}

# applicable bindings whose role grants the tool (and does not itself deny it)
granting_bindings contains b if {
	some b in applicable_bindings
	b.role in roles_allowing_tool
	not b.role in roles_denying_tool
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

# (the denying roles first: almost always none, so no binding is looked at)
denials contains lib.reason("rbac.role_denies", sprintf("data.roles.%s.deny", [b.role]), msg) if {
	some name in roles_denying_tool
	some b in deny_bindings
	b.role == name
	msg := sprintf("role %q (binding %q) forbids tool %q", [b.role, object.get(b, "name", "unnamed"), input.tool.name])
}

denials contains lib.reason("rbac.role_denies", sprintf("data.roles.%s.deny", [b.role]), msg) if {
	some b in hidden_pool_deny_bindings
	b.role in roles_denying_tool
	msg := sprintf(
		concat("", [
			"role %q (binding %q) forbids tool %q in pool %s, and Proxmox hides the guest's pool from ",
			"the gateway's token (it needs Pool.Audit), or the guest is gone or could not be read: ",
			"the guest may be there",
		]),
		[b.role, object.get(b, "name", "unnamed"), input.tool.name, concat(" or ", b.scope.pools)],
	)
}

denials contains lib.reason("rbac.not_granted", "pvegate.rbac.granting_bindings", msg) if {
	count(granting_bindings) == 0
	msg := sprintf(
		"no role of principal %q permits %s tool %q on %s; ask an administrator for a role binding that covers it",
		[input.principal.sub, input.tool.effect, input.tool.name, target_text],
	)
}

# --- tools/list ---------------------------------------------------------------
# What a listing shows, tool by tool: tool_visible (the roles) and
# blanket_denied (denial across roles) below, guardrails.hidden_from_list (the
# guard rails). tools_list.rego computes the same answer for the whole
# catalog at once, with sets of tool positions; its tests hold it to these.

# the lister's bindings are caller_bindings (computed once per query)
lister_roles contains b.role if some b in caller_bindings

# lister_selectors: [role, "allow"|"deny", index] -> compiled selector
lister_selectors[[name, kind, i]] := c if {
	some name in lister_roles
	some kind in ["allow", "deny"]
	some i, c in config.compiled_roles[name][kind]
}

# tool_visible(tool): some role bound to the lister grants the tool on some
# target (binding scopes are not applied: no target is known yet), and that
# role does not deny it
tool_visible(tool) if {
	some [role, "allow", _], c in lister_selectors
	lib.compiled_matches(c, tool)
	not lister_role_denies(role, tool)
}

lister_role_denies(role, tool) if {
	some id, c in lister_selectors
	id[0] == role
	id[1] == "deny"
	lib.compiled_matches(c, tool)
}

# --- listing follows denial ---------------------------------------------------
# Deny overrides allow across roles: a deny selector of a role bound to the
# lister WITHOUT a scope denies the tool on every target, whichever role grants
# it (a `contractors` group's restriction on an operator). Such a tool is
# useless to the lister, so tools/list hides it too. A scoped binding's deny
# only holds on some targets and hides nothing.

# blanket_roles: the lister's roles bound without a scope
blanket_roles contains b.role if {
	some b in caller_bindings
	count(object.get(b, "scope", {})) == 0
}

# blanket_denied(tool): a deny selector of a blanket role matches the tool
blanket_denied(tool) if {
	some [role, "deny", _], c in lister_selectors
	role in blanket_roles
	lib.compiled_matches(c, tool)
}

# --- approvers ------------------------------------------------------------------

# may_approve(approver, target): a binding of the approver whose role has
# `approve: true` applies to the target.
may_approve(approver, target) if {
	some b in bindings_for(approver)
	config.roles[b.role].approve == true
	applies(b, target)
}
