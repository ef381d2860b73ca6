# Address scope (part of the guard rails; the package's METADATA is in guardrails.rego).
# Tools listed in data.ip_scope.tools that take an `ip` argument
# (check_ip_availability) only answer about addresses the organisation manages:
# inside a permitted network, not its network or broadcast address, and not in
# a reserved range. Anything else is refused with the reason, so an address
# outside what the gateway can see is never called "free".
package pvegate.guardrails

import data.pvegate.config
import data.pvegate.lib

# the call's address is tested only when its tool is scoped: one test for every other call
denials contains r if {
	scoped_ip
	some r in ip_denials
}

ip_denials contains lib.reason("guardrail.ip_scope", "data.ip_scope.permitted_networks", msg) if {
	count(permitted_containing(scoped_ip)) == 0
	msg := sprintf(
		"address %s is outside the permitted networks (%s): %s does not answer for it",
		[scoped_ip, concat(", ", permitted_cidrs), input.tool.name],
	)
}

ip_denials contains lib.reason("guardrail.ip_scope", "data.ip_scope.permitted_networks", msg) if {
	some n in permitted_containing(scoped_ip)
	kind := special_address(scoped_ip, n.cidr)
	msg := sprintf("address %s is the %s address of %s: never assignable, never free", [scoped_ip, kind, n.cidr])
}

ip_denials contains lib.reason("guardrail.ip_scope", "data.ip_scope.reserved", msg) if {
	some r in config.ip_scope.reserved
	net.cidr_contains(r.cidr, scoped_ip)
	why := object.get(r, "reason", "reserved")
	msg := sprintf("address %s is in the reserved range %s (%s): not handed out", [scoped_ip, r.cidr, why])
}

# the address the call asks about, when its tool is scoped
scoped_ip := input.arguments.ip if {
	lib.glob_any(config.ip_scope.tools, input.tool.name)
	is_string(input.arguments.ip)
}

permitted_cidrs contains n.cidr if some n in config.ip_scope.permitted_networks

permitted_containing(ip) := {n | some n in config.ip_scope.permitted_networks; net.cidr_contains(n.cidr, ip)}

# special_address(ip, cidr): "network" or "broadcast" when ip is one of them in cidr (prefixes up to /30;
# a /31 or /32 has neither, RFC 3021)
special_address(ip, cidr) := "network" if {
	[host, _] := host_part(ip, cidr)
	host == 0
}

special_address(ip, cidr) := "broadcast" if {
	[host, mask] := host_part(ip, cidr)
	host == mask
}

host_part(ip, cidr) := [bits.and(ip_number(ip), mask), mask] if {
	prefix := to_number(split(cidr, "/")[1])
	prefix <= 30
	mask := bits.lsh(1, 32 - prefix) - 1
}

ip_number(ip) := (((((to_number(o[0]) * 256) + to_number(o[1])) * 256) + to_number(o[2])) * 256) + to_number(o[3]) if {
	o := split(ip, ".")
}
