package pvegate.resources_test

import data.pvegate.config
import data.pvegate.fixtures_test as fx
import data.pvegate.resources

provisioner := fx.principal("prov-agent", "agent", ["provisioner"], [])

vm_create := object.union(fx.tool("vm_create", "guest", "write", "guest", ["provision"]), {"allocates": true})

new_guest(pool) := object.union(fx.guest(180, [], pool, null), {"status": null})

amounts(guests, cores, mem, disk) := {"guests": guests, "cores": cores, "memory_mib": mem, "disk_gib": disk}

create(p, pool, requested, usage) := object.union(
	fx.call(p, vm_create, new_guest(pool)),
	{"resources": {"requested": requested, "pool": pool, "pool_usage": usage}},
)

small := amounts(1, 4, 8192, 32)

sandbox_usage := amounts(3, 8, 16384, 96)

test_within_quota_is_allowed if {
	inp := create(provisioner, "sandbox", small, sandbox_usage)
	count(resources.deny) == 0 with input as inp
	data.pvegate.decision.allow with input as inp
}

test_per_guest_limit if {
	inp := create(provisioner, "sandbox", amounts(1, 8, 4096, 8), sandbox_usage)
	fx.has_reason(resources.deny, "resource quota \"provisioners-in-sandbox\": the call asks for 8 cores") with input as inp
	not data.pvegate.decision.allow with input as inp
}

test_pool_total_limit if {
	inp := create(provisioner, "sandbox", small, amounts(10, 8, 16384, 96))
	fx.has_reason(resources.deny, "pool sandbox holds 10 guests and the call adds 1, over its limit of 10") with input as inp
}

test_pool_total_names_what_calls_in_flight_hold if {
	base := create(provisioner, "sandbox", small, amounts(10, 8, 16384, 96))
	inp := json.patch(base, [{"op": "add", "path": "/resources/pool_in_flight", "value": amounts(2, 0, 0, 0)}])
	msg := "pool sandbox holds 10 guests (2 of them for calls still in flight) and the call adds 1, over its limit of 10"
	fx.has_reason(resources.deny, msg) with input as inp
	not data.pvegate.decision.allow with input as inp
}

test_unknown_pool_usage_fails_closed if {
	inp := create(provisioner, "sandbox", small, null)
	fx.has_reason(resources.deny, "the usage of pool sandbox could not be read") with input as inp
}

test_no_pool_for_a_pool_limit if {
	q := {"name": "any-pool", "max_pool_total": {"guests": 5}}
	inp := create(fx.admin, null, small, null)
	fx.has_reason(resources.deny, "the call names no pool") with input as inp with data.data.resource_quotas as [q]
}

test_missing_facts_fail_closed if {
	inp := json.remove(create(provisioner, "sandbox", small, sandbox_usage), ["resources"])
	fx.has_reason(resources.deny, "sent no resource facts") with input as inp
}

test_quota_follows_the_granting_role if {
	# an admin is no provisioner: the sandbox quota does not apply, nor the agent one
	inp := create(fx.admin, "sandbox", amounts(1, 16, 65536, 500), sandbox_usage)
	count(resources.deny) == 0 with input as inp
}

test_agent_size_limit_applies_anywhere if {
	inp := create(fx.agent, "lab", amounts(1, 16, 4096, 8), null)
	fx.has_reason(resources.deny, "resource quota \"agents-guest-size\": the call asks for 16 cores") with input as inp
}

test_non_allocating_tool_is_not_checked if {
	count(resources.deny) == 0 with input as fx.call(provisioner, fx.vm_stop, new_guest("sandbox"))
}

test_bad_quota_data_is_a_problem if {
	bad := [{"name": "x", "max_per_guest": {"cpus": 4}}]
	some p in config.problems with data.data.resource_quotas as bad
	contains(p, "resource_quotas.0.max_per_guest.cpus: unknown key")
}

test_irreversible_tool_tag_adds_risk if {
	t := fx.tool("guest_convert_to_template", "guest", "write", "guest", ["provision", "irreversible"])
	d := data.pvegate.decision with input as fx.call(fx.admin, t, fx.lab_guest)
	some f in d.risk.factors
	f.name == "tool_tag:irreversible"
	f.points == 25
}

# guest_config_update sets an existing guest's cores and memory: `final` is the size the
# guest ends up with (what max_per_guest caps), `requested` the growth (what the pool gains)
config_update := object.union(
	fx.tool("guest_config_update", "guest", "write", "guest", ["config"]),
	{"allocates": true},
)

