# Composite tools (part of RBAC; the package's METADATA is in rbac.rego).
# A composite tool (input.tool.uses) reads through leaf tools the gateway calls on the
# caller's behalf: it must be no way around what the caller may call directly. It is
# granted only where an applicable role grants each leaf, and denied wherever a leaf is
# denied: by a role whose deny holds on the target (hidden pools included, as for a call)
# or by a deny rule of data.guardrails.deny_rules.
#
# A leaf the composite calls on guests or nodes other than its own target (input.tool.fans_out:
# check_ip_availability reads every guest's config) has no one target a scope could be tested
# on: only a binding covering the whole cluster grants it, and every binding of the caller's
# whose role denies it, whatever its scope, and every deny rule naming it, whatever its
# target_tags, denies the composite.
package pvegate.rbac

import data.pvegate.config
import data.pvegate.lib

# a composite tool reads through leaf tools: it is granted only where each leaf is, and denied
# where any leaf is (by a role or a deny rule), as each leaf called on its own would be
denials contains lib.reason("rbac.composite_leaf_not_granted", "pvegate.rbac.leaf_granted", msg) if {
	some leaf in object.get(input.tool, "uses", [])
	not leaf_granted(leaf)
	msg := sprintf(
		"composite tool %q reads through %q on %s, which %s",
		[input.tool.name, leaf_name(leaf), leaf_reach_text(leaf), leaf_refusal(leaf)],
	)
}

# leaf_granted(leaf): an applicable role grants the leaf, and nothing that would deny the leaf
# called on its own denies it: neither a role whose deny holds here (deny_roles, hidden pools
# included) nor a deny rule of data.guardrails.deny_rules
leaf_granted(leaf) if {
	count(leaf_denied_by(leaf)) == 0
	some name in leaf_roles(leaf)
	role_grants(name, leaf)
}

# fans_out(tool, leaf): the composite tool calls the leaf beyond its own target
fans_out(tool, leaf) if leaf.name in object.get(tool, "fans_out", [])

# leaf_roles(leaf): the roles that may grant the leaf: those applicable on the target, or for
# a leaf called beyond it, those of bindings covering the target's whole cluster
leaf_roles(leaf) := {b.role |
	some b in caller_bindings
	applies(b, {"cluster": input.target.cluster})
} if {
	fans_out(input.tool, leaf)
} else := applicable_roles

# leaf_deny_roles(leaf): the roles whose denies hold for the leaf: those holding on the target,
# or for a leaf called beyond it, those of every binding of the caller's that may hold on one
# of the leaf's targets
leaf_deny_roles(leaf) := {b.role |
	some b in caller_bindings
	may_hold_on(b, leaf)
	attr_listed(object.get(b, "scope", {}), "clusters", input.target, "cluster") # not another cluster's fence
} if {
	fans_out(input.tool, leaf)
} else := deny_roles

# may_hold_on(b, leaf): the binding's scope can cover a target of the leaf's scope: a node or
# a storage has no pool, tags or vmid, so a binding scoped by those never holds on one (a key
# not listed here may: it counts)
may_hold_on(b, leaf) if {
	keys := object.keys(object.get(b, "scope", {}))
	count(keys & object.get(unmet_scope_keys, leaf.scope, set())) == 0
}

unmet_scope_keys := {
	"node": {"pools", "guest_tags", "vmids"},
	"storage": {"pools", "guest_tags", "vmids"},
	"cluster": {"nodes", "pools", "guest_tags", "vmids"},
}

# leaf_rule(rule, leaf): a deny rule as it holds for the leaf: beyond the target, a guest
# leaf's rule holds whatever the guests' tags (the composite reads every guest)
leaf_rule(rule, leaf) := object.remove(rule, ["target_tags"]) if {
	fans_out(input.tool, leaf)
	leaf.scope == "guest"
} else := rule

# leaf_denied_by(leaf): what forbids the leaf (for the composite's denial message)
leaf_denied_by(leaf) := {sprintf("role %q", [name]) |
	some name in leaf_deny_roles(leaf)
	role_denies(name, leaf)
} | {sprintf("deny rule %q", [object.get(rule, "name", "unnamed")]) |
	some rule in config.deny_rules
	lib.call_matches(leaf_rule(rule, leaf), input.principal, leaf, input.target)
}

# leaf_name(leaf): the leaf's name, for messages (a leaf without one still denies the composite)
leaf_name(leaf) := n if {
	n := leaf.name
	is_string(n)
} else := "(a leaf without a name)"

# leaf_refusal(leaf): why the principal may not use the leaf, for messages
leaf_refusal(leaf) := sprintf("%s forbids it", [concat(" and ", sort(why))]) if {
	why := leaf_denied_by(leaf)
	count(why) > 0
} else := sprintf("no role of principal %q permits it", [input.principal.sub])

# leaf_reach_text(leaf): where the composite calls the leaf, for messages
leaf_reach_text(leaf) := sprintf("every guest and node of cluster %v (not only %s)", [input.target.cluster, target_text]) if {
	fans_out(input.tool, leaf)
} else := target_text

# fan_out_listable(leaf): for tools/list (no target yet), whether a composite calling the leaf
# beyond its target could be granted anywhere: a binding of the caller's covering whole
# clusters grants the leaf, and nothing of leaf_denied_by beyond a target denies it
fan_out_listable(leaf) if {
	not fan_out_denied(leaf)
	some b in caller_bindings
	count(object.keys(object.get(b, "scope", {})) - {"clusters"}) == 0
	role_grants(b.role, leaf)
}

# (a binding fencing named clusters denies only there, as leaf_deny_roles says: a cluster
# elsewhere escapes it, so the listing, which knows no cluster yet, does not hide for it)
fan_out_denied(leaf) if {
	some b in caller_bindings
	may_hold_on(b, leaf)
	not "clusters" in object.keys(object.get(b, "scope", {}))
	role_denies(b.role, leaf)
}

# (a deny rule without target_tags that matches the leaf needs no clause here: it hides the
# leaf from the listing, guardrails.hidden_from_list, and so its composites, tools_list.leaf_hidden)
fan_out_denied(leaf) if {
	leaf.scope == "guest"
	some rule in config.deny_rules
	lib.call_matches(object.remove(rule, ["target_tags"]), input.principal, leaf, {})
}
