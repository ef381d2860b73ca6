# METADATA
# title: Who may use the managed OPA's API
# description: |
#   pvegate loads this next to a policy directory, and starts OPA with token
#   authentication and this authorization policy. Policies and data loaded from
#   files are otherwise writable through OPA's REST API by any local process
#   (PUT /v1/data, PUT /v1/policies), which could rewrite who may do what. A
#   signed bundle needs no such guard: OPA refuses writes under bundle roots.
#   Only the gateway that started this OPA holds the per-start token that OPA
#   finds in its environment; health probes need none.
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
