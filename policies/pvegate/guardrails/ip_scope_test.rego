package pvegate.guardrails_test

import data.pvegate.fixtures_test as fx
import data.pvegate.guardrails

ipscope_tool := fx.tool("check_ip_availability", "network", "read", "cluster", ["network", "ipam"])

ipscope_data := {
	"tools": ["check_ip_availability"],
	"permitted_networks": [{"cidr": "10.10.1.0/24"}, {"cidr": "192.168.7.8/31"}],
	"reserved": [{"cidr": "10.10.1.240/28", "reason": "DHCP pool"}],
}

ipscope_ask(ip) := object.union(fx.call(fx.auditor, ipscope_tool, fx.unknown_target), {"arguments": {"ip": ip}})

test_address_inside_a_permitted_network_is_asked if {
	count(guardrails.deny) == 0 with input as ipscope_ask("10.10.1.77") with data.data.ip_scope as ipscope_data
}

test_address_outside_every_permitted_network_is_refused if {
	reasons := guardrails.deny with input as ipscope_ask("8.8.8.8") with data.data.ip_scope as ipscope_data
	fx.has_reason(reasons, "address 8.8.8.8 is outside the permitted networks")
}

test_network_and_broadcast_addresses_are_refused if {
	net_reasons := guardrails.deny with input as ipscope_ask("10.10.1.0") with data.data.ip_scope as ipscope_data
	fx.has_reason(net_reasons, "address 10.10.1.0 is the network address of 10.10.1.0/24")
	bc_reasons := guardrails.deny with input as ipscope_ask("10.10.1.255") with data.data.ip_scope as ipscope_data
	fx.has_reason(bc_reasons, "address 10.10.1.255 is the broadcast address of 10.10.1.0/24")
}

test_a_31_has_no_network_or_broadcast_address if {
	count(guardrails.deny) == 0 with input as ipscope_ask("192.168.7.8") with data.data.ip_scope as ipscope_data
	count(guardrails.deny) == 0 with input as ipscope_ask("192.168.7.9") with data.data.ip_scope as ipscope_data
}

test_reserved_range_is_refused_with_its_reason if {
	reasons := guardrails.deny with input as ipscope_ask("10.10.1.245") with data.data.ip_scope as ipscope_data
	fx.has_reason(reasons, "address 10.10.1.245 is in the reserved range 10.10.1.240/28 (DHCP pool)")
}

test_unscoped_tool_is_not_restricted if {
	ping := object.union(
		fx.call(fx.auditor, fx.tool("node_ping", "network", "read", "node", ["network"]), fx.node_target),
		{"arguments": {"node": "pve1", "ip": "8.8.8.8"}},
	)
	count(guardrails.deny) == 0 with input as ping with data.data.ip_scope as ipscope_data
}

test_shipped_data_scopes_check_ip_availability if {
	reasons := guardrails.deny with input as ipscope_ask("10.99.0.5")
	fx.has_reason(reasons, "outside the permitted networks (10.10.1.0/24, 10.10.2.0/24)")
}

test_malformed_network_is_a_data_problem if {
	bad := object.union(data.data, {"ip_scope": {"permitted_networks": [{"cidr": "10.1/8"}]}})
	problems := data.pvegate.config.problems with data.data as bad
	some p in problems
	startswith(p, "ip_scope.permitted_networks.0.cidr: ")
}

# a network the schema's pattern admits but OPA cannot read (a leading zero, an octet
# over 255): net.cidr_contains fails on it, so a reserved range written so would
# reserve nothing; the data check names it instead
test_network_opa_cannot_read_is_a_data_problem if {
	bad := object.union(data.data, {"ip_scope": {
		"tools": ["check_ip_availability"],
		"permitted_networks": [{"cidr": "10.10.1.0/24"}, {"cidr": "10.10.300.0/24"}],
		"reserved": [{"cidr": "10.10.01.240/28", "reason": "DHCP pool"}],
	}})
	problems := data.pvegate.config.problems with data.data as bad
	suffix := " is not a network OPA can read (an octet over 255 or with a leading zero?): it would match no address"
	unreadable := {p |
		some p in problems
		endswith(p, suffix)
	}
	unreadable == {
		concat("", ["ip_scope.reserved.0.cidr: 10.10.01.240/28", suffix]),
		concat("", ["ip_scope.permitted_networks.1.cidr: 10.10.300.0/24", suffix]),
	}
}

test_shipped_networks_are_readable if {
	every p in data.pvegate.config.problems {
		not startswith(p, "ip_scope.")
	}
}
