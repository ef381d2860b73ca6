# METADATA
# title: Policy data accessors
# description: |
#   The only place that reads the organisation's policy data (`data.data`,
#   loaded from policies/data/). Every setting has a safe default, so a
#   missing or partial data document never widens access: with no data no
#   role is bound and every call is denied.
package pvegate.config

import data.pvegate.lib

# --- RBAC -----------------------------------------------------------------

default roles := {}

roles := r if {
	r := data.data.roles
	is_object(r)
}

# compiled_roles: role name -> its allow and deny selectors, compiled once
compiled_roles[name] := {
	"allow": [lib.compile(sel) | some sel in object.get(role, "allow", [])],
	"deny": [lib.compile(sel) | some sel in object.get(role, "deny", [])],
} if {
	some name, role in roles
	is_object(role)
}

default bindings := []

bindings := b if {
	b := data.data.bindings
	is_array(b)
}

default approver_groups := {}

approver_groups := g if {
	g := data.data.approver_groups
	is_object(g)
}

# --- guard rails ----------------------------------------------------------

default protected_tags := ["protected"]

protected_tags := t if {
	t := data.data.guardrails.protected_tags
	is_array(t)
}

# no window configured: destroy and exec are never inside one
default maintenance_windows := []

maintenance_windows := w if {
	w := data.data.guardrails.maintenance_windows
	is_array(w)
}

default agent_no_mutation_scopes := ["node"]

agent_no_mutation_scopes := s if {
	s := data.data.guardrails.agent_no_mutation_scopes
	is_array(s)
}

# hosts a call naming a URL may reach (downloads); none configured: none
default download_hosts := []

download_hosts := h if {
	h := data.data.guardrails.download_hosts
	is_array(h)
}

default deny_rules := []

deny_rules := r if {
	r := data.data.guardrails.deny_rules
	is_array(r)
}

# --- address scope ----------------------------------------------------------
# Which addresses tools taking an `ip` argument may be asked about. No data:
# no tool is scoped (the tool's own parameter pattern still applies).

default ip_scope := {"tools": [], "permitted_networks": [], "reserved": []}

ip_scope := object.union({"tools": [], "permitted_networks": [], "reserved": []}, s) if {
	s := data.data.ip_scope
	is_object(s)
}

# --- risk -----------------------------------------------------------------

default_risk := {
	"effect_points": {"read": 0, "write": 20, "exec": 35, "destroy": 45},
	"target_tag_points": {"prod": 20},
	"tool_tag_points": {},
	"critical_calls": [],
	"scope_points": {"guest": 0, "storage": 10, "node": 20, "cluster": 30},
	"ha_points": 10,
	"off_hours_points": 10,
	"unknown_target_points": 10,
	"dry_run_points": -30,
	"business_hours": {"weekdays": ["Mon", "Tue", "Wed", "Thu", "Fri"], "from_hour": 8, "to_hour": 18},
	"level_thresholds": {"medium": 25, "high": 50, "critical": 75},
}

risk := object.union(default_risk, data_risk)

default data_risk := {}

data_risk := r if {
	r := data.data.risk
	is_object(r)
}

# --- approval -------------------------------------------------------------

default_approval := {
	"required_from_level": "high",
	"default_approver_groups": [],
	"min_approvals_by_level": {},
	"ttl_seconds_by_level": {},
	"step_up_max_age_seconds_by_level": {},
	"default_min_approvals": 1,
	"default_ttl_seconds": 900,
	"rules": [],
	"waivers": [],
}

approval := object.union(default_approval, data_approval)

default data_approval := {}

data_approval := a if {
	a := data.data.approval
	is_object(a)
}

# --- obligations ----------------------------------------------------------

default default_max_items := 100

default_max_items := n if {
	n := data.data.obligations.default_max_items
	is_number(n)
}

# selectors of the calls that may hand the caller a secret Proxmox shows once
# (a new API token's value); no data: such secrets are withheld
default reveal_secrets := []

reveal_secrets := r if {
	r := data.data.obligations.reveal_secrets
	is_array(r)
}

default redact := {}

redact := r if {
	r := data.data.obligations.redact
	is_object(r)
}

# --- quotas ---------------------------------------------------------------

default quotas := []

quotas := q if {
	q := data.data.quotas
	is_array(q)
}

# --- resource quotas (creates, new disks, disk growth) --------------------

default resource_quotas := []

resource_quotas := q if {
	q := data.data.resource_quotas
	is_array(q)
}

# --- data errors ----------------------------------------------------------
# problems: mistakes in the policy data that would otherwise silently weaken a
# control. The decision denies with these reasons until the data is fixed.

problems contains msg if {
	some q in quotas
	not valid_quota(q)
	msg := sprintf("quota %v needs a name, a window of 1m/1h/24h and a numeric limit", [object.get(q, "name", "(unnamed)")])
}

