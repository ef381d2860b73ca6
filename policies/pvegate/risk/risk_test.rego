package pvegate.risk_test

import data.pvegate.fixtures_test as fx
import data.pvegate.risk

factor_names(inp) := {f.name | some f in fs} if {
	fs := risk.factors with input as inp
}

test_read_is_low_without_factors if {
	inp := fx.call(fx.viewer, fx.guest_config_tool, fx.prod_guest)
	risk.result == {"score": 0, "level": "low", "factors": []} with input as inp
}

test_write_on_prod_ha_guest_is_high if {
	inp := fx.call(fx.agent, fx.vm_stop, fx.prod_guest)
	risk.score == 50 with input as inp
	risk.level == "high" with input as inp
	factor_names(inp) == {"effect:write", "target_tag:prod", "ha_managed"}
}

test_write_on_plain_guest_is_low if {
	risk.level == "low" with input as fx.call(fx.agent, fx.vm_stop, fx.web_guest)
}

test_destroy_is_medium if {
	risk.level == "medium" with input as fx.call(fx.admin, fx.guest_delete, fx.lab_guest)
}

test_blast_radius_for_node_scope if {
	inp := fx.call(fx.admin, fx.node_network_update, fx.node_target)
	"blast_radius:node" in factor_names(inp)
	risk.score == 40 with input as inp
}

test_off_hours_adds_points if {
	inp := fx.call_at(fx.agent, fx.vm_stop, fx.web_guest, fx.wed_2310)
	"off_hours" in factor_names(inp)
	risk.score == 30 with input as inp
	risk.level == "medium" with input as inp
}

test_unknown_target_adds_points if {
	"unknown_target" in factor_names(fx.call(fx.agent, fx.vm_stop, fx.unknown_target))
}

test_dry_run_lowers_score if {
	inp := object.union(fx.call(fx.agent, fx.vm_stop, fx.prod_guest), {"dry_run": true})
	"dry_run" in factor_names(inp)
	risk.score == 20 with input as inp
}

test_score_is_clamped if {
	inp := object.union(fx.call(fx.viewer, fx.guest_config_tool, fx.prod_guest), {"dry_run": true})
	risk.score == 0 with input as inp with data.data.risk.effect_points.read as -50

	inp2 := fx.call(fx.admin, fx.guest_delete, fx.prod_guest)
	risk.score == 100 with input as inp2 with data.data.risk.effect_points.destroy as 200
	risk.level == "critical" with input as inp2 with data.data.risk.effect_points.destroy as 200
}

test_levels_follow_thresholds if {
	inp := fx.call(fx.agent, fx.vm_stop, fx.prod_guest)
	risk.level == "critical" with input as inp with data.data.risk.level_thresholds as {"medium": 10, "high": 20, "critical": 30}
}

test_defaults_without_data if {
	inp := fx.call(fx.agent, fx.vm_stop, fx.prod_guest)
	risk.score == 50 with input as inp with data.data as {}
}

# each threshold starts its level; one point under it is the level below
test_level_boundaries if {
	expected := {0: "low", 24: "low", 25: "medium", 49: "medium", 50: "high", 74: "high", 75: "critical", 100: "critical"}
	every s, level in expected {
		risk.level == level with risk.score as s
	}
}
