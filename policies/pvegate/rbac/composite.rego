# Composite tools (part of RBAC; the package's METADATA is in rbac.rego).
# A composite tool (input.tool.uses) reads through leaf tools the gateway calls on the
# caller's behalf: it must be no way around what the caller may call directly. It is
# granted only where an applicable role grants each leaf, and denied wherever a leaf is
# denied: by a role whose deny holds on the target (hidden pools included, as for a call)
# or by a deny rule of data.guardrails.deny_rules.
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
		[input.tool.name, leaf_name(leaf), target_text, leaf_refusal(leaf)],
	)
}

# leaf_granted(leaf): an applicable role grants the leaf, and nothing that would deny the leaf
# called on its own denies it: neither a role whose deny holds here (deny_roles, hidden pools
# included) nor a deny rule of data.guardrails.deny_rules
leaf_granted(leaf) if {
	count(leaf_denied_by(leaf)) == 0
	some name in applicable_roles
	role_grants(name, leaf)
}

# leaf_denied_by(leaf): what forbids the leaf (for the composite's denial message)
leaf_denied_by(leaf) := {sprintf("role %q", [name]) |
	some name in deny_roles
	role_denies(name, leaf)
} | {sprintf("deny rule %q", [object.get(rule, "name", "unnamed")]) |
	some rule in config.deny_rules
	lib.call_matches(rule, input.principal, leaf, input.target)
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
