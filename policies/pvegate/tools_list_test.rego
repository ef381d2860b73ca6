package pvegate_test

import data.pvegate
import data.pvegate.fixtures_test as fx
import data.pvegate.guardrails
import data.pvegate.rbac

catalog := [
	fx.vm_stop, fx.lxc_start, fx.guest_delete, fx.guest_migrate, fx.snapshot_delete, fx.guest_exec,
	fx.guest_config_tool, fx.nodes_tool, fx.token_perms_tool, fx.node_network_update, fx.access_user_update,
]

visible(p) := v if {
	v := pvegate.visible_tools with input as fx.listing_input(p, catalog)
}

test_viewer_sees_reads_only if {
	visible(fx.viewer) == {"get_guest_config", "list_nodes"}
}

test_operator_agent if {
	visible(fx.agent) == {"get_guest_config", "list_nodes", "lxc_start", "snapshot_delete", "vm_stop"}
}

test_admin_sees_everything if {
	visible(fx.admin) == {t.name | some t in catalog}
}

test_agent_never_sees_node_mutations if {
	# an agent with the admin role still does not see node-scope mutations or access changes
	a := object.union(fx.agent, {"groups": ["pve-admins"]})
	org_admin_any := [{"name": "a", "role": "admin", "groups": ["pve-admins"]}]
	v := pvegate.visible_tools with input as fx.listing_input(a, catalog) with data.data.bindings as org_admin_any
	not "node_network_update" in v
	not "access_user_update" in v
	"guest_exec" in v
}

test_unbound_principal_sees_nothing if {
	count(visible(fx.nobody)) == 0
}

test_list_bad_input_shows_nothing if {
	count(pvegate.visible_tools) == 0 with input as object.union(fx.listing_input(fx.admin, catalog), {"kind": "call"})
	count(pvegate.visible_tools) == 0 with input as json.remove(fx.listing_input(fx.admin, catalog), ["tools"])
	count(pvegate.visible_tools) == 0 with input as object.union(fx.listing_input(fx.admin, catalog), {"contract_version": 7})
}

test_empty_data_lists_nothing if {
	count(pvegate.visible_tools) == 0 with input as fx.listing_input(fx.admin, catalog) with data.data as {}
}

# The listing works on sets of tools; for every principal and role set below it
# must list exactly the tools the full per-tool test admits.
# (evaluate it with the listing as input)
# (a composite tool also needs each of its leaves to pass it: composite.rego)
per_tool(tools) := {t.name |
	some t in tools
	per_tool_visible(t)
	every leaf in object.get(t, "uses", []) {
		per_tool_visible(leaf)
	}
	every leaf in object.get(t, "uses", []) {
		fan_out_visible(t, leaf)
	}
}

# a leaf the composite calls beyond its target (fans_out) is decided with no scope to test
fan_out_visible(t, leaf) if not rbac.fans_out(t, leaf)

fan_out_visible(t, leaf) if {
	rbac.fans_out(t, leaf)
	rbac.fan_out_listable(leaf)
}

per_tool_visible(t) if {
	rbac.tool_visible(t)
	not guardrails.hidden_from_list(t)
	not rbac.blanket_denied(t)
}

# roles whose selectors look at tags, at names only, or at neither
mixed_roles := {
	"tagged": {"allow": [{"effects": ["*"], "tool_tags": ["power"]}], "deny": [{"tool_tags": ["ssh"]}]},
	"named": {"allow": [{"effects": ["read", "write"]}], "deny": [{"tools": ["vm_*", "list_nodes"]}]},
	"blocked": {"allow": [{"domains": ["guest"]}], "deny": [{"tools": ["*"]}]},
	"narrow": {"allow": [{"effects": ["destroy"], "tools": ["snapshot_*"]}]},
	"tagdeny": {"allow": [{"domains": ["guest"]}], "deny": [{"tool_tags": ["power"]}]},
}

mixed_bindings := [{"name": name, "role": name, "groups": [name]} | some name, _ in mixed_roles]

mixed_deny_rules := [
	{"name": "no-agent-network", "domains": ["network"], "principal_kinds": ["agent"]},
	{"name": "no-ssh", "effects": ["exec"], "tool_tags": ["ssh"]},
]

