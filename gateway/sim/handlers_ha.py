"""The HA manager's API (pve-ha-manager PVE::API2::HA::*): resources, groups, rules, status.

An HA resource is the guest's `Guest.ha` (the read handlers already list them); PVE 8
has groups (`Cluster.ha_groups`), PVE 9 migrated them to rules (`Cluster.ha_rules`): on a
9.x simulator a group create or change dies as PVE 9 does after the migration, and the
`group` property of a resource is refused. Migrate and relocate are requests to the CRM
(the API answers at once); the simulator carries them out at once.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.sim.errors import ApiError
from gateway.sim.handlers_read import config_digest
from gateway.sim.handlers_write import _set_running
from gateway.sim.routes import Ctx, route
from gateway.sim.state import Cluster, Guest

MIGRATED = "ha groups have been migrated to rules"
RESOURCE_FIELDS = ("state", "group", "max_restart", "max_relocate", "comment", "failback")


def _guest_of(cl: Cluster, sid: str) -> Guest:
    """A sid is vm:100, ct:100 or a plain vmid (pve-ha-resource-or-vm-id)."""
    kind, _, num = sid.rpartition(":")
    g = cl.guests.get(int(num)) if num.isdigit() else None
    if g is None or (kind and kind != ("vm" if g.type == "qemu" else "ct")):
        raise ApiError(500, f"unable to find VM/CT {num or sid}")
    return g


def _managed(cl: Cluster, sid: str) -> Guest:
    g = _guest_of(cl, sid)
    if not g.ha:
        raise ApiError(500, f"service '{g.sid}' not defined")
    return g


def _check_group(cl: Cluster, params: dict[str, Any]) -> None:
    if "group" not in params:
        return
    if cl.major >= 9:
        raise ApiError(400, "Parameter verification failed.", {"group": f"{MIGRATED}, use node affinity rules"})
    if params["group"] not in cl.ha_groups:
        raise ApiError(500, f"group '{params['group']}' does not exist")


def _view(g: Guest, major: int) -> dict[str, Any]:
    ha = g.ha or {}
    d: dict[str, Any] = {
        "sid": g.sid,
        "type": "vm" if g.type == "qemu" else "ct",
        "state": ha.get("state", "started"),
        "max_restart": ha.get("max_restart", 1),
        "max_relocate": ha.get("max_relocate", 1),
        "digest": config_digest(ha),
    }
    for k in ("comment", "group" if major < 9 else "failback"):
        if k in ha:
            d[k] = ha[k]
    if major >= 9:
        d.setdefault("failback", 1)
    return d


@route("GET", "/cluster/ha/resources/{sid}")
def get_resource(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    return _view(_managed(cl, str(ctx.params["sid"])), cl.major)


@route("POST", "/cluster/ha/resources")
def post_resource(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    g = _guest_of(cl, str(ctx.params["sid"]))
    if g.ha:
        raise ApiError(500, f"resource ID '{g.sid}' already defined")
    _check_group(cl, ctx.params)
    g.ha = {"state": "started", "max_restart": 1, "max_relocate": 1}
    g.ha.update({k: ctx.params[k] for k in RESOURCE_FIELDS if k in ctx.params})
    _enforce(g)
    cl.touch()
    return None


@route("PUT", "/cluster/ha/resources/{sid}")
def put_resource(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    g = _managed(cl, str(ctx.params["sid"]))
    assert g.ha is not None
    if ctx.params.get("digest") and ctx.params["digest"] != config_digest(g.ha):
        raise ApiError(500, "detected modified configuration - file changed by other user? Try again.")
    _check_group(cl, ctx.params)
    for k in [d for d in str(ctx.params.get("delete", "")).split(",") if d]:
        g.ha.pop(k, None)
    g.ha.update({k: ctx.params[k] for k in RESOURCE_FIELDS if k in ctx.params})
    _enforce(g)
    cl.touch()
    return None


@route("DELETE", "/cluster/ha/resources/{sid}")
def delete_resource(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    g = _guest_of(cl, str(ctx.params["sid"]))
    if not g.ha:
        raise ApiError(500, f"cannot delete service '{g.sid}', not HA managed!")
    g.ha = None
    for rule in cl.ha_rules.values():  # PVE 9 with purge (the default): the resource leaves its rules
        rule["resources"] = ",".join(r for r in str(rule.get("resources", "")).split(",") if r != g.sid)
    cl.touch()
    return None


def _enforce(g: Guest) -> None:
    """The CRM's reaction, at once: started runs the guest, stopped/disabled stop it."""
    state = (g.ha or {}).get("state")
    if state == "started" and g.status != "running":
        _set_running(g)
    elif state in ("stopped", "disabled") and g.status != "stopped":
        g.status = "stopped"
        g.pid = 0


