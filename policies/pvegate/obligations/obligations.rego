# METADATA
# title: Obligations
# description: |
#   What the gateway must do when it runs an allowed call: force a dry run for
#   roles that may only plan, redact output fields, cap list lengths, and say
#   whether a secret Proxmox shows once may reach the caller.
# schemas:
#   - input: schema["decision_input.schema"]
package pvegate.obligations

import data.pvegate.config
import data.pvegate.lib
import data.pvegate.rbac

# forced_dry_run: the call mutates and every role that grants it is plan-only.
forced_dry_run if {
	input.tool.effect in lib.mutating_effects
	count(rbac.granting_bindings) > 0
	every b in rbac.granting_bindings {
		config.roles[b.role].plan_only == true
	}
}

# dry_run: the call runs as a dry run, because the caller asked or a role forces it.
default dry_run := false

dry_run if input.dry_run == true

dry_run if forced_dry_run

# redact: output paths to blank out, from every redaction entry whose tool glob matches.
redact := sort(redact_paths)

# (a partial rule, not a comprehension: partially evaluated with the data, the
# entries naming one tool become rules that OPA's rule index picks by tool name)
redact_paths contains path if {
	some pattern, paths in config.redact
	literal_pattern(pattern)
	input.tool.name == pattern
	some path in paths
}

redact_paths contains path if {
	some pattern, paths in config.redact
	not literal_pattern(pattern)
	glob.match(pattern, null, input.tool.name)
	some path in paths
}

# literal_pattern(p): p has no glob syntax, so it matches exactly the name p
literal_pattern(p) if regex.match(`^[^*?\[\]{}\\]*$`, p)

# max_items: the most generous limit among the granting roles (roles are
# additive); the data's default when none grants or none sets one.
max_items := max(granted_max_items) if count(rbac.granting_bindings) > 0

max_items := config.default_max_items if count(rbac.granting_bindings) == 0

# the limits of the roles granting this call (a rule, not a comprehension, so
# that partial evaluation puts the role_max_items constant in it)
granted_max_items contains object.get(role_max_items, b.role, 0) if some b in rbac.granting_bindings

# role_max_items: each role's limit (data only: a constant once partially
# evaluated; granting roles are objects, see rbac.caller_bindings)
role_max_items[name] := object.get(role, "max_items", config.default_max_items) if {
	some name, role in config.roles
	is_object(role)
}

# reveal_secrets: the caller may receive a secret Proxmox shows once (a new API
# token's value), because a reveal_secrets selector in data matches the call
# (looked up by the call's effect, principal kind and tool name, or "*", as in
# approval.matching_rules)
default reveal_secrets := false

reveal_secrets if {
	some i in reveal_index[input.tool.effect][input.principal.kind][input.tool.name]
	lib.index_hit_on_target(reveal_exact[i], config.reveal_secrets[i])
}

reveal_secrets if {
	some i in reveal_index[input.tool.effect][input.principal.kind]["*"]
	lib.index_hit_on_target(reveal_exact[i], config.reveal_secrets[i])
}

# the reveal_secrets selectors by the effects, principal kinds and tool names they
# can match (lib.index_names)
reveal_index[effect][kind][name] contains i if {
	some i, sel in config.reveal_secrets
	some effect in lib.effects
	some kind in lib.principal_kinds
	lib.admits_call_kind(sel, effect, kind)
	some name in lib.index_names(sel)
}

reveal_exact[i] := lib.exact_selector(sel) if some i, sel in config.reveal_secrets

result := {
	"dry_run": dry_run,
	"redact": redact,
	"max_items": max_items,
	"reveal_secrets": reveal_secrets,
}
