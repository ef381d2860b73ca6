# METADATA
# title: Role-based access control
# description: |
#   Roles (data.data.roles) grant and deny tools through selectors; bindings
#   (data.data.bindings) give roles to principals, optionally scoped to
#   clusters, nodes, pools, guest tags and vmid ranges. A call is permitted
#   when a binding that applies to the principal and the target grants the
#   tool, and no applicable binding's role denies it (deny overrides allow).
package pvegate.rbac

import data.pvegate.config
import data.pvegate.lib

# --- which bindings belong to a principal ------------------------------------

# bindings_for(principal) is the set of bindings that name the principal by
# subject, group or token role claim (and allow its kind).
bindings_for(principal) := {b |
	some b in config.bindings
	binds(b, principal)
	lib.in_list(b, "principal_kinds", principal.kind)
	is_object(config.roles[b.role])
}

binds(b, principal) if principal.sub in object.get(b, "subjects", [])

binds(b, principal) if {
	some g in object.get(b, "groups", [])
	g in object.get(principal, "groups", [])
}

binds(b, principal) if {
	some r in object.get(b, "token_roles", [])
	r in object.get(principal, "roles", [])
}

# --- does a binding's scope cover the target ---------------------------------

# scope_covers(scope, target): every constraint present in scope holds for target.
scope_covers(scope, target) if {
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

# role_grants(role, tool): some allow selector of the role matches the tool.
role_grants(role, tool) if {
	some sel in object.get(role, "allow", [])
	lib.tool_matches(sel, tool)
}

# role_denies(role, tool): some deny selector of the role matches the tool.
role_denies(role, tool) if {
	some sel in object.get(role, "deny", [])
	lib.tool_matches(sel, tool)
}

# --- the current tools/call ---------------------------------------------------

# bindings of the caller that apply to the call's target
applicable_bindings contains b if {
	some b in bindings_for(input.principal)
	applies(b, input.target)
}

# applicable bindings whose role grants the tool (and does not itself deny it)
granting_bindings contains b if {
	some b in applicable_bindings
	role := config.roles[b.role]
	role_grants(role, input.tool)
	not role_denies(role, input.tool)
}

# granting_roles: names of the roles that grant this call
granting_roles contains b.role if some b in granting_bindings

# break_glass: a break-glass role grants this call
break_glass if {
	some b in granting_bindings
	config.roles[b.role].break_glass == true
}

deny contains msg if {
	some b in applicable_bindings
	role_denies(config.roles[b.role], input.tool)
	msg := sprintf("role %q (binding %q) forbids tool %q", [b.role, object.get(b, "name", "unnamed"), input.tool.name])
}

deny contains msg if {
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

# the lister's bindings, computed once per query
lister_bindings := bindings_for(input.principal)

lister_roles contains config.roles[b.role] if some b in lister_bindings

# tool_visible(tool): some bound role grants the tool on some target.
tool_visible(tool) if {
	some role in lister_roles
	role_grants(role, tool)
	not role_denies(role, tool)
}

# --- approvers ------------------------------------------------------------------

# may_approve(approver, target): a binding of the approver whose role has
# `approve: true` applies to the target.
may_approve(approver, target) if {
	some b in bindings_for(approver)
	config.roles[b.role].approve == true
	applies(b, target)
}
