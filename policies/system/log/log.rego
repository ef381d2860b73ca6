# METADATA
# title: Decision log masking
# description: >
#   Tool arguments may carry secrets (passwords in a config update, for example).
#   OPA's own decision log never keeps them; the gateway's audit log records the
#   arguments with the connector's sensitive fields redacted instead.
package system.log

mask contains "/input/arguments"

mask contains "/input/approval/token"