test_listing_agrees_with_per_tool_test if {
	every p in [fx.agent, fx.viewer, fx.admin, fx.web_dev, fx.planner, fx.nobody] {
		visible(p) == per_tool(catalog) with input as fx.listing_input(p, catalog)
	}
	every groups in [
		["tagged", "blocked"], ["named"], ["narrow", "tagdeny"], ["named", "narrow"],
		["tagged", "named"], ["narrow", "blocked"], ["tagdeny", "named"], ["tagged", "tagdeny"],
	] {
		every kind in ["agent", "human"] {
			p := fx.principal("x", kind, [], groups)
			v := pvegate.visible_tools with input as fx.listing_input(p, catalog)
				with data.data.roles as mixed_roles
				with data.data.bindings as mixed_bindings
				with data.data.guardrails.deny_rules as mixed_deny_rules
			v == per_tool(catalog) with input as fx.listing_input(p, catalog)
				with data.data.roles as mixed_roles
				with data.data.bindings as mixed_bindings
				with data.data.guardrails.deny_rules as mixed_deny_rules
		}
	}
}

# Many tools of one (effect, domain, scope), a glob that
# two deny selectors repeat, and a tool without an effect (in no shape: never
# listed): the listing still agrees with the per-tool test.
test_listing_of_a_crowded_shape_agrees_with_per_tool_test if {
	crowd := [object.union(fx.nodes_tool, {"name": sprintf("synthetic_read_%d", [i])}) | some i in numbers.range(1, 30)]
	shapeless := json.remove(object.union(fx.nodes_tool, {"name": "shapeless"}), ["effect"])
	tools := array.flatten([catalog, crowd, [shapeless]])
	roles := object.union(mixed_roles, {"named": {
		"allow": [{"effects": ["read", "write"]}],
		"deny": [{"tools": ["synthetic_read_1*", "vm_*"]}, {"tools": ["synthetic_read_1*"]}],
	}})
	every groups in [["named"], ["named", "tagged"], ["blocked"]] {
		p := fx.principal("x", "human", [], groups)
		v := pvegate.visible_tools with input as fx.listing_input(p, tools)
			with data.data.roles as roles
			with data.data.bindings as mixed_bindings
		v == per_tool(tools) with input as fx.listing_input(p, tools)
			with data.data.roles as roles
			with data.data.bindings as mixed_bindings
	}
	v := pvegate.visible_tools with input as fx.listing_input(fx.principal("x", "human", [], ["named"]), tools)
		with data.data.roles as roles
		with data.data.bindings as mixed_bindings
	"synthetic_read_2" in v
	"synthetic_read_30" in v
	"list_nodes" in v
	not "synthetic_read_1" in v
	not "synthetic_read_13" in v
	not "shapeless" in v
}

# --- listing follows denial -------------------------------------------------------

network_catalog := array.concat(catalog, [fx.node_network_read])

test_group_deny_rule_hides_the_tool_from_an_operator if {
	# the example data denies get_node_network to the contractors group
	operator := object.union(fx.contractor, {"groups": []})
	"get_node_network" in pvegate.visible_tools with input as fx.listing_input(operator, network_catalog)
	v := pvegate.visible_tools with input as fx.listing_input(fx.contractor, network_catalog)
	not "get_node_network" in v
	"get_guest_config" in v
}

test_group_deny_rule_denies_the_call if {
	d := pvegate.decision with input as fx.call(fx.contractor, fx.node_network_read, fx.node_target)
	d.allow == false
	{r.code | some r in d.deny_reasons} == {"guardrail.deny_rule"}
	some r in d.deny_reasons
	r.rule == "data.guardrails.deny_rules[contractors-no-node-network]"
	operator := object.union(fx.contractor, {"groups": []})
	d_operator := pvegate.decision with input as fx.call(operator, fx.node_network_read, fx.node_target)
	d_operator.allow == true
}

restricted_roles := object.union(data.data.roles, {"restricted": {"deny": [{"tools": ["get_node_network"]}]}})

restricted_binding(scope) := array.concat(
	data.data.bindings,
	[object.union({"name": "contractors-restricted", "role": "restricted", "groups": ["contractors"]}, scope)],
)

test_unscoped_role_deny_hides_what_another_role_grants if {
	# operator grants the read, the contractors group's role denies it on every target
	v := pvegate.visible_tools with input as fx.listing_input(fx.contractor, network_catalog)
		with data.data.roles as restricted_roles
		with data.data.bindings as restricted_binding({})
		with data.data.guardrails.deny_rules as []
	not "get_node_network" in v
	"get_guest_config" in v
	d := pvegate.decision with input as fx.call(fx.contractor, fx.node_network_read, fx.node_target)
		with data.data.roles as restricted_roles
		with data.data.bindings as restricted_binding({})
		with data.data.guardrails.deny_rules as []
	{r.code | some r in d.deny_reasons} == {"rbac.role_denies"}
}