problems contains msg if {
	not approval.required_from_level in {"low", "medium", "high", "critical"}
	msg := sprintf("approval.required_from_level %v is not a risk level", [approval.required_from_level])
}

problems contains "risk.level_thresholds needs numeric medium, high and critical" if not valid_thresholds

# (risk.level reads them in order: thresholds that do not rise would rank a
# score below a level it passed)
problems contains msg if {
	valid_thresholds
	t := risk.level_thresholds
	not rising_thresholds(t)
	msg := sprintf("risk.level_thresholds must rise: medium %v < high %v < critical %v", [t.medium, t.high, t.critical])
}

# (risk.score is clamped to 0-100: a higher critical threshold is never reached, so no
# call would be critical by its score, however risky)
problems contains msg if {
	valid_thresholds
	risk.level_thresholds.critical > max_risk_score
	msg := sprintf(
		"risk.level_thresholds.critical %v is above %d, the highest risk score: no score would ever be critical",
		[risk.level_thresholds.critical, max_risk_score],
	)
}

# Every place where the data breaks its JSON Schema (schema/data.json beside
# this file, as the constant data_schema in data_schema.rego): an unknown key is
# a misspelling that would otherwise be silently ignored, a wrong type a setting
# that would be misread. The path is named from the data document's root.
# (Depends on data only: evaluated at most once per query.)
problems contains msg if {
	some e in schema_errors
	msg := schema_error_text(e)
}

problems contains msg if {
	some b in bindings
	is_object(b)
	not role_defined(b.role)
	msg := sprintf("bindings: binding %v names role %v, which roles does not define", [
		object.get(b, "name", "(unnamed)"),
		object.get(b, "role", null),
	])
}

# (rbac.vmid_ok reads a range as from <= vmid <= to: a reversed range matches no
# guest, so the binding would silently grant nothing there)
problems contains msg if {
	some i, b in bindings
	is_array(b.scope.vmids)
	some j, r in b.scope.vmids
	reversed_range(r)
	msg := sprintf(
		concat("", [
			"bindings.%d.scope.vmids.%d: binding %v has the range from %v to %v, ",
			"which is reversed (from > to) and matches no guest",
		]),
		[i, j, object.get(b, "name", "(unnamed)"), r.from, r.to],
	)
}

# (resources.roles_match admits a quota's call when one of its roles grants it: a role the data
# does not define grants nothing, so a misspelt one would silently cap no call)
problems contains msg if {
	some i, q in resource_quotas
	is_array(q.roles)
	some r in q.roles
	not role_defined(r)
	msg := sprintf("resource_quotas.%d: resource quota %v names role %v, which roles does not define", [
		i,
		object.get(q, "name", "(unnamed)"),
		r,
	])
}

# (the schema's pattern admits a leading zero or an octet over 255, which OPA's
# net.cidr_contains fails on: such a network contains no address, so a reserved
# range would silently reserve nothing)
problems contains msg if {
	some list in ["permitted_networks", "reserved"]
	some i, n in object.get(ip_scope, list, [])
	is_string(n.cidr)
	not net.cidr_is_valid(n.cidr)
	msg := sprintf(
		"ip_scope.%s.%d.cidr: %s is not a network OPA can read (an octet over 255 or with a leading zero?): it would match no address",
		[list, i, n.cidr],
	)
}

role_defined(name) if is_object(roles[name])

default schema_errors := []

schema_errors := errors if {
	[valid, errors] := json.match_schema(data.data, data_schema)
	not valid
}

# "guardrails: Additional property protected_tag is not allowed" names the
# parent; the key is the part a reader looks for
schema_error_text(e) := sprintf("%s: unknown key (not in the data schema; misspelled?)", [data_path(e.field, key)]) if {
	e.type == "additional_property_not_allowed"
	key := regex.find_all_string_submatch_n(`^Additional property (.+) is not allowed$`, e.desc, 1)[0][1]
} else := sprintf("%s: %s", [data_path(e.field, ""), e.desc])

# data_path(field, key): the dotted path from the data root, e.g.
# guardrails.maintenance_windows.0.from_hour
data_path(field, key) := concat(".", [p | some p in array.concat(parts(field), [key]); p != ""])

parts(field) := [] if lower(field) == "(root)"

parts(field) := split(field, ".") if lower(field) != "(root)"

# the highest risk score (risk.score is clamped to 0-100)
max_risk_score := 100

valid_quota(q) if {
	is_string(q.name)
	q.window in {"1m", "1h", "24h"}
	is_number(q.limit)
}

valid_thresholds if {
	is_number(risk.level_thresholds.medium)
	is_number(risk.level_thresholds.high)
	is_number(risk.level_thresholds.critical)
}

reversed_range(r) if {
	is_number(r.from)
	is_number(r.to)
	r.from > r.to
}

rising_thresholds(t) if {
	t.medium < t.high
	t.high < t.critical
}