resize(p, pool, growth, final, usage) := object.union(
	fx.call(p, config_update, fx.guest(102, ["dev"], pool, null)),
	{"resources": {"requested": growth, "final": final, "pool": pool, "pool_usage": usage}},
)

lab_usage := amounts(4, 8, 16384, 200)

test_resize_caps_the_final_size_not_the_growth if {
	# 2 cores -> 64: the growth is 62, but it is a 64-core guest that the per-guest cap refuses
	inp := resize(fx.agent, "lab", amounts(0, 62, 0, 0), {"cores": 64}, lab_usage)
	fx.has_reason(
		resources.deny,
		"resource quota \"agents-guest-size\": the call leaves the guest with 64 cores, more than the 8 allowed per guest",
	) with input as inp
	not data.pvegate.decision.allow with input as inp
}

test_resize_caps_memory_too if {
	inp := resize(fx.agent, "lab", amounts(0, 0, 1040384, 0), {"memory_mib": 1048576}, lab_usage)
	fx.has_reason(resources.deny, "leaves the guest with 1048576 MiB of memory") with input as inp
}

test_resize_within_the_cap_is_not_refused if {
	inp := resize(fx.agent, "lab", amounts(0, 4, 0, 0), {"cores": 8}, lab_usage)
	count(resources.deny) == 0 with input as inp
}

test_resize_leaves_other_sizes_alone if {
	# a memory change on a guest of any core count: the call sets no cores, answers for none
	inp := resize(fx.agent, "lab", amounts(0, 0, 0, 0), {"memory_mib": 4096}, lab_usage)
	count(resources.deny) == 0 with input as inp
}

test_resize_adds_its_growth_to_the_pool if {
	q := {"name": "lab-pool", "pools": ["lab"], "max_per_guest": {"cores": 8}, "max_pool_total": {"cores": 10}}
	fits := resize(fx.admin, "lab", amounts(0, 2, 0, 0), {"cores": 6}, lab_usage)
	count(resources.deny) == 0 with input as fits with data.data.resource_quotas as [q]
	over := resize(fx.admin, "lab", amounts(0, 3, 0, 0), {"cores": 7}, lab_usage)
	fx.has_reason(resources.deny, "pool lab holds 8 cores and the call adds 3, over its limit of 10") with input as over
		with data.data.resource_quotas as [q]
}

test_resize_of_unknown_size_fails_closed if {
	inp := resize(fx.agent, "lab", amounts(0, 0, 0, 0), null, lab_usage)
	fx.has_reason(resources.deny, "sent no resource facts") with input as inp
	inp2 := resize(fx.agent, "lab", amounts(0, 0, 0, 0), {"cores": "64"}, lab_usage)
	fx.has_reason(resources.deny, "sent no resource facts") with input as inp2
}

test_pool_usage_unknown_matters_only_for_what_the_call_adds if {
	q := {"name": "lab-pool", "pools": ["lab"], "max_pool_total": {"cores": 10}}
	tags_only := resize(fx.admin, "lab", amounts(0, 0, 0, 0), {}, null)
	count(resources.deny) == 0 with input as tags_only with data.data.resource_quotas as [q]
	grows := resize(fx.admin, "lab", amounts(0, 2, 0, 0), {"cores": 6}, null)
	fx.has_reason(resources.deny, "the usage of pool lab could not be read") with input as grows
		with data.data.resource_quotas as [q]
}

# --- a guest whose pool Proxmox hides from the gateway's token (pool_known false) ----------

# hidden(growth, final): a resize of guest 102, listed without a pool by a token that may not see
# every pool: in no pool, or in one it cannot see
hidden(growth, final) := object.union(
	resize(fx.admin, null, growth, final, null),
	{"target": {"pool_known": false}, "resources": {"pool_known": false}},
)

lab_cap := {"name": "lab-cap", "pools": ["lab"], "max_per_guest": {"cores": 8}, "max_pool_total": {"cores": 10}}

