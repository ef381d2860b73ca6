"""Proxmox VE SDN (PVE::API2::Network::SDN::*): zones, vnets and subnets, IPAM, apply.

PVE keeps two copies: the configuration every change edits (/etc/pve/sdn/*.cfg) and the
running configuration `PUT /cluster/sdn` writes from it (a task that reloads every node's
network). Listings show the configuration; `running=1` the running copy; `pending=1` the
union with each object's `state` (new, changed, deleted) and, for changes, the `pending`
values. A subnet's id is <zone>-<network>-<prefix length>.
"""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

from gateway.sim.errors import ApiError
from gateway.sim.handlers_firewall import digest_of
from gateway.sim.routes import Ctx, route
from gateway.sim.state import Cluster

KINDS = ("zones", "vnets", "subnets")
KEY = {"zones": "zone", "vnets": "vnet", "subnets": "subnet"}


def state(cl: Cluster) -> dict[str, Any]:
    sdn = cl.sdn
    for copy_name in ("config", "running"):
        sdn.setdefault(copy_name, {k: {} for k in KINDS})
    sdn.setdefault("ipams", {"pve": {"ipam": "pve", "type": "pve"}})
    return sdn


def _param_error(field: str, message: str) -> ApiError:
    return ApiError(400, "Parameter verification failed.", {field: message})


def _rows(ctx: Ctx, kind: str, keep: Any = None) -> list[dict[str, Any]]:
    sdn = state(ctx.rt.cluster)
    cfg, run = sdn["config"][kind], sdn["running"][kind]
    digest = digest_of(cfg)
    rows: list[dict[str, Any]] = []
    if ctx.params.get("running"):
        rows = [dict(v) for _, v in sorted(run.items())]
    elif ctx.params.get("pending"):
        for oid in sorted(set(cfg) | set(run)):
            if oid not in run:
                rows.append({**cfg[oid], "state": "new"})
            elif oid not in cfg:
                rows.append({**run[oid], "state": "deleted"})
            else:
                changed = {k: v for k, v in cfg[oid].items() if run[oid].get(k) != v}
                row = dict(run[oid])
                if changed or set(run[oid]) - set(cfg[oid]):
                    row.update(state="changed", pending=changed)
                rows.append(row)
    else:
        rows = [dict(v) for _, v in sorted(cfg.items())]
    out = []
    for r in rows:
        if keep is not None and not keep(r):
            continue
        if kind == "vnets" and not ctx.can(f"/sdn/zones/{r.get('zone')}/{r['vnet']}", "SDN.Audit", "SDN.Allocate"):
            continue
        if kind == "zones" and not ctx.can(f"/sdn/zones/{r['zone']}", "SDN.Audit", "SDN.Allocate"):
            continue
        out.append({**r, "digest": digest})
    return out


def _cfg(cl: Cluster, kind: str) -> dict[str, Any]:
    return state(cl)["config"][kind]  # type: ignore[no-any-return]


# ---- zones ---------------------------------------------------------------------------

ZONE_FIELDS = ("bridge", "tag", "mtu", "nodes", "ipam", "peers")


@route("GET", "/cluster/sdn/zones")
def get_zones(ctx: Ctx) -> Any:
    want = ctx.params.get("type")
    return _rows(ctx, "zones", (lambda r: r.get("type") == want) if want else None)


@route("GET", "/cluster/sdn/zones/{zone}")
def get_zone(ctx: Ctx) -> Any:
    z = _cfg(ctx.rt.cluster, "zones").get(str(ctx.params["zone"]))
    if z is None:
        raise ApiError(500, f"sdn '{ctx.params['zone']}' does not exist")
    return dict(z)


def _check_zone(cl: Cluster, z: dict[str, Any]) -> None:
    kind = z["type"]
    if kind in ("vlan", "qinq") and not z.get("bridge"):
        raise _param_error("bridge", "missing bridge")
    if kind == "qinq" and not z.get("tag"):
        raise _param_error("tag", "missing service vlan tag")
    if kind == "vxlan" and not z.get("peers"):
        raise _param_error("peers", "missing peers")
    if z.get("ipam") and z["ipam"] not in state(cl)["ipams"]:
        raise _param_error("ipam", f"ipam '{z['ipam']}' does not exist")
    for n in [n for n in str(z.get("nodes") or "").split(",") if n]:
        if n not in cl.nodes:
            raise _param_error("nodes", f"node '{n}' does not exist")


