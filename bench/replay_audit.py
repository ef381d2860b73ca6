"""A synthetic audit for `pvegate policy replay`, written by the real audit writer, and its replay rate.

Calls are drawn from a fixed mix of principals, tools (the shipped catalog) and targets, spread
over the last week; each call's decision is the real OPA's answer on the shipped policies (asked
in batches), and the call is recorded exactly as the gateway records it (received + decision with
its packed input + result), so `pvegate audit verify` passes on the result.

    .venv/bin/python bench/replay_audit.py --calls 100000 --db /tmp/replay/audit.db --measure

prints the audit growth per call and the replay rate of both engines (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.core.canonical import digest_json
from gateway.policy.decisions import CONTRACT_VERSION
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.store.audit import AuditLog, AuditRecord, dumps_body
from gateway.store.replay import Candidate, ServerEngine, verdict
from gateway.tools.catalog import Catalog

PRINCIPALS: list[dict[str, Any]] = [
    {"sub": f"agent-ops-{i}", "roles": ["operator"], "groups": [], "kind": "agent"} for i in range(6)
] + [
    {"sub": "demo-viewer", "roles": ["viewer"], "groups": [], "kind": "agent"},
    {"sub": "web-bot", "roles": [], "groups": ["team-web"], "kind": "agent"},
    {"sub": "carol", "roles": [], "groups": ["pve-admins"], "kind": "human"},
    {"sub": "auditor-1", "roles": ["auditor"], "groups": ["auditors"], "kind": "service"},
    {"sub": "demo-planner", "roles": [], "groups": [], "kind": "agent"},
    {"sub": "contractor-1", "roles": ["viewer"], "groups": ["contractors"], "kind": "human"},
]
TARGETS: list[dict[str, Any]] = [
    {"vmid": 100, "type": "qemu", "node": "pve1", "name": "web01", "tags": ["prod", "web"], "pool": "prod"},
    {"vmid": 101, "type": "qemu", "node": "pve1", "name": "db01", "tags": ["prod", "protected"], "pool": "prod"},
    {"vmid": 103, "type": "qemu", "node": "pve2", "name": "dev-scratch", "tags": ["dev"], "pool": "lab"},
    {"vmid": 201, "type": "lxc", "node": "pve2", "name": "dns01", "tags": ["prod"], "pool": "prod"},
    {"vmid": 202, "type": "lxc", "node": "pve2", "name": "old-ct", "tags": ["dev"], "pool": "lab"},
]
TOOLS = ["list_nodes", "list_guests", "get_guest_status", "get_guest_config", "vm_start", "vm_stop", "vm_reboot"]
TOOLS += ["snapshot_create", "snapshot_delete", "guest_delete", "lxc_stop", "get_node_network", "lxc_docker_ps"]


def synthetic_inputs(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    catalog = Catalog.load(REPO_ROOT / "connectors")
    tools = [t for name in TOOLS if (t := catalog.get(name)) is not None]
    # the week before the last Monday 00:00 UTC: recent, and the same weekdays and hours whatever the time of the
    # run (from `now` itself, a run in business hours drew no off-hours call, and so no held critical one)
    now = time.time()
    now -= now % 86400 + datetime.fromtimestamp(now, tz=UTC).weekday() * 86400
    out = []
    for i in range(n):
        p = rnd.choice(PRINCIPALS)
        tool = rnd.choice(tools)
        tgt = rnd.choice(TARGETS)
        ts = now - rnd.uniform(0, 7 * 86400)
        dt = datetime.fromtimestamp(ts, tz=UTC)
        guest = tool.scope == "guest"
        args: dict[str, Any] = {"vmid": tgt["vmid"]} if guest else {"node": tgt["node"]}
        if tool.name.startswith("snapshot_"):
            args["snapname"] = f"s{i % 50}"
        target = {"cluster": "default", "known": True, "status": "running", "ha_state": None, "storage": None}
        target |= tgt if guest else {"node": tgt["node"], "vmid": None, "type": None, "tags": [], "pool": None}
        calls = rnd.randint(0, 8)
        out.append(
            {
                "contract_version": CONTRACT_VERSION,
                "kind": "call",
                "principal": {**p, "iss": "pvegate", "client_id": None, "scopes": ["pve.read"]},
                "request": {
                    "id": str(uuid.UUID(int=rnd.getrandbits(128))),
                    "method": "tools/call",
                    "protocol_version": "2025-11-25",
                    "time": dt.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "time_ns": int(ts * 1e9),
                    "weekday": dt.strftime("%a"),
                    "hour_utc": dt.hour,
                    "source_ip": "127.0.0.1",
                },
                "tool": tool.policy_view,
                "arguments": args,
                "arguments_digest": digest_json({"tool": tool.name, "arguments": args}),
                "target": target,
                "approval": None,
                "usage": {
                    "all": {"1m": calls, "1h": calls * 3, "24h": calls * 20},
                    "tool": {"1m": 0, "1h": 1, "24h": 4},
                },
                "dry_run": False,
            }
        )
    return out


def _tkey(t: dict[str, Any]) -> str:
    return f"default/{t['type']}/{t['vmid']}" if t.get("vmid") else f"default/node/{t['node']}"


async def write_audit(db: Path, inputs: list[dict[str, Any]], results: list[Any], keep_input: bool = True) -> float:
    """Record each call as the pipeline does; returns the seconds it took."""
    audit = AuditLog(db)
    await audit.open()
    started = time.perf_counter()

    async def one(doc: dict[str, Any], result: Any) -> None:
        v = verdict(result)
        outcome = {"allow": "allow", "approval": "pending", "deny": "deny"}[v.outcome]
        rid, who, tool, tkey = doc["request"]["id"], doc["principal"]["sub"], doc["tool"]["name"], _tkey(doc["target"])
        body = {
            "allow": v.outcome == "allow",
            "deny": list((result or {}).get("deny", [])),
            "risk": (result or {}).get("risk", {}),
            "approval": (result or {}).get("approval", {}),
            "obligations": v.obligations,
            "quota": (result or {}).get("quota"),
            "decision_id": str(uuid.uuid4()),
            "bundle_revision": None,
            "failed_closed": False,
            "input_digest": digest_json(doc),
            "eval_ns": 90000,
            "input_redacted": [],
        }
        received = {"arguments": doc["arguments"], "target": doc["target"], "protocol": "2025-11-25"}
        recs = [
            AuditRecord(rid, "received", who, tool, tkey, None, received),
            AuditRecord(rid, "decision", who, tool, tkey, outcome, body, policy_input=doc if keep_input else None),
        ]
        if outcome == "allow":
            recs.append(AuditRecord(rid, "result", who, tool, tkey, "ok", {"task_id": None, "duration_ms": 4.2}))
        await audit.append(*recs)

    step = 2000  # calls in flight: the writer groups them into commits
    for i in range(0, len(inputs), step):
        await asyncio.gather(*(one(d, r) for d, r in zip(inputs[i : i + step], results[i : i + step], strict=True)))
    await audit.close()
    return time.perf_counter() - started


def decide(inputs: list[dict[str, Any]], policies: Path) -> list[Any]:
    with ServerEngine(Candidate(policies=(policies,))) as engine:
        return engine.evaluate(inputs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--policies", type=Path, default=REPO_ROOT / "policies")
    ap.add_argument("--measure", action="store_true", help="audit growth per call and replay rates")
    args = ap.parse_args(argv)
    if args.db.exists():
        print(f"{args.db} exists; give a new path", file=sys.stderr)
        return 2
    inputs = synthetic_inputs(args.calls)
    t0 = time.perf_counter()
    results = decide(inputs, args.policies)
    print(f"baseline decisions: {len(inputs)} in {time.perf_counter() - t0:.1f}s")
    secs = asyncio.run(write_audit(args.db, inputs, results))
    print(f"audit written: {args.calls} calls in {secs:.1f}s -> {args.db} ({args.db.stat().st_size / 1e6:.1f} MB)")
    if not args.measure:
        return 0
    _growth(args.db, inputs[:2000], results[:2000])
    cli = [sys.executable, "-m", "gateway.cli", "policy", "replay", "--db", str(args.db), "--format", "json"]
    with tempfile.TemporaryDirectory() as tmp:
        cand = Path(tmp) / "policies"
        shutil.copytree(args.policies, cand)
        data = cand / "data" / "data.yaml"
        data.write_text(data.read_text().replace("      active: false", "      active: true", 1))
        for engine in ("server", "eval"):
            t0 = time.perf_counter()
            done = subprocess.run([*cli, "--policies", str(cand), "--engine", engine], capture_output=True, text=True)
            if done.returncode not in (0, 1):
                print(done.stderr, file=sys.stderr)
                return 1
            rep = json.loads(done.stdout)
            wall = time.perf_counter() - t0
            print(
                f"replay ({engine}): {rep['replayed']} decisions, {rep['changed']} changed, "
                f"{rep['decisions_per_second']:.0f}/s in the replay loop, {rep['replayed'] / wall:.0f}/s wall "
                f"({wall:.1f}s including start-up and reading)"
            )
    return 0


def _growth(db: Path, inputs: list[dict[str, Any]], results: list[Any]) -> None:
    """Bytes per call with and without the kept input, written the same way to two fresh databases."""
    with tempfile.TemporaryDirectory() as tmp:
        sizes = {}
        for keep in (False, True):
            path = Path(tmp) / f"a{int(keep)}.db"
            asyncio.run(write_audit(path, inputs, results, keep_input=keep))
            con = sqlite3.connect(path)
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            body = con.execute("SELECT AVG(LENGTH(body)) FROM audit WHERE kind='decision'").fetchone()[0]
            con.execute("VACUUM")
            con.close()
            sizes[keep] = (path.stat().st_size / len(inputs), body)
        plain = sum(len(dumps_body(d)) for d in inputs) / len(inputs)
        print(
            f"audit growth per call: {sizes[False][0]:.0f} B without the input, {sizes[True][0]:.0f} B with it "
            f"(+{sizes[True][0] - sizes[False][0]:.0f} B); "
            f"decision body {sizes[False][1]:.0f} -> {sizes[True][1]:.0f} B; "
            f"the input is {plain:.0f} B as JSON"
        )


if __name__ == "__main__":
    raise SystemExit(main())