test_a_hidden_pool_is_refused_where_a_pool_quota_would_limit_the_call if {
	grows := hidden(amounts(0, 2, 0, 0), {"cores": 4})
	msg := concat("", [
		"resource quota \"lab-cap\" limits guests in pool lab, but whether guest 102 is in one cannot be told: ",
		"Proxmox hides its pool from the gateway's token",
	])
	fx.has_reason(resources.deny, msg) with input as grows with data.data.resource_quotas as [lab_cap]
	codes := {r.code | some r in resources.denials} with input as grows with data.data.resource_quotas as [lab_cap]
	codes == {"quota.resource_pool_unknown"}
	not data.pvegate.decision.allow with input as grows with data.data.resource_quotas as [lab_cap]

	# over the per-guest cap, adding nothing to the pool (a quota without a pool total)
	per_guest_only := json.remove(lab_cap, ["max_pool_total"])
	big := hidden(amounts(0, 0, 0, 0), {"cores": 12})
	fx.has_reason(resources.deny, "whether guest 102 is in one cannot be told") with input as big
		with data.data.resource_quotas as [per_guest_only]
}

test_a_hidden_pool_refuses_nothing_a_pool_quota_would_let_through if {
	# a shrink within the per-guest cap adds nothing: whichever pool it is in, no quota refuses it
	shrinks := hidden(amounts(0, 0, 0, 0), {"cores": 2})
	count(resources.deny) == 0 with input as shrinks with data.data.resource_quotas as [lab_cap]
	tags_only := hidden(amounts(0, 0, 0, 0), {})
	count(resources.deny) == 0 with input as tags_only with data.data.resource_quotas as [lab_cap]

	# a quota for another role: it applies in no pool to this caller
	other_role := object.union(lab_cap, {"roles": ["provisioner"]})
	grows := hidden(amounts(0, 2, 0, 0), {"cores": 4})
	count(resources.deny) == 0 with input as grows with data.data.resource_quotas as [other_role]
}

test_a_guest_in_no_pool_is_not_in_a_pool_quota if {
	# the token sees every pool (pool_known true, or absent: an input recorded before the field)
	q := [lab_cap]
	in_none := resize(fx.admin, null, amounts(0, 2, 0, 0), {"cores": 4}, null)
	count(resources.deny) == 0 with input as in_none with data.data.resource_quotas as q
	known := json.patch(in_none, [
		{"op": "add", "path": "/target/pool_known", "value": true},
		{"op": "add", "path": "/resources/pool_known", "value": true},
	])
	count(resources.deny) == 0 with input as known with data.data.resource_quotas as q
	data.pvegate.decision.allow with input as known with data.data.resource_quotas as q
}

test_a_pool_total_without_pools_names_the_hidden_pool if {
	# a quota on every pool's total: the pool cannot be read, because it cannot be seen
	q := {"name": "any-pool", "max_pool_total": {"cores": 100}}
	grows := hidden(amounts(0, 2, 0, 0), {"cores": 4})
	fx.has_reason(
		resources.deny,
		"resource quota \"any-pool\" limits the pool's total, but Proxmox hides guest 102's pool from the gateway's token",
	) with input as grows with data.data.resource_quotas as [q]
}

test_a_quota_for_a_role_granted_only_in_the_hidden_pool_applies if {
	# an agent operating everywhere and provisioning in sandbox: in sandbox the provisioners'
	# quota caps what it does, whichever role grants it there
	both := fx.principal("ops-prov", "agent", ["operator", "provisioner"], [])
	disk_resize := object.union(
		fx.tool("guest_disk_resize", "guest", "write", "guest", ["provision"]),
		{"allocates": true},
	)
	guest := object.union(fx.guest(170, [], null, null), {"pool_known": false})
	grows := object.union(
		fx.call(both, disk_resize, guest),
		{"resources": {"requested": amounts(0, 0, 0, 100), "pool": null, "pool_known": false, "pool_usage": null}},
	)
	fx.has_reason(resources.deny, "resource quota \"provisioners-in-sandbox\" limits guests in pool sandbox") with input as grows

	shown := json.patch(grows, [
		{"op": "replace", "path": "/target/pool", "value": "sandbox"},
		{"op": "replace", "path": "/target/pool_known", "value": true},
		{"op": "replace", "path": "/resources/pool", "value": "sandbox"},
		{"op": "replace", "path": "/resources/pool_known", "value": true},
		{"op": "replace", "path": "/resources/pool_usage", "value": sandbox_usage},
	])
	per_guest := "resource quota \"provisioners-in-sandbox\": the call asks for 100 GiB of disk"
	fx.has_reason(resources.deny, per_guest) with input as shown

	# in no pool (the token sees every pool): the provisioners' binding does not apply, nor their quota
	in_none := json.patch(grows, [
		{"op": "replace", "path": "/target/pool_known", "value": true},
		{"op": "replace", "path": "/resources/pool_known", "value": true},
	])
	count(resources.deny) == 0 with input as in_none
}
