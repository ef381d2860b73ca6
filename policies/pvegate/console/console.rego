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

# METADATA
# title: Roles granting each tool
# description: |
#   Tool name -> the roles whose allow selectors match the tool and whose deny selectors
#   do not (binding scopes and guard rails aside): the console's tool catalog column. What
#   one principal sees is data.pvegate.visible_tools. Asked with a listing input.
# schemas:
#   - input: schema["list_input.schema"]
tool_roles[tool.name] := roles if {
	some tool in input.tools
	roles := {name |
		some name, _ in config.roles
		rbac.role_grants(name, tool)
		not rbac.role_denies(name, tool)
	}
}
