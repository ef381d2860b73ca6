# Composite tools: each leaf is granted and denied as a call of its own would be
# (package pvegate.rbac_test: the fixtures of rbac_test.rego are shared)
package pvegate.rbac_test

import data.pvegate.fixtures_test as fx
import data.pvegate.rbac

# --- a composite tool is denied wherever one of its leaves is -------------------------

docker_inspect := fx.tool("lxc_docker_inspect", "container", "read", "guest", ["docker", "ssh"])

arp_table := fx.tool("node_arp_table", "network", "read", "node", ["network", "ssh"])

composite(name, domain, scope, leaves) := object.union(
	fx.tool(name, domain, "read", scope, []),
	{"connector": "composite", "uses": leaves},
)

compose_stack := composite("inspect_compose_stack", "container", "guest", [fx.guest_config_tool, docker_inspect])

ip_check := composite("check_ip_availability", "network", "cluster", [fx.nodes_tool, arp_table])

leaf_reason(reasons, leaf) if fx.has_reason(reasons, sprintf("reads through %q", [leaf]))

# the contractors group's role forbids the leaf; the operator role grants it
contractors_roles := object.union(data.data.roles, {"restricted": {"deny": [{"tools": ["lxc_docker_inspect"]}]}})

contractors_bindings := array.concat(
	data.data.bindings,
	[{"name": "contractors-restricted", "role": "restricted", "groups": ["contractors"]}],
)

contractor_reasons(p, tool) := reasons if {
	reasons := rbac.deny with input as fx.call(p, tool, fx.prod_guest)
		with data.data.roles as contractors_roles
		with data.data.bindings as contractors_bindings
}

test_a_composite_is_denied_where_another_role_denies_a_leaf if {
	operator := object.union(fx.contractor, {"groups": []})
	count(contractor_reasons(operator, compose_stack)) == 0
	fx.has_reason(contractor_reasons(fx.contractor, docker_inspect), "role \"restricted\"")
	reasons := contractor_reasons(fx.contractor, compose_stack)
	leaf_reason(reasons, "lxc_docker_inspect")
	fx.has_reason(reasons, "role \"restricted\" forbids it")
}

test_a_composite_is_denied_where_the_granting_role_denies_a_leaf if {
	org := {
		"roles": {"r": {"allow": [{"effects": ["read"]}], "deny": [{"tools": ["lxc_docker_inspect"]}]}},
		"bindings": [{"name": "b", "role": "r", "subjects": ["mallory"]}],
	}
	reasons := rbac.deny with input as fx.call(fx.nobody, compose_stack, fx.prod_guest) with data.data as org
	leaf_reason(reasons, "lxc_docker_inspect")
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, compose_stack, fx.prod_guest)
		with data.data as json.patch(org, [{"op": "remove", "path": "/roles/r/deny"}])
}

no_arp_rule := {"name": "no-arp", "tools": ["node_arp_table"], "reason": "no neighbour tables"}

ip_check_reasons(p, rules) := reasons if {
	reasons := rbac.deny with input as fx.call(p, ip_check, fx.node_target)
		with data.data.guardrails.deny_rules as rules
}

test_a_composite_is_denied_where_a_deny_rule_matches_a_leaf if {
	count(ip_check_reasons(fx.agent, [])) == 0
	reasons := ip_check_reasons(fx.agent, [no_arp_rule])
	leaf_reason(reasons, "node_arp_table")
	fx.has_reason(reasons, "deny rule \"no-arp\" forbids it")

	# the rule's principal and target keys hold for the leaf as for a call
	count(ip_check_reasons(fx.agent, [object.union(no_arp_rule, {"principal_kinds": ["human"]})])) == 0
	count(ip_check_reasons(fx.agent, [object.union(no_arp_rule, {"principal_groups": ["contractors"]})])) == 0
	contractors_rule := object.union(no_arp_rule, {"principal_groups": ["contractors"]})
	leaf_reason(ip_check_reasons(fx.contractor, [contractors_rule]), "node_arp_table")
	count(ip_check_reasons(fx.agent, [object.union(no_arp_rule, {"target_tags": ["prod"]})])) == 0
	prod := rbac.deny with input as fx.call(fx.agent, compose_stack, fx.prod_guest)
		with data.data.guardrails.deny_rules as [{"name": "x", "tools": ["lxc_docker_inspect"], "target_tags": ["prod"]}]
	leaf_reason(prod, "lxc_docker_inspect")
}

test_a_composite_is_denied_where_a_hidden_pools_deny_holds_on_a_leaf if {
	org := json.patch(prod_fenced_org, [{"op": "add", "path": "/roles/prod-fence/deny/0/tools/-", "value": "lxc_docker_inspect"}])
	reasons := rbac.deny with input as fx.call(fx.nobody, compose_stack, hidden_guest) with data.data as org
	leaf_reason(reasons, "lxc_docker_inspect")
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, compose_stack, no_pool_guest) with data.data as org
}

