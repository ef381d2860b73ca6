# METADATA
# title: Resource quotas
# description: |
#   Limits on what a call may allocate (creates, clones, new disks, disk growth,
#   a guest's new cores or memory): data.data.resource_quotas. A quota selects
#   calls like any selector (tools, effects, principal_kinds, ...) and optionally
#   by `roles` (one of the roles that grant the call) and `pools` (the pool the
#   resources land in). It caps the amounts one call asks for (`max_per_guest`;
#   for a call that resizes a guest, the size the guest ends up with) and the
#   pool's total after the call (`max_pool_total`); keys: guests, cores,
#   memory_mib, disk_gib.
#
#   The gateway computes the request from the arguments (a restore: from the
#   size its backup records) and sums the pool's current usage
#   (input.resources). Missing facts fail closed: an allocating call without
#   them (or with a resize's or a restore's final size unknown), a pool
#   limit whose pool usage is unknown, or a quota selected by `pools` on a
#   guest whose pool Proxmox hides from the gateway's token, is denied.
# schemas:
#   - input: schema["decision_input.schema"]
package pvegate.resources

import data.pvegate.config
import data.pvegate.lib
import data.pvegate.rbac

amounts := ["guests", "cores", "memory_mib", "disk_gib"]

allocates if input.tool.allocates == true

facts_ok if {
	is_object(input.resources.requested)
	final_ok
	every k in amounts {
		is_number(input.resources.requested[k])
	}
}

# `final` is there only for a call that resizes an existing guest (a restore over one too);
# null there means the gateway could not work the guest's size out (or, for any restore, the
# size its backup records), and what cannot be checked is refused
final_ok if not "final" in object.keys(input.resources)

final_ok if {
	is_object(input.resources.final)
	every v in input.resources.final {
		is_number(v)
	}
}

# What max_per_guest caps: for a resize, the sizes it sets as the guest ends up with them
# (input.resources.final: setting 64 cores on a 2-core guest is a 64-core guest, not 62
# more cores); otherwise, and for what a resize leaves alone, what the call asks for (a new
# guest's size, one new disk or a disk's growth). max_pool_total always adds `requested`:
# for a resize that is the growth, which is all the pool gains.
per_guest[k] := object.get(object.get(input.resources, "final", {}), k, input.resources.requested[k]) if {
	facts_ok
	some k in amounts
}

resizes if is_object(input.resources.final)

# quotas that apply to this call
applicable contains q if {
	allocates
	some q in config.resource_quotas
	lib.reaching_call_matches(q)
	roles_match(q)
	pools_match(q)
}

roles_match(q) if not "roles" in object.keys(q)

roles_match(q) if {
	some r in q.roles
	r in rbac.granting_roles
}

pools_match(q) if not "pools" in object.keys(q)

pools_match(q) if input.resources.pool in q.pools

# Proxmox hides a guest's pool from a token without Pool.Audit on it (the guest is listed as in
# no pool): the gateway then says the pool is not known (pool_known false; absent: known). A
# quota selected by `pools` may apply to such a guest or not: it is checked as if it applied,
# and what it would refuse (a size over its per-guest cap, a pool total the call adds to, which
# cannot be read) is refused
pool_hidden if input.resources.pool_known == false

maybe_applicable contains q if {
	allocates
	pool_hidden
	some q in config.resource_quotas
	"pools" in object.keys(q)
	lib.reaching_call_matches(q)
	maybe_roles_match(q)
}

# a role may grant the call through a pool-scoped binding that would apply in the hidden pool
maybe_roles_match(q) if roles_match(q)

maybe_roles_match(q) if {
	some r in q.roles
	r in rbac.hidden_pool_granting_roles
}

# would_refuse(q): a quota that applied would refuse the call, or could not check it
would_refuse(q) if {
	some k, limit in object.get(q, "max_per_guest", {})
	object.get(per_guest, k, 0) > limit
}

would_refuse(q) if {
	some k, _ in object.get(q, "max_pool_total", {})
	object.get(input.resources.requested, k, 0) > 0
}

# deny: the sentences of the denials below
deny contains r.message if some r in denials

denials contains lib.reason("quota.resource_facts_missing", "pvegate.resources.facts_ok", msg) if {
	allocates
	not facts_ok
	msg := sprintf(
		"tool %q allocates resources but the gateway sent no resource facts; refusing what cannot be checked",
		[input.tool.name],
	)
}

denials contains lib.reason("quota.resource_per_guest", sprintf("data.resource_quotas[%s]", [q.name]), msg) if {
	facts_ok
	some q in applicable
	some k, limit in object.get(q, "max_per_guest", {})
	asked := object.get(per_guest, k, 0)
	asked > limit
	msg := sprintf(
		"resource quota %q: the call %s %v %s, more than the %v allowed per guest",
		[q.name, per_guest_verb, asked, unit[k], limit],
	)
}

denials contains lib.reason("quota.resource_pool_unknown", sprintf("data.resource_quotas[%s]", [q.name]), msg) if {
	facts_ok
	not usage_known
	some q in applicable

	# only a limit on something the call adds (a resize that sets no size, or shrinks, adds
	# nothing and cannot overfill a pool)
	some k, _ in object.get(q, "max_pool_total", {})
	object.get(input.resources.requested, k, 0) > 0
	msg := sprintf(
		"resource quota %q limits the pool's total, but %s; name a pool whose usage the gateway can read",
		[q.name, pool_text],
	)
}

denials contains lib.reason("quota.resource_pool_unknown", sprintf("data.resource_quotas[%s]", [q.name]), msg) if {
	facts_ok
	some q in maybe_applicable
	would_refuse(q)
	msg := sprintf(
		concat("", [
			"resource quota %q limits guests in pool %s, but whether guest %v is in one cannot be told: ",
			"Proxmox hides its pool from the gateway's token (grant the token Pool.Audit on the pools); ",
			"refusing what cannot be checked",
		]),
		[q.name, concat(" or ", q.pools), input.target.vmid],
	)
}

denials contains lib.reason("quota.resource_pool_total", sprintf("data.resource_quotas[%s]", [q.name]), msg) if {
	facts_ok
	usage_known
	some q in applicable
	some k, limit in object.get(q, "max_pool_total", {})
	used := object.get(input.resources.pool_usage, k, 0)
	asked := object.get(input.resources.requested, k, 0)
	asked > 0
	used + asked > limit
	msg := sprintf(
		"resource quota %q: pool %v holds %v %s%s and the call adds %v, over its limit of %v",
		[q.name, input.resources.pool, used, unit[k], in_flight_text(k), asked, limit],
	)
}

# pool_usage counts what allowed calls still in flight hold (input.resources.pool_in_flight): said
# so, or a refusal would name more than Proxmox lists in the pool
default in_flight_text(_) := ""

in_flight_text(k) := sprintf(" (%v of them for calls still in flight)", [n]) if {
	n := object.get(object.get(input.resources, "pool_in_flight", {}), k, 0)
	n > 0
}

usage_known if is_object(input.resources.pool_usage)

default per_guest_verb := "asks for"

per_guest_verb := "leaves the guest with" if resizes

unit := {"guests": "guests", "cores": "cores", "memory_mib": "MiB of memory", "disk_gib": "GiB of disk"}

default pool_text := "the call names no pool"

pool_text := sprintf("the usage of pool %v could not be read", [input.resources.pool]) if {
	is_string(input.resources.pool)
}

pool_text := sprintf("Proxmox hides guest %v's pool from the gateway's token (it needs Pool.Audit)", [input.target.vmid]) if {
	pool_hidden
	not is_string(input.resources.pool)
}
