# The admin console's sections a signed-in person may open.
#
# Entry point data.pvegate.console.sections, asked with a listing input (the principal as the
# gateway maps it from the person's token): the union of the `console` lists of the roles bound
# to the principal (binding scopes do not apply: a section is not about one target). Nothing
# bound, nothing open. Whether the person may vote on a request is still data.pvegate.approver.
package pvegate.console

import data.pvegate.config
import data.pvegate.rbac

bound_roles contains b.role if some b in rbac.bindings_for(input.principal)

# METADATA
# title: Console sections
# description: |
#   Set of section names (approvals, audit, policy) the principal may open. Asked once
#   per console page: not an optimiser entrypoint (gateway/policy/optimized.py).
# schemas:
#   - input: schema["list_input.schema"]
sections contains s if {
	some r in bound_roles
	some s in object.get(config.roles, [r, "console"], [])
}