test_a_leaf_without_a_name_is_still_reported if {
	nameless := object.remove(docker_inspect, ["name"])
	reasons := rbac.deny with input as fx.call(fx.agent, composite("c", "container", "guest", [nameless]), fx.prod_guest)
	leaf_reason(reasons, "(a leaf without a name)")
}

# --- a leaf called beyond the composite's target (tool.fans_out) ----------------------
# check_ip_availability reads every guest's config and every node's neighbour table on a
# cluster target: no binding's scope can be tested on those, so every deny of the leaf the
# caller is bound to holds, and only a cluster-wide binding grants it

cluster_target := object.union(fx.node_target, {"node": null, "name": null, "status": null})

ip_sweep := object.union(ip_check, {"fans_out": ["node_arp_table"]})

pve2_fenced_reasons(tool) := reasons if {
	reasons := rbac.deny with input as fx.call(fx.contractor, tool, cluster_target)
		with data.data.roles as object.union(data.data.roles, {"no-arp": {"deny": [{"tools": ["node_arp_table"]}]}})
		with data.data.bindings as array.concat(
			data.data.bindings,
			[{"name": "pve2-fence", "role": "no-arp", "groups": ["contractors"], "scope": {"nodes": ["pve2"]}}],
		)
}

test_a_scoped_deny_of_a_leaf_called_beyond_the_target_denies_the_composite if {
	# declared as on the target only, the node-scoped deny never meets the cluster target
	count(pve2_fenced_reasons(ip_check)) == 0
	reasons := pve2_fenced_reasons(ip_sweep)
	leaf_reason(reasons, "node_arp_table")
	fx.has_reason(reasons, "on every guest and node of cluster default")
	fx.has_reason(reasons, "role \"no-arp\" forbids it")
}

prod_only(tool) := [{"name": "prod-only", "tools": [tool], "target_tags": ["prod"]}]

test_a_deny_rule_on_target_tags_holds_for_a_guest_leaf_called_beyond_the_target if {
	reads := composite("check_ip_availability", "network", "cluster", [arp_table, fx.guest_config_tool])
	count(rbac.deny) == 0 with input as fx.call(fx.agent, reads, cluster_target)
		with data.data.guardrails.deny_rules as prod_only("get_guest_config")
	sweep := object.union(reads, {"fans_out": ["node_arp_table", "get_guest_config"]})
	reasons := rbac.deny with input as fx.call(fx.agent, sweep, cluster_target)
		with data.data.guardrails.deny_rules as prod_only("get_guest_config")
	leaf_reason(reasons, "get_guest_config")
	fx.has_reason(reasons, "deny rule \"prod-only\" forbids it")

	# a node has no tags: the rule never holds on the neighbour table, here or called directly
	count(rbac.deny) == 0 with input as fx.call(fx.agent, sweep, cluster_target)
		with data.data.guardrails.deny_rules as prod_only("node_arp_table")
}

test_a_pool_scoped_deny_of_a_node_leaf_never_holds if {
	# a node is in no pool: the pool's deny holds on none of the leaf's targets
	reasons := rbac.deny with input as fx.call(fx.contractor, ip_sweep, cluster_target)
		with data.data.roles as object.union(data.data.roles, {"no-arp": {"deny": [{"tools": ["node_arp_table"]}]}})
		with data.data.bindings as array.concat(
			data.data.bindings,
			[{"name": "web-fence", "role": "no-arp", "groups": ["contractors"], "scope": {"pools": ["web"]}}],
		)
	count(reasons) == 0
}

reader_org(scope) := {
	"roles": {"r": {"allow": [{"effects": ["read"]}]}},
	"bindings": [object.union({"name": "b", "role": "r", "subjects": ["mallory"]}, scope)],
}

test_a_leaf_called_beyond_the_target_needs_a_cluster_wide_grant if {
	sweep := object.union(compose_stack, {"fans_out": ["lxc_docker_inspect"]})
	web := {"scope": {"pools": ["web"]}}

	# the pool's binding grants the leaf on the pool's guest, not on every guest
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, compose_stack, fx.prod_guest) with data.data as reader_org(web)
	leaf_reason(rbac.deny, "lxc_docker_inspect") with input as fx.call(fx.nobody, sweep, fx.prod_guest)
		with data.data as reader_org(web)
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, sweep, fx.prod_guest) with data.data as reader_org({})
	count(rbac.deny) == 0 with input as fx.call(fx.nobody, sweep, fx.prod_guest)
		with data.data as reader_org({"scope": {"clusters": ["default"]}})
}

test_a_deny_fencing_another_cluster_does_not_reach_the_leaf if {
	reasons := rbac.deny with input as fx.call(fx.contractor, ip_sweep, cluster_target)
		with data.data.roles as object.union(data.data.roles, {"no-arp": {"deny": [{"tools": ["node_arp_table"]}]}})
		with data.data.bindings as array.concat(
			data.data.bindings,
			[{"name": "other-fence", "role": "no-arp", "groups": ["contractors"], "scope": {"clusters": ["other"]}}],
		)
	count(reasons) == 0
}
