"""The Proxmox VE firewall, as pve-firewall's API does it (PVE::API2::Firewall::*).

Rules live per level (cluster, node, guest, security group) as ordered lists whose `pos`
is the index; a new rule goes to the top (`unshift`) and is disabled unless `enable` was
passed; update and delete name a position and die with PVE's "no rule at position N";
an optional `digest` must match the list's, or the change dies like
PVE::Tools::assert_if_modified. Cluster and guest rule lists are the ones the read
handlers already serve (`Cluster.firewall_rules`, `guest_firewall_rules`); everything
else is kept in `Cluster.firewall`.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from gateway.sim.errors import ApiError
from gateway.sim.handlers_read import _rules
from gateway.sim.routes import Ctx, both, route
from gateway.sim.state import Cluster

RULE_FIELDS = (
    "type", "action", "source", "dest", "proto", "dport", "sport", "macro", "iface", "log", "comment", "enable",
)  # fmt: skip
BUILTIN_ACTIONS = {"ACCEPT", "DROP", "REJECT"}
MACROS = {"SSH", "HTTP", "HTTPS", "DNS", "Ping", "SMTP", "NTP", "Ceph", "SPICEproxy", "VNC", "MySQL", "PostgreSQL"}
MODIFIED = "detected modified configuration - file changed by other user? Try again."


def state(cl: Cluster) -> dict[str, Any]:
    """Everything but the cluster and guest rule lists, created on first use."""
    fw = cl.firewall
    fw.setdefault("node_rules", {})
    fw.setdefault("aliases", {})
    fw.setdefault("ipsets", {})
    fw.setdefault("groups", {})
    fw.setdefault("options", {})
    return fw


def digest_of(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True).encode(), usedforsecurity=False).hexdigest()


def _assert_digest(ctx: Ctx, current: str) -> None:
    given = ctx.params.get("digest")
    if given and given != current:
        raise ApiError(500, MODIFIED)


def _renumber(rules: list[dict[str, Any]]) -> None:
    for i, r in enumerate(rules):
        r["pos"] = i


# ---- which rule list ------------------------------------------------------------------


def _rule_list(ctx: Ctx) -> list[dict[str, Any]]:
    cl = ctx.rt.cluster
    p = ctx.params
    if "group" in p:
        return _group(cl, str(p["group"]))["rules"]  # type: ignore[no-any-return]
    if "vmid" in p:
        g = ctx.guest("lxc" if "/lxc/" in ctx.path else "qemu")
        return cl.guest_firewall_rules.setdefault(g.vmid, [])
    if "node" in p:
        return state(cl)["node_rules"].setdefault(str(p["node"]), [])  # type: ignore[no-any-return]
    return cl.firewall_rules


def _group(cl: Cluster, name: str) -> dict[str, Any]:
    g = state(cl)["groups"].get(name)
    if g is None:
        raise ApiError(500, f"no such security group '{name}'")
    return g  # type: ignore[no-any-return]


def _verify_rule(ctx: Ctx, rule: dict[str, Any]) -> None:
    """The checks of PVE::Firewall::verify_rule that matter to a caller."""
    cl = ctx.rt.cluster
    errors: dict[str, str] = {}
    kind = rule.get("type")
    action = rule.get("action")
    if kind == "group":
        if "group" in ctx.params:
            errors["type"] = "security groups cannot contain another group"
        elif action not in state(cl)["groups"]:
            errors["action"] = f"no such security group '{action}'"
    elif action is not None and action not in BUILTIN_ACTIONS:
        errors["action"] = f"value '{action}' does not have a value in the enumeration 'ACCEPT, REJECT, DROP'"
    if rule.get("macro") and rule["macro"] not in MACROS:
        errors["macro"] = f"unknown macro '{rule['macro']}'"
    for port in ("dport", "sport"):
        if rule.get(port) and not rule.get("proto") and not rule.get("macro"):
            errors["proto"] = f"missing property - '{port}' requires this property"
    for side in ("source", "dest"):
        for ref in str(rule.get(side) or "").lstrip("!").split(","):
            name = ref.lstrip("+")
            if ref.startswith("+"):
                if name not in state(cl)["ipsets"]:
                    errors[side] = f"no such ipset '{name}'"
            elif name[:1].isalpha() and not set(name) & set(".:") and name.lower() not in state(cl)["aliases"]:
                errors[side] = f"no such alias '{name}'"
    if errors:
        raise ApiError(400, "Parameter verification failed.", errors)


def _create_rule(ctx: Ctx) -> Any:
    rules = _rule_list(ctx)
    rule = {k: ctx.params[k] for k in RULE_FIELDS if k in ctx.params}
    _verify_rule(ctx, rule)
    rule.setdefault("enable", 0)  # PVE: a rule created without `enable` is disabled
    rules.insert(0, rule)
    _renumber(rules)
    ctx.rt.cluster.touch()
    return None


def _at(rules: list[dict[str, Any]], pos: Any) -> int:
    i = int(pos) if pos is not None else -1
    if i < 0 or i >= len(rules):
        raise ApiError(500, f"no rule at position {pos}")
    return i


def _update_rule(ctx: Ctx) -> Any:
    rules = _rule_list(ctx)
    _assert_digest(ctx, _rules(rules)[0]["digest"] if rules else digest_of([]))
    i = _at(rules, ctx.params.get("pos"))
    moveto = ctx.params.get("moveto")
    if moveto is not None:  # PVE: other arguments are ignored; the rule lands before the one at moveto
        rule = rules[i]
        moved = [r for j, r in enumerate(rules) if j != i and j < int(moveto)]
        rules[:] = moved + [rule] + [r for j, r in enumerate(rules) if j != i and j >= int(moveto)]
    else:
        rule = dict(rules[i])
        for k in [d for d in str(ctx.params.get("delete", "")).split(",") if d]:
            rule.pop(k, None)
        rule.update({k: ctx.params[k] for k in RULE_FIELDS if k in ctx.params})
        _verify_rule(ctx, rule)
        rules[i] = rule
    _renumber(rules)
    ctx.rt.cluster.touch()
    return None


def _delete_rule(ctx: Ctx) -> Any:
    rules = _rule_list(ctx)
    _assert_digest(ctx, _rules(rules)[0]["digest"] if rules else digest_of([]))
    del rules[_at(rules, ctx.params.get("pos"))]
    _renumber(rules)
    ctx.rt.cluster.touch()
    return None


def _get_rule(ctx: Ctx) -> Any:
    rules = _rule_list(ctx)
    return _rules(rules)[_at(rules, ctx.params.get("pos"))]


for _base in ("/cluster/firewall/rules", "/nodes/{node}/firewall/rules", "/cluster/firewall/groups/{group}"):
    route("POST", _base)(_create_rule)
for _base in (
    "/cluster/firewall/rules/{pos}",
    "/nodes/{node}/firewall/rules/{pos}",
    "/cluster/firewall/groups/{group}/{pos}",
):
    route("PUT", _base)(_update_rule)
    route("DELETE", _base)(_delete_rule)
    route("GET", _base)(_get_rule)
both("POST", "/nodes/{node}/{kind}/{vmid}/firewall/rules")(_create_rule)
both("PUT", "/nodes/{node}/{kind}/{vmid}/firewall/rules/{pos}")(_update_rule)
both("DELETE", "/nodes/{node}/{kind}/{vmid}/firewall/rules/{pos}")(_delete_rule)
both("GET", "/nodes/{node}/{kind}/{vmid}/firewall/rules/{pos}")(_get_rule)


@route("GET", "/nodes/{node}/firewall/rules")
def get_node_rules(ctx: Ctx) -> Any:
    return _rules(_rule_list(ctx))


# ---- aliases ----------------------------------------------------------------------------


def _alias_rows(cl: Cluster) -> list[dict[str, Any]]:
    aliases = state(cl)["aliases"]
    digest = digest_of(aliases)
    return [{**a, "digest": digest, "ipversion": 6 if ":" in a["cidr"] else 4} for _, a in sorted(aliases.items())]


@route("GET", "/cluster/firewall/aliases")
def get_aliases(ctx: Ctx) -> Any:
    return _alias_rows(ctx.rt.cluster)


@route("GET", "/cluster/firewall/aliases/{name}")
def get_alias(ctx: Ctx) -> Any:
    name = str(ctx.params["name"]).lower()
    row = next((a for a in _alias_rows(ctx.rt.cluster) if a["name"].lower() == name), None)
    if row is None:
        raise ApiError(500, f"no such alias '{ctx.params['name']}'")
    return row


@route("POST", "/cluster/firewall/aliases")
def post_alias(ctx: Ctx) -> Any:
    aliases = state(ctx.rt.cluster)["aliases"]
    name = str(ctx.params["name"])
    if name.lower() in aliases:
        raise ApiError(500, f"alias '{name}' already exists")
    aliases[name.lower()] = {"name": name, "cidr": str(ctx.params["cidr"]), **_comment(ctx)}
    ctx.rt.cluster.touch()
    return None


@route("PUT", "/cluster/firewall/aliases/{name}")
def put_alias(ctx: Ctx) -> Any:
    aliases = state(ctx.rt.cluster)["aliases"]
    _assert_digest(ctx, digest_of(aliases))
    key = str(ctx.params["name"]).lower()
    if key not in aliases:
        raise ApiError(500, f"no such alias '{ctx.params['name']}'")
    aliases[key].update({"cidr": str(ctx.params["cidr"]), **_comment(ctx)})
    ctx.rt.cluster.touch()
    return None


@route("DELETE", "/cluster/firewall/aliases/{name}")
def delete_alias(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    aliases = state(cl)["aliases"]
    _assert_digest(ctx, digest_of(aliases))
    key = str(ctx.params["name"]).lower()
    for where, rule in _all_rules(cl):
        if any(ref.lower() == key for side in ("source", "dest") for ref in str(rule.get(side) or "").split(",")):
            raise ApiError(500, f"alias '{ctx.params['name']}' is used by {where}")
    aliases.pop(key, None)  # PVE: removing a missing alias is not an error
    cl.touch()
    return None


def _all_rules(cl: Cluster) -> list[tuple[str, dict[str, Any]]]:
    fw = state(cl)
    out = [("the cluster firewall", r) for r in cl.firewall_rules]
    out += [(f"node {n}", r) for n, rules in fw["node_rules"].items() for r in rules]
    out += [(f"guest {v}", r) for v, rules in cl.guest_firewall_rules.items() for r in rules]
    out += [(f"security group {g}", r) for g, grp in fw["groups"].items() for r in grp["rules"]]
    return out


def _comment(ctx: Ctx) -> dict[str, Any]:
    return {"comment": ctx.params["comment"]} if "comment" in ctx.params else {}


# ---- IP sets ------------------------------------------------------------------------------


def _ipset(cl: Cluster, name: str) -> dict[str, Any]:
    s = state(cl)["ipsets"].get(name)
    if s is None:
        raise ApiError(500, f"no such IPSet '{name}'")
    return s  # type: ignore[no-any-return]


@route("GET", "/cluster/firewall/ipset")
def get_ipsets(ctx: Ctx) -> Any:
    sets = state(ctx.rt.cluster)["ipsets"]
    digest = digest_of(sets)
    return [{"name": n, "digest": digest, **({"comment": s["comment"]} if s.get("comment") else {})}
            for n, s in sorted(sets.items())]  # fmt: skip


@route("GET", "/cluster/firewall/ipset/{name}")
def get_ipset(ctx: Ctx) -> Any:
    s = _ipset(ctx.rt.cluster, str(ctx.params["name"]))
    digest = digest_of(s["entries"])
    return [{**e, "digest": digest} for e in s["entries"]]


@route("POST", "/cluster/firewall/ipset")
def post_ipset(ctx: Ctx) -> Any:
    sets = state(ctx.rt.cluster)["ipsets"]
    name = str(ctx.params["name"])
    if name in sets:
        raise ApiError(500, f"IPSet '{name}' already exists")
    sets[name] = {"entries": [], **_comment(ctx)}
    ctx.rt.cluster.touch()
    return None


@route("DELETE", "/cluster/firewall/ipset/{name}")
def delete_ipset(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    name = str(ctx.params["name"])
    s = _ipset(cl, name)
    if s["entries"] and not ctx.params.get("force"):
        raise ApiError(500, f"IPSet '{name}' is not empty")
    del state(cl)["ipsets"][name]
    cl.touch()
    return None


@route("POST", "/cluster/firewall/ipset/{name}")
def post_ipset_entry(ctx: Ctx) -> Any:
    s = _ipset(ctx.rt.cluster, str(ctx.params["name"]))
    cidr = str(ctx.params["cidr"])
    if any(e["cidr"] == cidr for e in s["entries"]):
        raise ApiError(500, f"entry '{cidr}' already exists")
    entry: dict[str, Any] = {"cidr": cidr, **_comment(ctx)}
    if ctx.params.get("nomatch"):
        entry["nomatch"] = 1
    s["entries"].append(entry)
    ctx.rt.cluster.touch()
    return None


@route("DELETE", "/cluster/firewall/ipset/{name}/{cidr}")
def delete_ipset_entry(ctx: Ctx) -> Any:
    s = _ipset(ctx.rt.cluster, str(ctx.params["name"]))
    _assert_digest(ctx, digest_of(s["entries"]))
    cidr = str(ctx.params["cidr"])
    kept = [e for e in s["entries"] if e["cidr"] != cidr]
    if len(kept) == len(s["entries"]):
        raise ApiError(500, f"no such IP/Network '{cidr}'")
    s["entries"] = kept
    ctx.rt.cluster.touch()
    return None


# ---- security groups --------------------------------------------------------------------------


@route("GET", "/cluster/firewall/groups")
def get_groups(ctx: Ctx) -> Any:
    groups = state(ctx.rt.cluster)["groups"]
    digest = digest_of(groups)
    return [{"group": n, "digest": digest, **({"comment": g["comment"]} if g.get("comment") else {})}
            for n, g in sorted(groups.items())]  # fmt: skip


@route("GET", "/cluster/firewall/groups/{group}")
def get_group_rules(ctx: Ctx) -> Any:
    return _rules(_group(ctx.rt.cluster, str(ctx.params["group"]))["rules"])


@route("POST", "/cluster/firewall/groups")
def post_group(ctx: Ctx) -> Any:
    groups = state(ctx.rt.cluster)["groups"]
    name = str(ctx.params["group"])
    if name in groups:
        raise ApiError(500, f"Security group '{name}' already exists")
    groups[name] = {"rules": [], **_comment(ctx)}
    ctx.rt.cluster.touch()
    return None


@route("DELETE", "/cluster/firewall/groups/{group}")
def delete_group(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    name = str(ctx.params["group"])
    g = _group(cl, name)
    if g["rules"]:
        raise ApiError(500, f"Security group '{name}' is not empty")
    for where, rule in _all_rules(cl):
        if rule.get("type") == "group" and rule.get("action") == name:
            raise ApiError(500, f"Security group '{name}' is used by {where}")
    del state(cl)["groups"][name]
    cl.touch()
    return None


# ---- options ----------------------------------------------------------------------------------

CLUSTER_DEFAULTS = {"enable": 1, "policy_in": "DROP", "policy_out": "ACCEPT"}
NODE_DEFAULTS = {"enable": 1}


def _options(ctx: Ctx) -> dict[str, Any]:
    cl = ctx.rt.cluster
    opts = state(cl)["options"]
    if "vmid" in ctx.params:
        g = ctx.guest("lxc" if "/lxc/" in ctx.path else "qemu")
        has_rules = bool(cl.guest_firewall_rules.get(g.vmid))
        default = {"enable": 1, "policy_in": "DROP", "policy_out": "ACCEPT"} if has_rules else {}
        return opts.setdefault(f"guest/{g.vmid}", default)  # type: ignore[no-any-return]
    if "node" in ctx.params:
        return opts.setdefault(f"node/{ctx.params['node']}", dict(NODE_DEFAULTS))  # type: ignore[no-any-return]
    return opts.setdefault("cluster", dict(CLUSTER_DEFAULTS))  # type: ignore[no-any-return]


def _get_options(ctx: Ctx) -> Any:
    return dict(_options(ctx))


def _put_options(ctx: Ctx) -> Any:
    opts = _options(ctx)
    _assert_digest(ctx, digest_of(opts))
    for k in [d for d in str(ctx.params.get("delete", "")).split(",") if d]:
        opts.pop(k, None)
    skip = {"node", "vmid", "digest", "delete"}
    opts.update({k: v for k, v in ctx.params.items() if k not in skip})
    ctx.rt.cluster.touch()
    return None


for _base in ("/cluster/firewall/options", "/nodes/{node}/firewall/options"):
    route("GET", _base)(_get_options)
    route("PUT", _base)(_put_options)
both("GET", "/nodes/{node}/{kind}/{vmid}/firewall/options")(_get_options)
both("PUT", "/nodes/{node}/{kind}/{vmid}/firewall/options")(_put_options)


# ---- logs ---------------------------------------------------------------------------------------


def _log(ctx: Ctx) -> Any:
    """pve-firewall's log lines ({n, t}), newest last: `limit` lines from `start`, since `since`."""
    cl = ctx.rt.cluster
    if "vmid" in ctx.params:
        g = ctx.guest("lxc" if "/lxc/" in ctx.path else "qemu")
        chain, dev = f"{g.vmid}", f"tap{g.vmid}i0"
    else:
        chain, dev = "0", "vmbr0"
    base = int(cl.created) - 3600
    lines = []
    for i in range(200):
        t = base + i * 17
        stamp = time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(t))
        verdict = "DROP" if i % 3 else "ACCEPT"
        text = (
            f"{chain} 6 PVEFW-HOST-IN 30/{stamp}: policy {verdict}: IN={dev} "
            f"SRC=10.10.0.{i % 250 + 1} DST=10.10.1.{i % 7 + 10} PROTO=TCP DPT={(22, 80, 443)[i % 3]}"
        )
        lines.append((t, text))
    since = ctx.params.get("since")
    if since is not None:
        lines = [x for x in lines if x[0] >= int(since)]
    limit = int(ctx.params.get("limit") or 50)
    start = int(ctx.params.get("start") or max(0, len(lines) - limit))
    chosen = lines[start : start + limit]
    return [{"n": start + i + 1, "t": text} for i, (_, text) in enumerate(chosen)]


route("GET", "/nodes/{node}/firewall/log")(_log)
both("GET", "/nodes/{node}/{kind}/{vmid}/firewall/log")(_log)