test_scoped_role_deny_hides_nothing if {
	# denied only on pool web's guests: the tool stays useful elsewhere, so it is listed
	v := pvegate.visible_tools with input as fx.listing_input(fx.contractor, network_catalog)
		with data.data.roles as restricted_roles
		with data.data.bindings as restricted_binding({"scope": {"pools": ["web"]}})
		with data.data.guardrails.deny_rules as []
	"get_node_network" in v
}

test_blanket_deny_by_tag_and_by_any_name if {
	by_tag := object.union(data.data.roles, {"restricted": {"deny": [{"tool_tags": ["network"]}]}})
	v := pvegate.visible_tools with input as fx.listing_input(fx.contractor, network_catalog)
		with data.data.roles as by_tag
		with data.data.bindings as restricted_binding({})
		with data.data.guardrails.deny_rules as []
	not "get_node_network" in v
	"get_guest_config" in v
	all_network := object.union(data.data.roles, {"restricted": {"deny": [{"domains": ["network"]}]}})
	w := pvegate.visible_tools with input as fx.listing_input(fx.contractor, network_catalog)
		with data.data.roles as all_network
		with data.data.bindings as restricted_binding({})
		with data.data.guardrails.deny_rules as []
	not "get_node_network" in w
	"list_nodes" in w
}

# --- a composite tool is listed only where its leaves could be called -------------------
# (the decision denies a composite wherever a leaf is denied or not granted: composite.rego)

docker_leaf := fx.tool("lxc_docker_inspect", "container", "read", "guest", ["docker", "ssh"])

compose_stack := object.union(
	fx.tool("inspect_compose_stack", "container", "read", "guest", []),
	{"connector": "composite", "uses": [fx.guest_config_tool, docker_leaf]},
)

composite_catalog := array.concat(catalog, [docker_leaf, compose_stack])

# the contractors group's role denies the docker leaf, bound with `scope`
leaf_denied_visible(scope, rules) := listed_for(fx.contractor, scope, rules)

listed_for(p, scope, rules) := v if {
	v := pvegate.visible_tools with input as fx.listing_input(p, composite_catalog)
		with data.data.roles as object.union(data.data.roles, {"restricted": {"deny": [{"tools": ["lxc_docker_inspect"]}]}})
		with data.data.bindings as restricted_binding(scope)
		with data.data.guardrails.deny_rules as rules
}

test_a_composite_whose_leaf_is_denied_everywhere_is_hidden if {
	operator := object.union(fx.contractor, {"groups": []})
	"inspect_compose_stack" in pvegate.visible_tools with input as fx.listing_input(operator, composite_catalog)
		with data.data.guardrails.deny_rules as []

	# a role bound without a scope denies the leaf: the composite is denied on every target
	v := leaf_denied_visible({}, [])
	not "lxc_docker_inspect" in v
	not "inspect_compose_stack" in v
	"get_guest_config" in v

	# so does a deny rule that ignores the target
	w := leaf_denied_visible({"scope": {"pools": ["web"]}}, [{"name": "no-docker", "tools": ["lxc_docker_inspect"]}])
	not "inspect_compose_stack" in w

	# a leaf no role of the lister grants: denied on every target too
	viewer_only := pvegate.visible_tools with input as fx.listing_input(fx.viewer, composite_catalog)
		with data.data.roles.viewer as {"allow": [{"tools": ["get_guest_config", "inspect_compose_stack"]}]}
	viewer_only == {"get_guest_config"}

	# and the decision agrees: the call is denied
	d := pvegate.decision with input as fx.call(fx.contractor, compose_stack, fx.prod_guest)
		with data.data.roles as object.union(data.data.roles, {"restricted": {"deny": [{"tools": ["lxc_docker_inspect"]}]}})
		with data.data.bindings as restricted_binding({})
		with data.data.guardrails.deny_rules as []
	d.allow == false
	"rbac.composite_leaf_not_granted" in {r.code | some r in d.deny_reasons}
}

test_a_composite_whose_leaf_is_denied_in_one_pool_is_listed if {
	# denied only on pool web's guests: callable elsewhere, so listed
	v := leaf_denied_visible({"scope": {"pools": ["web"]}}, [])
	"lxc_docker_inspect" in v
	"inspect_compose_stack" in v
}

