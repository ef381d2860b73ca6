# METADATA
# title: Who may use the managed OPA's API
# description: |
#   Every OPA that pvegate starts, and the container OPA of docker/compose.yaml,
#   runs with token authentication and this authorization policy: loaded next to
#   a policy directory, or carried inside the signed bundle (`pvegate bundle
#   build` adds it). Without it any process that reaches OPA's port could read
#   policy and data, and rewrite policies and data loaded from files, or write
#   outside a bundle's roots (PUT /v1/data, PUT /v1/policies). Only the holder
#   of the token that OPA finds in its environment (PVEGATE_OPA_TOKEN: per start
#   for a managed OPA, from a secret for a container) may use the API; health
#   probes need none.
package system.authz

# METADATA
# title: allow
# description: OPA asks this for every API request (--authorization=basic).
# entrypoint: true
default allow := false

allow if {
	token := opa.runtime().env.PVEGATE_OPA_TOKEN
	token != ""
	input.identity == token
}

allow if {
	input.method == "GET"
	input.path == ["health"]
}
