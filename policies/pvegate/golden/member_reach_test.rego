# The golden cases of calls reaching guests through target.members and tool.fans_out, decided
# with policy data the shipped data lacks (scoped denies, rules and waivers on tags), which a
# golden case cannot carry. tests/policy/test_s50_member_reach_optimized.py asks the same of
# the plain and the optimised policy.
package pvegate.golden_test

move := data.golden.admin_moves_prod_guest_into_another_pool_needs_approval.input

ha_rule := data.golden.admin_creates_ha_rule_on_prod_guest_needs_approval.input

ip_check := data.golden.operator_agent_checks_ip_availability.input

lab_guest := {"vmid": 103, "node": "pve2", "pool": "lab", "pool_known": true, "tags": ["dev"], "exists": true}

move_lab := json.patch(move, [{"op": "replace", "path": "/target/members/guests", "value": [lab_guest]}])

fence(name, role, group, scope) := {"name": name, "role": role, "groups": [group], "scope": scope}

deny_roles := {
	"no-moves": {"description": "d", "deny": [{"tools": ["pool_members_add", "ha_rule_create"]}]},
	"no-config-reads": {"description": "d", "deny": [{"tools": ["get_guest_stored_config"]}]},
}

web_deny := {
	"name": "no-web-moves", "tools": ["pool_members_add"], "target_tags": ["web"],
	"principal_groups": ["web-guard"], "reason": "web guests stay",
}

web_rule := {
	"name": "ha-on-web", "tools": ["ha_rule_create"], "target_tags": ["web"],
	"principal_groups": ["web-approve"], "reason": "HA on web", "approver_groups": ["sre-leads"],
}

dev_waiver := {"name": "dev-waiver", "active": true, "target_tags": ["dev"], "principal_groups": ["waived"], "reason": "w"}

extra := json.patch(data.data, [
	{"op": "add", "path": "/roles/no-moves", "value": deny_roles["no-moves"]},
	{"op": "add", "path": "/roles/no-config-reads", "value": deny_roles["no-config-reads"]},
	{"op": "add", "path": "/bindings/-", "value": fence("prod-fence", "no-moves", "fenced", {"pools": ["prod"]})},
	{"op": "add", "path": "/bindings/-", "value": fence("pve3-fence", "no-moves", "fenced-pve3", {"nodes": ["pve3"]})},
	{"op": "add", "path": "/bindings/-", "value": fence("c", "no-config-reads", "no-prod-configs", {"pools": ["prod"]})},
	{"op": "add", "path": "/guardrails/deny_rules/-", "value": web_deny},
	{"op": "add", "path": "/approval/rules/-", "value": web_rule},
	{"op": "add", "path": "/approval/waivers/-", "value": dev_waiver},
])

# in_group(doc, group): the call by its principal with one more group
in_group(doc, group) := json.patch(doc, [{"op": "add", "path": "/principal/groups/-", "value": group}])

codes(d) := {r.code | some r in d.deny_reasons}

decide(doc) := d if {
	d := data.pvegate.decision with input as doc with data.data as extra
}

test_a_pool_scoped_deny_holds_on_a_member_of_its_pool_only if {
	"rbac.role_denies" in codes(decide(in_group(move, "fenced")))
	count(decide(in_group(move_lab, "fenced")).deny) == 0
}

test_a_scoped_deny_holds_on_members_not_known if {
	unknown := json.patch(move, [{"op": "replace", "path": "/target/members", "value": {"known": false, "guests": []}}])
	"rbac.role_denies" in codes(decide(in_group(unknown, "fenced")))
	"rbac.role_denies" in codes(decide(in_group(unknown, "fenced-pve3")))
}

test_a_node_scoped_deny_holds_on_an_ha_rule_the_ha_manager_places if {
	"rbac.role_denies" in codes(decide(in_group(ha_rule, "fenced-pve3")))
}

test_a_pool_scoped_deny_on_a_fanned_out_leaf_denies_the_composite if {
	decide(ip_check).allow
	codes(decide(in_group(ip_check, "no-prod-configs"))) == {"rbac.composite_leaf_not_granted"}
}

test_restricting_target_tags_hold_on_a_member if {
	"guardrail.deny_rule" in codes(decide(in_group(move, "web-guard")))
	count(decide(in_group(move_lab, "web-guard")).deny) == 0
	d := decide(in_group(ha_rule, "web-approve"))
	"approval.rule" in {r.code | some r in d.approval.reasons}
	d.approval.approver_groups == ["sre-leads"]
}

test_a_waiver_is_not_widened_by_a_member_tag if {
	decide(in_group(move_lab, "waived")).approval.required
	decide(in_group(ha_rule, "waived")).approval.required
}

# reveal_secrets permits: a member's tag never widens it, the target's own tag does
test_a_secret_is_not_revealed_by_a_member_tag if {
	sel := {"name": "dev-moves", "tools": ["pool_members_add"], "target_tags": ["dev"]}
	org := json.patch(data.data, [{"op": "add", "path": "/obligations/reveal_secrets/-", "value": sel}])
	not data.pvegate.obligations.reveal_secrets with input as move_lab with data.data as org
	tagged := json.patch(move_lab, [{"op": "replace", "path": "/target/tags", "value": ["dev"]}])
	data.pvegate.obligations.reveal_secrets with input as tagged with data.data as org
}
