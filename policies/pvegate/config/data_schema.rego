# Generated from schema/data.json by scripts/policy-data-schema.py: do not edit.
# The JSON Schema of the policy data (data.yaml), without its descriptions, as
# a constant: problems in config.rego validates data.data against it.
package pvegate.config

# regal ignore:rule-length
data_schema := {
	"$schema": "http://json-schema.org/draft-07/schema#",
	"$id": "https://pvegate.dev/schemas/policy-data.schema.json",
	"type": "object",
	"additionalProperties": false,
	"properties": {
		"roles": {"type": "object", "additionalProperties": {"$ref": "#/definitions/role"}},
		"bindings": {"type": "array", "items": {"$ref": "#/definitions/binding"}},
		"approver_groups": {
			"type": "object",
			"additionalProperties": {
				"type": "object",
				"additionalProperties": false,
				"properties": {"members": {"$ref": "#/definitions/strings"}, "token_roles": {"$ref": "#/definitions/strings"}},
			},
		},
		"guardrails": {
			"type": "object",
			"additionalProperties": false,
			"properties": {
				"protected_tags": {"$ref": "#/definitions/strings"},
				"maintenance_windows": {
					"type": "array",
					"items": {
						"type": "object",
						"additionalProperties": false,
						"properties": {
							"weekdays": {"type": "array", "items": {"enum": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]}},
							"from_hour": {"type": "integer", "minimum": 0, "maximum": 23},
							"to_hour": {"type": "integer", "minimum": 0, "maximum": 24},
							"name": {"type": "string", "minLength": 1},
						},
						"required": ["weekdays", "from_hour", "to_hour"],
					},
				},
				"agent_no_mutation_scopes": {"type": "array", "items": {"enum": ["guest", "node", "cluster", "storage"]}},
				"deny_rules": {
					"type": "array",
					"items": {
						"type": "object",
						"additionalProperties": false,
						"properties": {
							"tools": {"$ref": "#/definitions/strings"},
							"domains": {"$ref": "#/definitions/domains"},
							"effects": {"type": "array", "items": {"enum": ["read", "write", "destroy", "exec", "*"]}},
							"scopes": {"type": "array", "items": {"enum": ["guest", "node", "cluster", "storage", "*"]}},
							"tool_tags": {"$ref": "#/definitions/strings"},
							"principal_kinds": {"type": "array", "items": {"enum": ["agent", "human", "service"]}},
							"principal_groups": {"$ref": "#/definitions/strings"},
							"principal_roles": {"$ref": "#/definitions/strings"},
							"target_tags": {"$ref": "#/definitions/strings"},
							"name": {"type": "string", "minLength": 1},
							"reason": {"type": "string", "minLength": 1},
						},
						"required": ["name", "reason"],
					},
				},
			},
		},
		"risk": {
			"type": "object",
			"additionalProperties": false,
			"properties": {
				"effect_points": {
					"type": "object",
					"additionalProperties": false,
					"properties": {
						"read": {"type": "integer"},
						"write": {"type": "integer"},
						"destroy": {"type": "integer"},
						"exec": {"type": "integer"},
					},
				},
				"target_tag_points": {"type": "object", "additionalProperties": {"type": "integer"}},
				"scope_points": {
					"type": "object",
					"additionalProperties": false,
					"properties": {
						"guest": {"type": "integer"},
						"node": {"type": "integer"},
						"cluster": {"type": "integer"},
						"storage": {"type": "integer"},
					},
				},
				"ha_points": {"type": "integer"},
				"off_hours_points": {"type": "integer"},
				"unknown_target_points": {"type": "integer"},
				"dry_run_points": {"type": "integer"},
				"business_hours": {
					"type": "object",
					"additionalProperties": false,
					"properties": {
						"weekdays": {"type": "array", "items": {"enum": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]}},
						"from_hour": {"type": "integer", "minimum": 0, "maximum": 23},
						"to_hour": {"type": "integer", "minimum": 0, "maximum": 24},
					},
					"required": ["weekdays", "from_hour", "to_hour"],
				},
				"level_thresholds": {
					"type": "object",
					"additionalProperties": false,
					"properties": {"medium": {"type": "integer"}, "high": {"type": "integer"}, "critical": {"type": "integer"}},
					"required": ["medium", "high", "critical"],
				},
				"tool_tag_points": {"type": "object", "additionalProperties": {"type": "integer"}},
			},
		},
		"approval": {
			"type": "object",
			"additionalProperties": false,
			"properties": {
				"required_from_level": {"enum": ["low", "medium", "high", "critical"]},
				"default_approver_groups": {"$ref": "#/definitions/strings"},
				"min_approvals_by_level": {
					"type": "object",
					"additionalProperties": false,
					"properties": {
						"low": {"type": "integer", "minimum": 1},
						"medium": {"type": "integer", "minimum": 1},
						"high": {"type": "integer", "minimum": 1},
						"critical": {"type": "integer", "minimum": 1},
					},
				},
				"ttl_seconds_by_level": {
					"type": "object",
					"additionalProperties": false,
					"properties": {
						"low": {"type": "integer", "minimum": 1},
						"medium": {"type": "integer", "minimum": 1},
						"high": {"type": "integer", "minimum": 1},
						"critical": {"type": "integer", "minimum": 1},
					},
				},
				"default_min_approvals": {"type": "integer", "minimum": 1},
				"default_ttl_seconds": {"type": "integer", "minimum": 1},
				"rules": {
					"type": "array",
					"items": {
						"type": "object",
						"additionalProperties": false,
						"properties": {
							"tools": {"$ref": "#/definitions/strings"},
							"domains": {"$ref": "#/definitions/domains"},
							"effects": {"type": "array", "items": {"enum": ["read", "write", "destroy", "exec", "*"]}},
							"scopes": {"type": "array", "items": {"enum": ["guest", "node", "cluster", "storage", "*"]}},
							"tool_tags": {"$ref": "#/definitions/strings"},
							"principal_kinds": {"type": "array", "items": {"enum": ["agent", "human", "service"]}},
							"principal_groups": {"$ref": "#/definitions/strings"},
							"principal_roles": {"$ref": "#/definitions/strings"},
							"target_tags": {"$ref": "#/definitions/strings"},
							"name": {"type": "string", "minLength": 1},
							"reason": {"type": "string", "minLength": 1},
							"approver_groups": {"$ref": "#/definitions/strings"},
							"min_approvals": {"type": "integer", "minimum": 1},
							"ttl_seconds": {"type": "integer", "minimum": 1},
							"include_dry_run": {"type": "boolean"},
						},
						"required": ["name", "reason"],
					},
				},
				"waivers": {
					"type": "array",
					"items": {
						"type": "object",
						"additionalProperties": false,
						"properties": {
							"tools": {"$ref": "#/definitions/strings"},
							"domains": {"$ref": "#/definitions/domains"},
							"effects": {"type": "array", "items": {"enum": ["read", "write", "destroy", "exec", "*"]}},
							"scopes": {"type": "array", "items": {"enum": ["guest", "node", "cluster", "storage", "*"]}},
							"tool_tags": {"$ref": "#/definitions/strings"},
							"principal_kinds": {"type": "array", "items": {"enum": ["agent", "human", "service"]}},
							"principal_groups": {"$ref": "#/definitions/strings"},
							"principal_roles": {"$ref": "#/definitions/strings"},
							"target_tags": {"$ref": "#/definitions/strings"},
							"name": {"type": "string", "minLength": 1},
							"reason": {"type": "string", "minLength": 1},
							"active": {"type": "boolean"},
						},
						"required": ["name", "active", "reason"],
					},
				},
			},
		},
		"obligations": {
			"type": "object",
			"additionalProperties": false,
			"properties": {
				"default_max_items": {"type": "integer", "minimum": 0},
				"redact": {
					"type": "object",
					"additionalProperties": {"type": "array", "items": {"type": "string", "pattern": "^[^.]+(\\.[^.]+)*$"}},
				},
			},
		},
		"quotas": {
			"type": "array",
			"items": {
				"type": "object",
				"additionalProperties": false,
				"properties": {
					"tools": {"$ref": "#/definitions/strings"},
					"domains": {"$ref": "#/definitions/domains"},
					"effects": {"type": "array", "items": {"enum": ["read", "write", "destroy", "exec", "*"]}},
					"scopes": {"type": "array", "items": {"enum": ["guest", "node", "cluster", "storage", "*"]}},
					"tool_tags": {"$ref": "#/definitions/strings"},
					"principal_kinds": {"type": "array", "items": {"enum": ["agent", "human", "service"]}},
					"principal_groups": {"$ref": "#/definitions/strings"},
					"principal_roles": {"$ref": "#/definitions/strings"},
					"target_tags": {"$ref": "#/definitions/strings"},
					"name": {"type": "string", "minLength": 1},
					"counter": {"enum": ["tool", "all"]},
					"window": {"enum": ["1m", "1h", "24h"]},
					"limit": {"type": "integer", "minimum": 0},
				},
				"required": ["name", "window", "limit"],
			},
		},
		"ip_scope": {
			"type": "object",
			"additionalProperties": false,
			"properties": {
				"tools": {"$ref": "#/definitions/strings"},
				"permitted_networks": {
					"type": "array",
					"items": {
						"type": "object",
						"additionalProperties": false,
						"required": ["cidr"],
						"properties": {
							"cidr": {"type": "string", "pattern": "^([0-9]{1,3}[.]){3}[0-9]{1,3}/([0-9]|[12][0-9]|3[0-2])$"},
							"name": {"type": "string", "minLength": 1},
						},
					},
				},
				"reserved": {
					"type": "array",
					"items": {
						"type": "object",
						"additionalProperties": false,
						"required": ["cidr"],
						"properties": {
							"cidr": {"type": "string", "pattern": "^([0-9]{1,3}[.]){3}[0-9]{1,3}/([0-9]|[12][0-9]|3[0-2])$"},
							"reason": {"type": "string", "minLength": 1},
						},
					},
				},
			},
		},
		"resource_quotas": {
			"type": "array",
			"items": {
				"type": "object",
				"additionalProperties": false,
				"required": ["name"],
				"properties": {
					"tools": {"$ref": "#/definitions/strings"},
					"domains": {"$ref": "#/definitions/domains"},
					"effects": {"type": "array", "items": {"enum": ["read", "write", "destroy", "exec", "*"]}},
					"scopes": {"type": "array", "items": {"enum": ["guest", "node", "cluster", "storage", "*"]}},
					"tool_tags": {"$ref": "#/definitions/strings"},
					"principal_kinds": {"type": "array", "items": {"enum": ["agent", "human", "service"]}},
					"principal_groups": {"$ref": "#/definitions/strings"},
					"principal_roles": {"$ref": "#/definitions/strings"},
					"target_tags": {"$ref": "#/definitions/strings"},
					"name": {"type": "string", "minLength": 1},
					"roles": {"$ref": "#/definitions/strings"},
					"pools": {"$ref": "#/definitions/strings"},
					"max_per_guest": {
						"type": "object",
						"additionalProperties": false,
						"properties": {
							"guests": {"type": "integer", "minimum": 0},
							"cores": {"type": "integer", "minimum": 0},
							"memory_mib": {"type": "integer", "minimum": 0},
							"disk_gib": {"type": "integer", "minimum": 0},
						},
					},
					"max_pool_total": {
						"type": "object",
						"additionalProperties": false,
						"properties": {
							"guests": {"type": "integer", "minimum": 0},
							"cores": {"type": "integer", "minimum": 0},
							"memory_mib": {"type": "integer", "minimum": 0},
							"disk_gib": {"type": "integer", "minimum": 0},
						},
					},
				},
			},
		},
	},
	"definitions": {
		"strings": {"type": "array", "items": {"type": "string", "minLength": 1}},
		"role": {
			"type": "object",
			"additionalProperties": false,
			"properties": {
				"description": {"type": "string"},
				"allow": {"type": "array", "items": {"$ref": "#/definitions/role_selector"}},
				"deny": {"type": "array", "items": {"$ref": "#/definitions/role_selector"}},
				"max_items": {"type": "integer", "minimum": 0},
				"plan_only": {"type": "boolean"},
				"approve": {"type": "boolean"},
				"break_glass": {"type": "boolean"},
			},
		},
		"role_selector": {
			"type": "object",
			"additionalProperties": false,
			"properties": {
				"tools": {"$ref": "#/definitions/strings"},
				"domains": {"$ref": "#/definitions/domains"},
				"effects": {"type": "array", "items": {"enum": ["read", "write", "destroy", "exec", "*"]}},
				"scopes": {"type": "array", "items": {"enum": ["guest", "node", "cluster", "storage", "*"]}},
				"tool_tags": {"$ref": "#/definitions/strings"},
			},
		},
		"binding": {
			"type": "object",
			"additionalProperties": false,
			"properties": {
				"name": {"type": "string", "minLength": 1},
				"role": {"type": "string", "minLength": 1},
				"subjects": {"$ref": "#/definitions/strings"},
				"groups": {"$ref": "#/definitions/strings"},
				"token_roles": {"$ref": "#/definitions/strings"},
				"principal_kinds": {"type": "array", "items": {"enum": ["agent", "human", "service"]}},
				"scope": {
					"type": "object",
					"additionalProperties": false,
					"properties": {
						"clusters": {"$ref": "#/definitions/strings"},
						"nodes": {"$ref": "#/definitions/strings"},
						"pools": {"$ref": "#/definitions/strings"},
						"guest_tags": {"$ref": "#/definitions/strings"},
						"vmids": {
							"type": "array",
							"items": {
								"type": "object",
								"additionalProperties": false,
								"properties": {"from": {"type": "integer", "minimum": 0}, "to": {"type": "integer", "minimum": 0}},
								"required": ["from", "to"],
							},
						},
					},
				},
			},
			"required": ["name", "role"],
		},
		"domains": {
			"type": "array",
			"items": {
				"type": "string",
				"enum": ["guest", "node", "cluster", "storage", "backup", "snapshot", "container", "network", "access", "task", "*"],
			},
		},
	},
}