test_listing_of_composites_agrees_with_per_tool_test if {
	every scope in [{}, {"scope": {"pools": ["web"]}}] {
		every p in [fx.contractor, fx.agent, fx.viewer, fx.admin] {
			every tools in [composite_catalog, sweep_catalog] {
				listed_for_catalog(p, scope, [], tools) == per_tool(tools) with input as fx.listing_input(p, tools)
					with data.data.roles as object.union(data.data.roles, {"restricted": {"deny": [{"tools": ["lxc_docker_inspect"]}]}})
					with data.data.bindings as restricted_binding(scope)
					with data.data.guardrails.deny_rules as []
			}
		}
	}
}

# --- a composite calling a leaf beyond its target (fans_out) ----------------------------
# (no scope can be tested there: a scoped deny of the leaf denies it on every target)

compose_sweep := object.union(compose_stack, {"name": "compose_sweep", "fans_out": ["lxc_docker_inspect"]})

sweep_catalog := array.concat(composite_catalog, [compose_sweep])

listed_for_catalog(p, scope, rules, tools) := v if {
	v := pvegate.visible_tools with input as fx.listing_input(p, tools)
		with data.data.roles as object.union(data.data.roles, {"restricted": {"deny": [{"tools": ["lxc_docker_inspect"]}]}})
		with data.data.bindings as restricted_binding(scope)
		with data.data.guardrails.deny_rules as rules
}

test_a_composite_calling_a_leaf_beyond_its_target_is_hidden_by_a_scoped_deny if {
	v := listed_for_catalog(fx.contractor, {"scope": {"pools": ["web"]}}, [], sweep_catalog)
	"inspect_compose_stack" in v # the leaf on the target only: callable outside pool web
	not "compose_sweep" in v

	# nor is it listed under a deny rule that names the leaf on tagged guests only
	w := listed_for_catalog(
		object.union(fx.contractor, {"groups": []}), {}, [{"name": "x", "tools": ["lxc_docker_inspect"], "target_tags": ["prod"]}],
		sweep_catalog,
	)
	"inspect_compose_stack" in w
	not "compose_sweep" in w

	# with nothing denying the leaf, it is listed
	"compose_sweep" in listed_for_catalog(object.union(fx.contractor, {"groups": []}), {}, [], sweep_catalog)
}

# a deny fencing another cluster holds on none of this cluster's guests (rbac composite.rego
# leaf_deny_roles): the composite is callable here, so the listing shows it
test_a_composite_calling_a_leaf_beyond_its_target_is_listed_despite_another_clusters_fence if {
	every scope in [{"clusters": ["other"]}, {"clusters": ["other"], "nodes": ["pve1"]}] {
		"compose_sweep" in listed_for_catalog(fx.contractor, {"scope": scope}, [], sweep_catalog)
	}
}

# A leaf is answered from the listing's own sets when the input lists it as a
# tool with the same view; otherwise (not in the catalog sent, or sent with
# another view) it is tested on its own, and the answers agree either way.
listed_in(p, scope, tools) := v if {
	v := pvegate.visible_tools with input as fx.listing_input(p, tools)
		with data.data.roles as object.union(data.data.roles, {"restricted": {"deny": [{"tools": ["lxc_docker_inspect"]}]}})
		with data.data.bindings as restricted_binding(scope)
		with data.data.guardrails.deny_rules as []
}

per_tool_in(p, scope, tools) := v if {
	v := per_tool(tools) with input as fx.listing_input(p, tools)
		with data.data.roles as object.union(data.data.roles, {"restricted": {"deny": [{"tools": ["lxc_docker_inspect"]}]}})
		with data.data.bindings as restricted_binding(scope)
		with data.data.guardrails.deny_rules as []
}

# the docker leaf as the composite names it, and as a tool with another view
other_view_leaf := object.union(docker_leaf, {"tags": ["docker"]})

test_a_leaf_not_listed_as_itself_is_tested_on_its_own if {
	without_leaf := array.concat(catalog, [compose_stack])

	# denied wherever the contractor calls it: hidden; denied only in pool web: listed
	not "inspect_compose_stack" in listed_in(fx.contractor, {}, without_leaf)
	"inspect_compose_stack" in listed_in(fx.contractor, {"scope": {"pools": ["web"]}}, without_leaf)
	other_view := array.concat(catalog, [other_view_leaf, compose_stack])
	not "inspect_compose_stack" in listed_in(fx.contractor, {}, other_view)

	every tools in [without_leaf, other_view] {
		every scope in [{}, {"scope": {"pools": ["web"]}}] {
			every p in [fx.contractor, fx.agent, fx.viewer, fx.admin] {
				listed_in(p, scope, tools) == per_tool_in(p, scope, tools)
			}
		}
	}
}