def _move(ctx: Ctx, restart: bool) -> Any:
    cl = ctx.rt.cluster
    g = _managed(cl, str(ctx.params["sid"]))
    target = str(ctx.params["node"])
    if target not in cl.nodes:
        raise ApiError(500, f"no such node '{target}'")
    if not ctx.rt.node_online(target):
        raise ApiError(500, f"node '{target}' is not online")
    if (g.ha or {}).get("state") in ("disabled", "ignored"):
        raise ApiError(500, f"service '{g.sid}' is in state '{g.ha and g.ha.get('state')}', cannot be moved")
    if target != g.node:
        g.node = target
        if restart and g.status == "running":
            g.status = "stopped"
            _set_running(g)
        cl.touch()
    return None


@route("POST", "/cluster/ha/resources/{sid}/migrate")
def post_migrate(ctx: Ctx) -> Any:
    return _move(ctx, restart=False)


@route("POST", "/cluster/ha/resources/{sid}/relocate")
def post_relocate(ctx: Ctx) -> Any:
    return _move(ctx, restart=True)


# ---- groups (PVE 8) ---------------------------------------------------------------------

GROUP_FIELDS = ("nodes", "restricted", "nofailback", "comment")


def _group_nodes(cl: Cluster, nodes: str) -> None:
    for item in nodes.split(","):
        name = item.split(":", 1)[0]
        if name not in cl.nodes:
            raise ApiError(400, "Parameter verification failed.", {"nodes": f"node '{name}' does not exist"})


