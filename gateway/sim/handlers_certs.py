"""Certificates, ACME and subscription as PVE answers them, and stopping a task.

Each node has the cluster CA and its own certificate (fingerprint from the node's state);
the cluster has one ACME account and a DNS plugin whose API credentials (`data`) PVE does
return to Sys.Modify holders, which is why the connectors drop them. Subscription keys are
derived per node; a node without a level has none.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from gateway.sim.errors import ApiError
from gateway.sim.handlers_read import _task
from gateway.sim.routes import Ctx, route

DAY = 86400
LE = "https://acme-v02.api.letsencrypt.org/directory"
PEM = "-----BEGIN CERTIFICATE-----\nMIIFsimulated\n-----END CERTIFICATE-----\n"


def _fp(seed: str) -> str:
    h = hashlib.sha256(seed.encode()).hexdigest().upper()
    return ":".join(h[i : i + 2] for i in range(0, 64, 2))


@route("GET", "/nodes/{node}/certificates/info")
def get_certificates(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    n = cl.nodes[str(ctx.params["node"])]
    born = int(cl.created) - 400 * DAY
    ca = {"filename": "pve-root-ca.pem", "subject": "/CN=Proxmox Virtual Environment/OU=sim/O=PVE Cluster Manager CA",
          "issuer": "/CN=Proxmox Virtual Environment/OU=sim/O=PVE Cluster Manager CA", "notbefore": born,
          "notafter": born + 3650 * DAY, "fingerprint": _fp(f"{cl.name}/ca"), "public-key-type": "rsaEncryption",
          "public-key-bits": 4096, "san": [], "pem": PEM}  # fmt: skip
    subject = f"/OU=PVE Cluster Node/O=Proxmox Virtual Environment/CN={n.name}.lab.internal"
    node = {"filename": "pve-ssl.pem", "subject": subject,
            "issuer": ca["subject"], "notbefore": born, "notafter": born + 730 * DAY,
            "fingerprint": n.ssl_fingerprint or _fp(n.name), "public-key-type": "rsaEncryption",
            "public-key-bits": 2048, "san": ["127.0.0.1", "0000:0000:0000:0000:0000:0000:0000:0001", "localhost",
                                             n.ip, n.name, f"{n.name}.lab.internal"], "pem": PEM}  # fmt: skip
    return [ca, node]


@route("GET", "/nodes/{node}/config")
def get_node_config(ctx: Ctx) -> Any:
    node = str(ctx.params["node"])
    cfg = {"acme": "account=default", "acmedomain0": f"domain={node}.lab.internal,plugin=cf_lab",
           "digest": hashlib.sha1(node.encode(), usedforsecurity=False).hexdigest()}  # fmt: skip
    prop = ctx.params.get("property")
    if prop and prop != "all":
        return {k: v for k, v in cfg.items() if k in (prop, "digest")}
    return cfg


@route("GET", "/cluster/acme/account")
def get_acme_accounts(ctx: Ctx) -> Any:
    return [{"name": "default"}]


@route("GET", "/cluster/acme/account/{name}")
def get_acme_account(ctx: Ctx) -> Any:
    if ctx.params.get("name", "default") != "default":
        raise ApiError(500, f"ACME account config file '{ctx.params['name']}' does not exist.")
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ctx.rt.cluster.created - 300 * DAY))
    return {
        "directory": LE,
        "location": "https://acme-v02.api.letsencrypt.org/acme/acct/1234567890",
        "tos": "https://letsencrypt.org/documents/LE-SA-v1.4-April-3-2024.pdf",
        "account": {
            "contact": ["mailto:ops@lab.internal"],
            "status": "valid",
            "createdAt": created,
            "initialIp": "203.0.113.10",
            "key": {"kty": "RSA", "e": "AQAB", "n": "SimPlantedSecret-acme-account-key-0f9e8d7c"},
        },
    }


PLUGINS: list[dict[str, Any]] = [
    {"plugin": "standalone", "type": "standalone"},
    {"plugin": "cf_lab", "type": "dns", "api": "cf", "validation-delay": 30,
     "data": "CF_Token=SimPlantedSecret-cf-token-5b4a\nCF_Account_ID=0123456789abcdef"},
]  # fmt: skip


@route("GET", "/cluster/acme/plugins")
def get_acme_plugins(ctx: Ctx) -> Any:
    want = ctx.params.get("type")
    return [dict(p) for p in PLUGINS if want in (None, p["type"])]


@route("GET", "/cluster/acme/plugins/{id}")
def get_acme_plugin(ctx: Ctx) -> Any:
    for p in PLUGINS:
        if p["plugin"] == ctx.params["id"]:
            return {**p, "digest": hashlib.sha1(str(p).encode(), usedforsecurity=False).hexdigest()}
    raise ApiError(500, f"ACME plugin '{ctx.params['id']}' not defined")


@route("GET", "/cluster/acme/directories")
def get_acme_directories(ctx: Ctx) -> Any:
    staging = "https://acme-staging-v02.api.letsencrypt.org/directory"
    return [{"name": "Let's Encrypt V2", "url": LE}, {"name": "Let's Encrypt V2 Staging", "url": staging}]


@route("GET", "/nodes/{node}/subscription")
def get_subscription(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    n = cl.nodes[str(ctx.params["node"])]
    server_id = hashlib.md5(n.name.encode(), usedforsecurity=False).hexdigest().upper()
    if not n.level:
        return {"status": "notfound", "message": "There is no subscription key", "serverid": server_id,
                "sockets": 1, "url": "https://www.proxmox.com/en/proxmox-virtual-environment/pricing"}  # fmt: skip
    key = f"pve2{n.level}-" + hashlib.sha256(f"{cl.name}/{n.name}".encode()).hexdigest()[:10]
    born = time.gmtime(cl.created - 200 * DAY)
    return {
        "status": "active", "key": key, "level": n.level, "serverid": server_id, "sockets": 2,
        "productname": "Proxmox VE Community Subscription 2 CPUs/year",
        "regdate": time.strftime("%Y-%m-%d 00:00:00", born),
        "nextduedate": time.strftime("%Y-%m-%d", time.gmtime(cl.created + 165 * DAY)),
        "checktime": int(cl.created) - 3600,
        "url": "https://www.proxmox.com/en/proxmox-virtual-environment/pricing",
    }  # fmt: skip


@route("DELETE", "/nodes/{node}/tasks/{upid}")
def delete_task(ctx: Ctx) -> Any:
    t = _task(ctx)
    if t.user != ctx.user:
        ctx.require(f"/nodes/{t.node}", "Sys.Modify")
    if t.status != "running":
        return None  # PVE kills nothing and answers success for a finished task
    ctx.rt.tasks.stop(t.upid)
    return None