@route("POST", "/cluster/sdn/zones")
def post_zone(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    zones = _cfg(cl, "zones")
    zid = str(ctx.params["zone"])
    if zid in zones:
        raise ApiError(500, f"{ctx.params['type']} sdn zone object ID '{zid}' already defined")
    z = {"zone": zid, "type": ctx.params["type"], **{k: ctx.params[k] for k in ZONE_FIELDS if k in ctx.params}}
    z.setdefault("ipam", "pve")
    _check_zone(cl, z)
    zones[zid] = z
    cl.touch()
    return None


@route("PUT", "/cluster/sdn/zones/{zone}")
def put_zone(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    zones = _cfg(cl, "zones")
    zid = str(ctx.params["zone"])
    if zid not in zones:
        raise ApiError(500, f"sdn zone '{zid}' does not exist")
    if ctx.params.get("digest") and ctx.params["digest"] != digest_of(zones):
        raise ApiError(500, "detected modified configuration - file changed by other user? Try again.")
    z = dict(zones[zid])
    for k in [d for d in str(ctx.params.get("delete", "")).split(",") if d]:
        z.pop(k, None)
    z.update({k: ctx.params[k] for k in ZONE_FIELDS if k in ctx.params})
    _check_zone(cl, z)
    zones[zid] = z
    cl.touch()
    return None


@route("DELETE", "/cluster/sdn/zones/{zone}")
def delete_zone(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    zones = _cfg(cl, "zones")
    zid = str(ctx.params["zone"])
    if zid not in zones:
        raise ApiError(500, f"sdn zone '{zid}' does not exist")
    used = sorted(v for v, vn in _cfg(cl, "vnets").items() if vn.get("zone") == zid)
    if used:
        raise ApiError(500, f"Can't delete zone {zid}: vnet {used[0]} is still using it")
    del zones[zid]
    cl.touch()
    return None


# ---- vnets ------------------------------------------------------------------------------

VNET_FIELDS = ("tag", "alias", "vlanaware")


def _check_vnet(cl: Cluster, v: dict[str, Any]) -> None:
    zone = _cfg(cl, "zones").get(str(v.get("zone")))
    if zone is None:
        raise _param_error("zone", f"zone '{v.get('zone')}' does not exist")
    tag = v.get("tag")
    if zone["type"] in ("vlan", "qinq"):
        if tag is None:
            raise _param_error("tag", "missing vlan tag")
        if not 1 <= int(tag) <= 4094:
            raise _param_error("tag", "vlan tag must be between 1 and 4094")
    elif zone["type"] in ("vxlan", "evpn"):
        if tag is None:
            raise _param_error("tag", "missing vxlan tag")
    elif tag is not None:
        raise _param_error("tag", "tag is not allowed on a simple zone")


def _vnet(cl: Cluster, vid: str) -> dict[str, Any]:
    v = _cfg(cl, "vnets").get(vid)
    if v is None:
        raise ApiError(500, f"sdn vnet '{vid}' does not exist")
    return v  # type: ignore[no-any-return]


@route("GET", "/cluster/sdn/vnets")
def get_vnets(ctx: Ctx) -> Any:
    return _rows(ctx, "vnets")


@route("GET", "/cluster/sdn/vnets/{vnet}")
def get_vnet_one(ctx: Ctx) -> Any:
    return dict(_vnet(ctx.rt.cluster, str(ctx.params["vnet"])))


@route("POST", "/cluster/sdn/vnets")
def post_vnet(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    vnets = _cfg(cl, "vnets")
    vid = str(ctx.params["vnet"])
    if vid in vnets:
        raise ApiError(500, f"sdn vnet object ID '{vid}' already defined")
    if vid in _cfg(cl, "zones"):
        raise ApiError(500, f"vnet '{vid}' can't have the same name as a zone")
    v = {
        "vnet": vid,
        "type": "vnet",
        "zone": ctx.params["zone"],
        **{k: ctx.params[k] for k in VNET_FIELDS if k in ctx.params},
    }
    _check_vnet(cl, v)
    vnets[vid] = v
    cl.touch()
    return None


@route("PUT", "/cluster/sdn/vnets/{vnet}")
def put_vnet(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    vid = str(ctx.params["vnet"])
    v = dict(_vnet(cl, vid))
    ctx.require(f"/sdn/zones/{v['zone']}/{vid}", "SDN.Allocate")
    for k in [d for d in str(ctx.params.get("delete", "")).split(",") if d]:
        v.pop(k, None)
    v.update({k: ctx.params[k] for k in (*VNET_FIELDS, "zone") if k in ctx.params})
    _check_vnet(cl, v)
    _cfg(cl, "vnets")[vid] = v
    cl.touch()
    return None


@route("DELETE", "/cluster/sdn/vnets/{vnet}")
def delete_vnet(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    vid = str(ctx.params["vnet"])
    v = _vnet(cl, vid)
    ctx.require(f"/sdn/zones/{v['zone']}/{vid}", "SDN.Allocate")
    if any(s.get("vnet") == vid for s in _cfg(cl, "subnets").values()):
        raise _param_error("vnet", "Can't delete vnet if subnets exists")
    del _cfg(cl, "vnets")[vid]
    cl.touch()
    return None


# ---- subnets -------------------------------------------------------------------------------


def _subnet_id(zone: str, net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    return f"{zone}-{net.network_address}-{net.prefixlen}"


@route("GET", "/cluster/sdn/vnets/{vnet}/subnets")
def get_subnets(ctx: Ctx) -> Any:
    vid = str(ctx.params["vnet"])
    _vnet(ctx.rt.cluster, vid)
    return _rows(ctx, "subnets", lambda r: r.get("vnet") == vid)


@route("POST", "/cluster/sdn/vnets/{vnet}/subnets")
def post_subnet(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    vid = str(ctx.params["vnet"])
    v = _vnet(cl, vid)
    ctx.require(f"/sdn/zones/{v['zone']}/{vid}", "SDN.Allocate")
    try:
        net = ipaddress.ip_network(str(ctx.params["subnet"]), strict=False)
    except ValueError:
        raise _param_error("subnet", "invalid format - value does not look like a valid CIDR network") from None
    sid = _subnet_id(str(v["zone"]), net)
    subnets = _cfg(cl, "subnets")
    if sid in subnets:
        raise ApiError(500, f"sdn subnet object ID '{sid}' already defined")
    s: dict[str, Any] = {
        "subnet": sid, "type": "subnet", "vnet": vid, "zone": v["zone"], "cidr": str(net),
        "network": str(net.network_address), "mask": str(net.prefixlen),
    }  # fmt: skip
    s.update({k: ctx.params[k] for k in ("gateway", "snat") if k in ctx.params})
    _check_gateway(s, net)
    subnets[sid] = s
    cl.touch()
    return None


def _check_gateway(s: dict[str, Any], net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> None:
    gw = s.get("gateway")
    if gw and ipaddress.ip_address(str(gw)) not in net:
        raise _param_error("gateway", f"gateway {gw} is not part of subnet {net}")


def _subnet(ctx: Ctx) -> dict[str, Any]:
    cl = ctx.rt.cluster
    vid, sid = str(ctx.params["vnet"]), str(ctx.params["subnet"])
    v = _vnet(cl, vid)
    ctx.require(f"/sdn/zones/{v['zone']}/{vid}", "SDN.Allocate")
    s = _cfg(cl, "subnets").get(sid)
    if s is None or s.get("vnet") != vid:
        raise ApiError(500, f"sdn subnet '{sid}' does not exist in vnet '{vid}'")
    return s  # type: ignore[no-any-return]


@route("GET", "/cluster/sdn/vnets/{vnet}/subnets/{subnet}")
def get_subnet(ctx: Ctx) -> Any:
    return dict(_subnet(ctx))


@route("PUT", "/cluster/sdn/vnets/{vnet}/subnets/{subnet}")
def put_subnet(ctx: Ctx) -> Any:
    s = dict(_subnet(ctx))
    for k in [d for d in str(ctx.params.get("delete", "")).split(",") if d]:
        s.pop(k, None)
    s.update({k: ctx.params[k] for k in ("gateway", "snat") if k in ctx.params})
    _check_gateway(s, ipaddress.ip_network(s["cidr"]))
    _cfg(ctx.rt.cluster, "subnets")[s["subnet"]] = s
    ctx.rt.cluster.touch()
    return None


@route("DELETE", "/cluster/sdn/vnets/{vnet}/subnets/{subnet}")
def delete_subnet(ctx: Ctx) -> Any:
    s = _subnet(ctx)
    del _cfg(ctx.rt.cluster, "subnets")[s["subnet"]]
    ctx.rt.cluster.touch()
    return None


# ---- apply and IPAM ----------------------------------------------------------------------------


@route("PUT", "/cluster/sdn")
def put_sdn(ctx: Ctx) -> Any:
    """Apply: the running copy becomes the configuration, every node reloads its network."""
    cl = ctx.rt.cluster
    sdn = state(cl)

    def work() -> list[str]:
        sdn["running"] = copy.deepcopy(sdn["config"])
        cl.touch()
        return [f"{n}: reloading network config" for n in sorted(cl.nodes) if ctx.rt.node_online(n)]

    return ctx.rt.tasks.start(cl.local_node(), "reloadnetworkall", "", ctx.user, work).upid


@route("GET", "/cluster/sdn/ipams")
def get_ipams(ctx: Ctx) -> Any:
    ipams = state(ctx.rt.cluster)["ipams"]
    digest = digest_of(ipams)
    want = ctx.params.get("type")
    return [{**i, "digest": digest} for _, i in sorted(ipams.items()) if not want or i["type"] == want]


@route("POST", "/cluster/sdn/ipams")
def post_ipam(ctx: Ctx) -> Any:
    """An external IPAM (netbox, phpipam) carries its API token in the SDN configuration."""
    ipams = state(ctx.rt.cluster)["ipams"]
    name = str(ctx.params["ipam"])
    if name in ipams:
        raise ApiError(500, f"{ctx.params['type']} sdn ipam object ID '{name}' already defined")
    if ctx.params["type"] != "pve" and not (ctx.params.get("url") and ctx.params.get("token")):
        raise _param_error("url", f"{ctx.params['type']} needs url and token")
    entry: dict[str, Any] = {"ipam": name}
    entry.update({k: ctx.params[k] for k in ("type", "url", "token", "section") if k in ctx.params})
    ipams[name] = entry
    ctx.rt.cluster.touch()
    return None


@route("GET", "/cluster/sdn/ipams/{ipam}/status")
def get_ipam_status(ctx: Ctx) -> Any:
    """The built-in IPAM's allocations: each running subnet's gateway, and guests on its vnet."""
    cl = ctx.rt.cluster
    name = str(ctx.params["ipam"])
    if name not in state(cl)["ipams"]:
        raise ApiError(500, f"sdn ipam '{name}' does not exist")
    running = state(cl)["running"]
    out: list[dict[str, Any]] = []
    for s in sorted(running["subnets"].values(), key=lambda s: s["subnet"]):
        zone = running["zones"].get(s["zone"], {})
        if zone.get("ipam", "pve") != name:
            continue
        net = ipaddress.ip_network(s["cidr"])
        where = {"zone": s["zone"], "vnet": s["vnet"], "subnet": s["cidr"]}
        if s.get("gateway"):
            out.append({**where, "ip": s["gateway"], "gateway": 1})
        for g in sorted(cl.guests.values(), key=lambda g: g.vmid):
            for itf in g.interfaces:
                inet = str(itf.get("inet") or "").split("/")[0]
                on_vnet = any(f"bridge={s['vnet']}" in str(v) for k, v in g.config.items() if k.startswith("net"))
                if inet and on_vnet and ipaddress.ip_address(inet) in net:
                    out.append({**where, "ip": inet, "mac": itf["hwaddr"], "hostname": g.name, "vmid": g.vmid})
    return out