@route("POST", "/cluster/ha/groups")
def post_group(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    if cl.major >= 9:
        raise ApiError(500, f"cannot create ha group: {MIGRATED}")
    name = str(ctx.params["group"])
    if name in cl.ha_groups:
        raise ApiError(500, f"group ID '{name}' already defined")
    _group_nodes(cl, str(ctx.params["nodes"]))
    cl.ha_groups[name] = {"group": name, **{k: ctx.params[k] for k in GROUP_FIELDS if k in ctx.params}}
    cl.touch()
    return None


def _group(cl: Cluster, name: str) -> dict[str, Any]:
    if cl.major >= 9:
        raise ApiError(500, f"cannot change ha group: {MIGRATED}")
    grp = cl.ha_groups.get(name)
    if grp is None:
        raise ApiError(500, f"no such ha group '{name}'")
    return grp


@route("GET", "/cluster/ha/groups/{group}")
def get_group(ctx: Ctx) -> Any:
    grp = ctx.rt.cluster.ha_groups.get(str(ctx.params["group"]))
    if grp is None:
        raise ApiError(500, f"no such ha group '{ctx.params['group']}'")
    return {**grp, "type": "group", "digest": config_digest(grp)}


@route("PUT", "/cluster/ha/groups/{group}")
def put_group(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    grp = _group(cl, str(ctx.params["group"]))
    if "nodes" in ctx.params:
        _group_nodes(cl, str(ctx.params["nodes"]))
    grp.update({k: ctx.params[k] for k in GROUP_FIELDS if k in ctx.params})
    cl.touch()
    return None


@route("DELETE", "/cluster/ha/groups/{group}")
def delete_group(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    name = str(ctx.params["group"])
    _group(cl, name)
    users = sorted(g.sid for g in cl.guests.values() if g.ha and g.ha.get("group") == name)
    if users:
        raise ApiError(500, f"ha group '{name}' is used by service '{users[0]}'")
    del cl.ha_groups[name]
    cl.touch()
    return None


# ---- rules (PVE 9) ------------------------------------------------------------------------

RULE_FIELDS = ("resources", "nodes", "affinity", "strict", "disable", "comment")


def _rule_view(name: str, rule: dict[str, Any], digest: str) -> dict[str, Any]:
    return {"rule": name, **rule, "digest": digest}


def _rules_digest(cl: Cluster) -> str:
    return config_digest({k: str(sorted(v.items())) for k, v in cl.ha_rules.items()})


@route("GET", "/cluster/ha/rules")
def get_rules(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    digest = _rules_digest(cl)
    want_type, want_res = ctx.params.get("type"), ctx.params.get("resource")
    return [
        _rule_view(n, r, digest)
        for n, r in sorted(cl.ha_rules.items())
        if (not want_type or r["type"] == want_type) and (not want_res or want_res in r["resources"].split(","))
    ]


@route("GET", "/cluster/ha/rules/{rule}")
def get_rule(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    name = str(ctx.params["rule"])
    if name not in cl.ha_rules:
        raise ApiError(500, f"no such ha rule '{name}'")
    return _rule_view(name, cl.ha_rules[name], _rules_digest(cl))


def _check_rule(cl: Cluster, rule: dict[str, Any]) -> None:
    errors: dict[str, str] = {}
    resources = [r for r in str(rule.get("resources", "")).split(",") if r]
    for sid in resources:
        try:
            g = _guest_of(cl, sid)
        except ApiError:
            errors["resources"] = f"resource '{sid}' does not exist"
            continue
        if not g.ha:
            errors["resources"] = f"resource '{sid}' is not HA managed"
    if rule["type"] == "node-affinity":
        if not rule.get("nodes"):
            errors["nodes"] = "property is missing and it is not optional"
        else:
            for item in str(rule["nodes"]).split(","):
                if item.split(":", 1)[0] not in cl.nodes:
                    errors["nodes"] = f"node '{item.split(':', 1)[0]}' does not exist"
    else:
        if rule.get("affinity") not in ("positive", "negative"):
            errors["affinity"] = "property is missing and it is not optional"
        if len(resources) < 2:
            errors["resources"] = "a resource affinity rule needs at least two resources"
    if errors:
        raise ApiError(400, "Parameter verification failed.", errors)


@route("POST", "/cluster/ha/rules")
def post_rule(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    name = str(ctx.params["rule"])
    if name in cl.ha_rules:
        raise ApiError(500, f"rule '{name}' already defined")
    rule = {"type": ctx.params["type"], **{k: ctx.params[k] for k in RULE_FIELDS if k in ctx.params}}
    _check_rule(cl, rule)
    cl.ha_rules[name] = rule
    cl.touch()
    return None


@route("PUT", "/cluster/ha/rules/{rule}")
def put_rule(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    name = str(ctx.params["rule"])
    rule = cl.ha_rules.get(name)
    if rule is None:
        raise ApiError(500, f"no such ha rule '{name}'")
    if ctx.params["type"] != rule["type"]:
        raise ApiError(400, "Parameter verification failed.", {"type": "cannot change the type of a rule"})
    new = dict(rule)
    for k in [d for d in str(ctx.params.get("delete", "")).split(",") if d]:
        new.pop(k, None)
    new.update({k: ctx.params[k] for k in RULE_FIELDS if k in ctx.params})
    _check_rule(cl, new)
    cl.ha_rules[name] = new
    cl.touch()
    return None


@route("DELETE", "/cluster/ha/rules/{rule}")
def delete_rule(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    name = str(ctx.params["rule"])
    if cl.ha_rules.pop(name, None) is None:
        raise ApiError(500, f"no such ha rule '{name}'")
    cl.touch()
    return None


# ---- manager status -------------------------------------------------------------------------


@route("GET", "/cluster/ha/status/manager_status")
def get_manager_status(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    online = [n for n in cl.nodes if ctx.rt.node_online(n)]
    master = online[0] if online else next(iter(cl.nodes))
    now = int(time.time())
    services = {
        g.sid: {"node": g.node, "state": (g.ha or {}).get("state", "started"), "uid": f"{g.vmid:08x}"}
        for g in sorted(cl.guests.values(), key=lambda g: g.vmid)
        if g.ha
    }
    managed_nodes = {s["node"] for s in services.values()}
    return {
        "manager_status": {
            "master_node": master,
            "node_status": {n: "online" if n in online else "unknown" for n in cl.nodes},
            "service_status": services,
            "timestamp": now,
        },
        "lrm_status": {n: _lrm(n in managed_nodes, n in online, now) for n in cl.nodes},
        "quorum": {"node": master, "quorate": "1" if len(online) * 2 > len(cl.nodes) else "0"},
    }


def _lrm(managing: bool, online: bool, now: int) -> dict[str, Any]:
    return {
        "mode": "active" if managing else "idle",
        "state": "active" if managing else "wait_for_agent_lock",
        "timestamp": now if online else now - 3600,
    }
