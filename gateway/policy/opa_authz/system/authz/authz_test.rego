package system.authz_test

import data.system.authz

runtime := {"env": {"PVEGATE_OPA_TOKEN": "t0ken"}}

test_the_gateway_token_may_do_anything if {
	authz.allow with input as {"identity": "t0ken", "method": "PUT", "path": ["v1", "data"]}
		with opa.runtime as runtime
}

test_no_or_another_token_may_not if {
	not authz.allow with input as {"method": "POST", "path": ["v1", "data", "pvegate", "decision"]}
		with opa.runtime as runtime
	not authz.allow with input as {"identity": "guess", "method": "PUT", "path": ["v1", "policies", "x"]}
		with opa.runtime as runtime
}

test_an_empty_or_missing_token_opens_nothing if {
	not authz.allow with input as {"identity": "", "method": "GET", "path": ["v1", "data"]}
		with opa.runtime as {"env": {"PVEGATE_OPA_TOKEN": ""}}
	not authz.allow with input as {"identity": "", "method": "GET", "path": ["v1", "data"]}
		with opa.runtime as {"env": {}}
}

test_health_needs_no_token if {
	authz.allow with input as {"method": "GET", "path": ["health"]} with opa.runtime as runtime
	not authz.allow with input as {"method": "GET", "path": ["metrics"]} with opa.runtime as runtime
}
