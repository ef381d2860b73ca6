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

# critical calls are looked up by the tools they name (risk.critical_index): one naming a tool,
# one naming tools by a glob, one naming none, one with argument values, one for agents on
# prod guests all match as their selectors say
critical_names(inp) := {n | some n in names; startswith(n, "critical_call:")} if {
	names := factor_names(inp) with data.data.risk.critical_calls as [
		{"name": "named", "tools": ["vm_stop"], "reason": "r"},
		{"name": "glob", "tools": ["lxc_*"], "reason": "r"},
		{"name": "domain", "domains": ["guest"], "effects": ["write"], "reason": "r"},
		{"name": "forced", "tools": ["vm_stop"], "arguments": {"force": [true]}, "reason": "r"},
		{"name": "agents", "principal_kinds": ["agent"], "target_tags": ["prod"], "reason": "r"},
	]
}

test_critical_calls_by_selector if {
	stop := fx.call(fx.agent, fx.vm_stop, fx.prod_guest)
	critical_names(stop) == {"critical_call:named", "critical_call:domain", "critical_call:agents"}
	forced := object.union(stop, {"arguments": {"force": true}})
	critical_names(forced) == {"critical_call:named", "critical_call:domain", "critical_call:agents", "critical_call:forced"}
	critical_names(fx.call(fx.agent, fx.lxc_start, fx.lab_guest)) == {"critical_call:glob"}
	critical_names(fx.call(fx.admin, fx.vm_stop, fx.lab_guest)) == {"critical_call:named", "critical_call:domain"}
	critical_names(fx.call(fx.agent, fx.guest_config_tool, fx.prod_guest)) == set()
}

# a critical call is critical whatever else the call scores: other factors worth points
# below zero (a tag the data scores -30) must not bring it down to high, where it would
# wait for one approver instead of the critical level's two; a dry run stays scored
test_critical_call_stays_critical_under_negative_points if {
	crit := [{"name": "stop", "tools": ["vm_stop"], "reason": "r"}]
	stop := fx.call(fx.admin, fx.vm_stop, fx.lab_guest)
	risk.level == "critical" with input as stop with data.data.risk.critical_calls as crit
		with data.data.risk.target_tag_points as {"lab": -60}
	risk.score < 75 with input as stop with data.data.risk.critical_calls as crit
		with data.data.risk.target_tag_points as {"lab": -60}
	dry := object.union(stop, {"dry_run": true})
	risk.level == "low" with input as dry with data.data.risk.critical_calls as crit
		with data.data.risk.target_tag_points as {"lab": -60}
}

# --- the tags of the guests a call reaches besides its target ----------------------------------
# A replication job's delete, a volume's delete, a prune and a pool move name the cluster, a
# storage or a node as their target, which has no tags: a critical guest they reach must weigh as
# much as one they target (deleting a critical guest's replicas is critical: two approvers).

replication_delete := fx.tool("replication_job_delete", "cluster", "write", "cluster", ["replication"])

cluster_target := object.union(fx.unknown_target, {"known": true})

reaching(key, guests) := object.union(cluster_target, {key: {"known": true, "guests": guests}})

reached(vmid, tags) := {"vmid": vmid, "node": "pve1", "pool": "db", "pool_known": true, "tags": tags, "exists": true}

test_a_reached_guests_tags_count_as_the_targets if {
	inp := fx.call(fx.admin, replication_delete, reaching("members", [reached(100, ["critical", "prod"])]))
	risk.score == 95 with input as inp
	risk.level == "critical" with input as inp
	factor_names(inp) == {"effect:write", "blast_radius:cluster", "target_tag:critical", "target_tag:prod"}
	whys := {f.why | some f in risk.factors; f.name == "target_tag:critical"} with input as inp
	whys == {"guest 100, which the call reaches, is tagged \"critical\""}
}

test_a_tag_counts_once_however_many_guests_carry_it if {
	guests := [reached(100, ["critical"]), reached(101, ["critical"]), reached(102, [])]
	inp := fx.call(fx.admin, replication_delete, reaching("members", guests))
	risk.score == 75 with input as inp
	whys := {f.why | some f in risk.factors; f.name == "target_tag:critical"} with input as inp
	whys == {"guest 100, 101, which the call reaches, is tagged \"critical\""}

	# the target's own tag is counted once, as the target's
	on_target := object.union(fx.prod_guest, {"members": {"known": true, "guests": [reached(100, ["prod"])]}})
	factor_names(fx.call(fx.agent, fx.vm_stop, on_target)) == {"effect:write", "target_tag:prod", "ha_managed"}
}

test_a_pruned_or_deleted_volumes_guest_counts if {
	prune := fx.tool("backup_prune", "backup", "destroy", "storage", ["backup", "prune"])
	pruned := fx.call(fx.admin, prune, reaching("prune_removes", [reached(100, ["critical"])]))
	"target_tag:critical" in factor_names(pruned)
	risk.level == "critical" with input as pruned

	delete := fx.tool("storage_volume_delete", "storage", "destroy", "storage", ["content"])
	volume := object.union(reached(100, ["critical"]), {"volume": "local:backup/vzdump-qemu-100-x.vma.zst", "content": "backup"})
	deleted := fx.call(fx.admin, delete, object.union(cluster_target, {"volume_of": volume}))
	"target_tag:critical" in factor_names(deleted)
	risk.level == "critical" with input as deleted

	# a read reaching them scores nothing
	read := fx.tool("backup_prune_preview", "backup", "read", "storage", ["backup", "prune"])
	factor_names(fx.call(fx.admin, read, reaching("prune_removes", [reached(100, ["critical"])]))) == set()
}
