# METADATA
# title: Risk scoring
# description: |
#   A 0-100 score from listed factors so a human can see why: the tool's
#   effect, the target's tags (e.g. prod), the blast radius of node- and
#   cluster-scope tools, HA-managed guests, time outside business hours, an
#   unresolved target, and a discount for dry runs. Everything but the effect
#   counts for mutations only. Points and thresholds come from data.data.risk;
#   its critical_calls name mutations that are critical whatever else they
#   score (turning a firewall off, applying SDN), which the approval thresholds
#   then send to two approvers.
# schemas:
#   - input: schema["decision_input.schema"]
package pvegate.risk

import data.pvegate.config
import data.pvegate.lib
import data.pvegate.obligations

cfg := config.risk

mutation if input.tool.effect in lib.mutating_effects

factors contains factor if {
	points := cfg.effect_points[input.tool.effect]
	points != 0
	factor := {
		"name": sprintf("effect:%s", [input.tool.effect]),
		"points": points,
		"why": sprintf("tool %q has effect %s", [input.tool.name, input.tool.effect]),
	}
}

# the factors below count for mutations only: one rule tests that for all of
# them, so a read evaluates none of them
factors contains factor if {
	mutation
	some factor in mutation_factors
}

mutation_factors contains factor if {
	some tag in lib.tags_of(input.target)
	points := cfg.target_tag_points[tag]
	factor := {
		"name": sprintf("target_tag:%s", [tag]),
		"points": points,
		"why": sprintf("the target guest is tagged %q", [tag]),
	}
}

# ... and of the guests a call reaches besides its target (lib.beyond_target: a volume's owner,
# the guests whose backups a prune deletes, a member list's guests, a restore's backed-up guest):
# the target of such a call is often a storage, the cluster or a node, which carries no tags, so
# a critical guest's replicas deleted or backups pruned would otherwise weigh no more than a lab
# guest's. A tag counts once.
mutation_factors contains factor if {
	some tag, vmids in reached_tag_guests
	not tag in lib.tags_of(input.target)
	points := cfg.target_tag_points[tag]
	factor := {
		"name": sprintf("target_tag:%s", [tag]),
		"points": points,
		"why": sprintf("guest %s, which the call reaches, is tagged %q", [concat(", ", vmids), tag]),
	}
}

# tool tags that carry risk, e.g. irreversible (a template never starts again)
mutation_factors contains factor if {
	some tag in input.tool.tags
	points := cfg.tool_tag_points[tag]
	factor := {
		"name": sprintf("tool_tag:%s", [tag]),
		"points": points,
		"why": sprintf("tool %q is tagged %q", [input.tool.name, tag]),
	}
}

# a call the data names critical (selector plus argument values, e.g. enable: false) is
# worth the critical threshold on its own; a dry run changes nothing and is scored as usual.
# Only the critical calls that name the call's tool, or name none (index_names "*"), are
# tested (looked up in the rule bodies: partially evaluated, OPA's rule index picks them
# by the call's tool name; critical_matches below)
mutation_factors contains critical_factor(rule) if some rule in critical_matches

mutation_factors contains factor if {
	points := cfg.scope_points[input.tool.scope]
	points != 0
	factor := {
		"name": sprintf("blast_radius:%s", [input.tool.scope]),
		"points": points,
		"why": sprintf("the tool acts on a whole %s", [input.tool.scope]),
	}
}

mutation_factors contains factor if {
	is_string(input.target.ha_state)
	factor := {
		"name": "ha_managed",
		"points": cfg.ha_points,
		"why": sprintf("the guest is HA-managed (state %s): HA may fight or amplify the change", [input.target.ha_state]),
	}
}

mutation_factors contains factor if {
	not business_hours
	factor := {
		"name": "off_hours",
		"points": cfg.off_hours_points,
		"why": sprintf(
			"%s %02d:00 UTC is outside business hours: fewer people around to notice",
			[lib.weekday, lib.hour_utc],
		),
	}
}

mutation_factors contains factor if {
	input.tool.scope == "guest"
	not input.target.known == true
	factor := {
		"name": "unknown_target",
		"points": cfg.unknown_target_points,
		"why": "the target guest could not be resolved",
	}
}

mutation_factors contains factor if {
	obligations.dry_run
	factor := {
		"name": "dry_run",
		"points": cfg.dry_run_points,
		"why": "dry run: nothing is changed",
	}
}

critical_matches contains rule if {
	not obligations.dry_run
	some rule in critical_index[input.tool.name]
	lib.reaching_call_matches(rule)
	arguments_match(rule)
}

critical_matches contains rule if {
	not obligations.dry_run
	some rule in critical_index["*"]
	lib.reaching_call_matches(rule)
	arguments_match(rule)
}

critical_factor(rule) := {
	"name": sprintf("critical_call:%s", [rule.name]),
	"points": cfg.level_thresholds.critical,
	"why": rule.reason,
}

# the critical calls by the tool names they can match (lib.index_names)
critical_index[name] contains rule if {
	some rule in cfg.critical_calls
	some name in lib.index_names(rule)
}

business_hours if lib.in_window(cfg.business_hours, lib.weekday, lib.hour_utc)

# the factors' points, clamped to 0-100
score := min([100, max([0, sum([f.points | some f in factor_list])])])

# the level: critical for a critical call whatever it scores (points below zero included: a
# tag scored -30 must not bring a firewall turned off down to high, and to a single
# approver), else the lowest level whose
# next threshold the score stays under (the data's thresholds rise: the data check refuses
# them otherwise, see config.problems); a read is one test of `mutation` and one comparison.
# (The first branch gives the default's value on purpose: it must be tested before the
# score's branches, which a default is not.)
default level := "critical"

# regal ignore:rule-assigns-default
level := "critical" if {
	mutation
	count(critical_matches) > 0
} else := "low" if {
	score < cfg.level_thresholds.medium
} else := "medium" if {
	score < cfg.level_thresholds.high
} else := "high" if {
	score < cfg.level_thresholds.critical
}

result := {
	"score": score,
	"level": level,
	"factors": factor_list,
}

# (sort(factors), not a comprehension: naming factors outside one lets partial
# evaluation with the data (opa build -O=1) rewrite the factor rules, their risk
# settings folded into constants, instead of keeping them as written, which
# merged config.risk (object.union) on every decision)
factor_list := sort(factors)

# every argument the rule names has one of the listed values
arguments_match(rule) if {
	every name, values in object.get(rule, "arguments", {}) {
		input.arguments[name] in values
	}
}

# reached_tag_guests[tag]: the ids of the guests the call reaches besides its target carrying the tag
reached_tag_guests[tag] := sort({sprintf("%v", [g.vmid]) | some g in lib.beyond_target; tag in lib.tags_of(g)}) if {
	some guest in lib.beyond_target
	some tag in lib.tags_of(guest)
}
