# pvegate tools/list.
#
# Entry point data.pvegate.visible_tools: the names of the tools a principal
# may see. A tool is visible when some role bound to the principal grants
# it on some target (binding scopes are not applied: no target is known
# yet) and no target-independent guard rail forbids it to the principal.
package pvegate

import data.pvegate.guardrails
import data.pvegate.rbac

listing_problems contains msg if some msg in input_problems

listing_problems contains msg if {
	is_object(input)
	object.get(input, "kind", null) != "list"
	msg := sprintf("input kind must be \"list\" for this entry point, got %v", [object.get(input, "kind", null)])
}

listing_problems contains "input.tools must be an array" if not tools_ok

tools_ok if is_array(input.tools)

# METADATA
# title: Visible tools for tools/list
# description: Set of tool names (a JSON array over the REST API).
# entrypoint: true
visible_tools contains tool.name if {
	count(listing_problems) == 0
	some tool in input.tools
	shape := [tool.effect, tool.domain, tool.scope]
	rbac.tool_visible(tool, shape)
	not guardrails.hidden_from_list(tool, shape)
}
