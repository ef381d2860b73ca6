"""The audit trail of real calls: order and facts, durability before dispatch, refusals,
planted secrets, usage counters across a restart, and a SIGKILL in the middle of a load."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
import signal
import sqlite3
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.cli import main as cli
from gateway.dev.devenv import DevEnv, make_env
from gateway.policy.decisions import FAIL_CLOSED_CODE
from gateway.store import audit as auditlib
from gateway.store.usage import MemoryQuotas
from tests.support import GatewayThread, audit_bytes, audit_rows, free_port, kept_input


class Mcp:
    def __init__(self, env: DevEnv, url: str | None = None) -> None:
        self.url = url or env.url
        self.env = env
        self.ctx = ssl.create_default_context(cafile=str(env.ca_file))
        self.n = 0

    async def call(
        self, token: str, tool: str, args: Any, http: httpx.AsyncClient | None = None
    ) -> tuple[int, dict[str, Any]]:
        self.n += 1
        body = {"jsonrpc": "2.0", "id": self.n, "method": "tools/call", "params": {"name": tool, "arguments": args}}
        headers = {"Authorization": f"Bearer {token}", "MCP-Protocol-Version": "2025-06-18"}
        if http is not None:
            r = await http.post(self.url, json=body, headers=headers)
        else:
            async with httpx.AsyncClient(verify=self.ctx, timeout=30) as h:
                r = await h.post(self.url, json=body, headers=headers)
        return r.status_code, r.json() if r.content else {}


def rid(doc: dict[str, Any]) -> str:
    return str(doc["result"]["_meta"]["pvegate/request_id"])


async def test_records_in_order_with_decision_facts(xgw: GatewayThread, xenv: DevEnv) -> None:
    mcp = Mcp(xenv)
    status, doc = await mcp.call(xenv.token("demo-agent", ["operator"]), "vm_start", {"vmid": 102})
    assert status == 200 and doc["result"]["_meta"]["pvegate/outcome"] in ("allowed", "failed"), doc
    rows = audit_rows(xenv.config.audit_path, rid(doc))
    # the dispatch record (the UPID) is written before the gateway waits on the task
    assert [r["kind"] for r in rows] == ["received", "decision", "dispatch", "result"]
    received, decision, dispatched, result = (json.loads(r["body"]) for r in rows)
    assert rows[2]["outcome"] == "accepted" and dispatched["task_id"] == result["task_id"]
    rows = [rows[0], rows[1], rows[3]]
    assert received["arguments"] == {"vmid": 102} and received["target"]["vmid"] == 102
    assert rows[0]["principal"] == "demo-agent" and rows[0]["tool"] == "vm_start"
    assert rows[0]["target"] == "default/qemu/102"
    assert rows[1]["outcome"] == "allow"
    assert "decision_id" in decision and decision["input_digest"].startswith("sha256:")
    # the policy it was decided under, a policy directory's files too (it was null without a bundle)
    assert str(decision["bundle_revision"]).startswith("files:"), decision["bundle_revision"]
    assert decision["risk"]["level"] in ("low", "medium", "high", "critical")
    assert decision["deny"] == [] and decision["approval"]["required"] is False
    assert result["duration_ms"] > 0 and rows[2]["outcome"] in ("ok", "failed")
    if rows[2]["outcome"] == "ok":
        assert str(result["task_id"]).startswith("UPID:")


async def test_decision_is_durable_before_the_connector_answers(xgw: GatewayThread, xenv: DevEnv, xsim: Any) -> None:
    mcp = Mcp(xenv)
    who = "durable-probe-" + secrets.token_hex(4)
    xsim.set_faults(latency_ms=1500, latency_path="^/nodes$")
    try:
        call = asyncio.create_task(mcp.call(xenv.token(who, ["operator"]), "list_nodes", {}))
        deadline = time.monotonic() + 10
        seen: list[tuple[str, str]] = []
        while time.monotonic() < deadline and not seen:
            con = sqlite3.connect(xenv.config.audit_path)  # another connection: what a crash would leave
            seen = con.execute("SELECT kind, outcome FROM audit WHERE principal = ? ORDER BY seq", (who,)).fetchall()
            con.close()
            await asyncio.sleep(0.05)
        assert not call.done(), "the call finished before the check: latency fault not applied"
        assert seen == [("received", None), ("decision", "allow")]  # intent on disk, no result yet
        status, doc = await call
        assert status == 200 and [r["kind"] for r in audit_rows(xenv.config.audit_path, rid(doc))][-1] == "result"
    finally:
        xsim.set_faults(latency_ms=0, latency_path=None)


async def test_auth_failures_and_refusals_are_recorded(xgw: GatewayThread, xenv: DevEnv) -> None:
    mcp = Mcp(xenv)
    before = len([r for r in audit_rows(xenv.config.audit_path) if r["kind"] == "auth_failure"])
    status, _ = await mcp.call("not-a-jwt", "list_nodes", {})
    assert status == 401
    assert len([r for r in audit_rows(xenv.config.audit_path) if r["kind"] == "auth_failure"]) == before + 1
    token = xenv.token("demo-agent", ["operator"])
    status, doc = await mcp.call(token, "get_guest_status", {"vmid": "abc"})
    rows = audit_rows(xenv.config.audit_path, rid(doc))
    assert [(r["kind"], r["outcome"]) for r in rows] == [("refusal", "invalid")]
    status, doc = await mcp.call(token, "no_such_tool", {})
    assert "error" in doc
    last = audit_rows(xenv.config.audit_path)[-1]
    assert (last["kind"], last["outcome"], last["tool"]) == ("refusal", "unknown_tool", "no_such_tool")


async def test_planted_secrets_never_reach_the_database(xgw: GatewayThread, xenv: DevEnv, xsim: Any) -> None:
    mcp = Mcp(xenv)
    agent_jwt = xenv.token("demo-agent", ["operator"])
    password = "PlantedCiPass-" + secrets.token_hex(8)
    too_long = "PlantedTooLong-" + secrets.token_hex(32)  # fails validation: the error would quote it
    bogus_bearer = "eyJhbGciOiJIUzI1NiJ9.PlantedBearer" + secrets.token_hex(8) + ".sig"

    status, doc = await mcp.call(agent_jwt, "vm_set_cipassword", {"vmid": 103, "cipassword": password})
    assert status == 200 and doc["result"]["_meta"]["pvegate/outcome"] in ("allowed", "failed"), doc
    set_rid = rid(doc)
    status, doc = await mcp.call(agent_jwt, "vm_set_cipassword", {"vmid": 103, "cipassword": too_long})
    assert doc["result"]["_meta"]["pvegate/outcome"] == "invalid"
    refusal = audit_rows(xenv.config.audit_path, rid(doc))[0]
    # the validation error names the argument and the rule, never the value (the scrubber is the backstop)
    assert "invalid argument cipassword: must be at most 64 characters" in refusal["body"]
    for tool, args in [
        ("list_guest_containers", {"vmid": 200}),
        ("inspect_compose_stack", {"vmid": 200, "project": "app"}),
        ("lxc_docker_inspect", {"vmid": 200, "container": "app-db-1"}),
        ("lxc_docker_inspect", {"vmid": 200, "container": "app-worker-1"}),
        ("get_guest_config", {"vmid": 103}),
    ]:
        status, doc = await mcp.call(agent_jwt, tool, args)
        assert status == 200, doc
    status, _ = await mcp.call(bogus_bearer, "list_nodes", {})
    assert status == 401

    received = audit_rows(xenv.config.audit_path, set_rid)[0]
    assert json.loads(received["body"])["arguments"]["cipassword"] == "[redacted]"
    admin_token = (xenv.workdir / "secrets" / "admin-token").read_text().strip()
    planted = {
        "cloud-init password argument": password,
        "invalid password argument": too_long,
        "container env (postgres)": "SimPlantedSecret-pg-7f3a9c",
        "container env (api token)": "SimPlantedSecret-api-41d2e8",
        "JWT signing secret": xenv.jwt_secret,
        "admin token": admin_token,
        "agent bearer token": agent_jwt,
        "rejected bearer token": bogus_bearer,
        **{f"Proxmox token {name}": value for name, value in xsim.tokens.items()},
        **{f"Proxmox token secret {name}": value.rsplit("=", 1)[-1] for name, value in xsim.tokens.items()},
    }
    assert xenv.config.audit_path.with_name(xenv.config.audit_path.name + "-wal").exists()  # the WAL is searched too
    # decision records keep their policy input compressed (input_z): searched unpacked too (audit_bytes)
    raw, rows = audit_bytes(xenv.config.audit_path)
    decision = next(r for r in rows if r["request_id"] == set_rid and r["kind"] == "decision")
    kept = kept_input(decision)
    assert kept is not None and kept["arguments"]["cipassword"] == "[redacted]"
    assert json.loads(decision["body"])["input_redacted"] == ["arguments.cipassword"]
    leaked = [what for what, value in planted.items() if value.encode() in raw]
    assert leaked == []
    assert auditlib.verify(xenv.config.audit_path).ok


async def test_usage_counters_survive_a_restart(xgw: GatewayThread, xenv: DevEnv) -> None:
    mcp = Mcp(xenv)
    who = "usage-probe-" + secrets.token_hex(4)
    for _ in range(3):
        await mcp.call(xenv.token(who, ["operator"]), "list_nodes", {})
    cfg = dataclasses.replace(xenv.config, port=free_port())  # a fresh gateway on the same audit DB
    gw = GatewayThread(cfg).start()
    try:
        usage = gw.components.usage  # on SQLite: this process's counters, re-read from the audit
        assert isinstance(usage, MemoryQuotas)
        counts = usage.counters.counts(who, "list_nodes")
    finally:
        gw.stop()
    assert counts["tool"]["1h"] == 3 and counts["all"]["24h"] == 3


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _serve(env: DevEnv, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(env.config_path)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parents[2],
        )


async def _wait_up(env: DevEnv, proc: subprocess.Popen[bytes], ctx: ssl.SSLContext) -> None:
    deadline = time.monotonic() + 60
    base = env.url.rsplit("/mcp", 1)[0]
    async with httpx.AsyncClient(verify=ctx, timeout=2) as http:
        while time.monotonic() < deadline:
            assert proc.poll() is None, "gateway exited during start-up"
            try:
                if (await http.get(base + "/healthz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError("gateway did not come up")


async def test_sigkill_mid_load_loses_no_record(xsim: Any, tmp_path: Path, connectors_dir: Path) -> None:
    env = make_env(tmp_path / "gw", {"default": xsim}, port=free_port(), extra={"connectors_dir": str(connectors_dir)})
    mcp = Mcp(env)
    token = env.token("kill-probe", ["operator"])
    log = tmp_path / "serve.log"
    proc = _serve(env, log)
    opa_pids: list[int] = []
    try:
        await _wait_up(env, proc, mcp.ctx)
        xsim.clear_logs()
        answered = 0
        stop = asyncio.Event()

        async def worker() -> None:
            nonlocal answered
            async with httpx.AsyncClient(verify=mcp.ctx, timeout=10) as http:
                while not stop.is_set():
                    try:
                        status, _ = await mcp.call(token, "list_nodes", {}, http=http)
                        answered += status == 200
                    except (httpx.HTTPError, ValueError):
                        return  # the gateway is gone

        workers = [asyncio.create_task(worker()) for _ in range(8)]
        deadline = time.monotonic() + 30
        while answered < 60:
            assert time.monotonic() < deadline and all(not w.done() for w in workers), "load did not run"
            await asyncio.sleep(0.01)
        opa_pids = _children(proc.pid)
        proc.send_signal(signal.SIGKILL)  # mid-load: calls are in every stage of the pipeline
        proc.wait()
        stop.set()
        await asyncio.gather(*workers)
    finally:
        for pid in opa_pids:  # the OPA sidecar the killed gateway had started
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    seen = [r for r in xsim.requests_log() if r["method"] == "GET" and r["path"] == "/api2/json/nodes"]
    # restart on the same database: it opens, serves, and shuts down cleanly
    proc = _serve(env, log)
    try:
        await _wait_up(env, proc, mcp.ctx)
        status, _ = await mcp.call(token, "list_nodes", {})
        assert status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)

    verify = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "audit", "verify", "--config", str(env.config_path)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert verify.returncode == 0, verify.stderr
    con = sqlite3.connect(env.config.audit_path)
    allowed = con.execute(
        "SELECT COUNT(*) FROM audit WHERE kind = 'decision' AND outcome = 'allow' AND tool = 'list_nodes' "
        "AND principal = 'kill-probe'"
    ).fetchone()[0]
    con.close()
    # each allowed list_nodes makes exactly one GET /nodes, and nothing else does: every request the
    # simulator saw before the kill has its decision record iff there are at least as many of them
    # (the call after the restart adds one to both sides)
    assert len(seen) >= 60
    assert allowed - 1 >= len(seen), (allowed, len(seen))
    print(f"SIGKILL: simulator saw {len(seen)} GET /nodes, audit holds {allowed - 1} allowed decisions")


async def test_configured_retention_archives_and_chain_continues(xsim: Any, tmp_path: Path) -> None:
    db = tmp_path / "state" / "audit.db"
    env = make_env(
        tmp_path,
        {"default": xsim},
        port=free_port(),
        extra={"audit": {"path": str(db), "retention_days": 6 / 86400, "archive_dir": str(tmp_path / "arch")}},
    )
    log = auditlib.AuditLog(db)
    await log.open()
    await log.append(
        *[auditlib.AuditRecord(f"old-{i}", "decision", outcome="deny") for i in range(5)]
    )  # settled: archivable
    # older than the six-second retention; the new record then has six seconds of margin
    # for the CLI to start on a loaded machine
    await asyncio.sleep(6.3)
    await log.append(auditlib.AuditRecord("new", "decision", outcome="deny"))
    await log.close()

    def pvegate(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway.cli", "audit", *args, "--config", str(env.config_path)],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )

    done = pvegate("archive")
    assert done.returncode == 0 and "archived records 1..5" in done.stdout, done.stderr
    files = sorted((tmp_path / "arch").glob("*.jsonl"))
    assert len(files) == 1
    assert [r["request_id"] for r in auditlib.search(db, auditlib.Query())] == ["new"]
    assert pvegate("verify").returncode == 0
    assert pvegate("verify", "--archive", str(files[0])).returncode == 0


async def test_lone_surrogates_from_one_client_never_fail_another(xgw: GatewayThread, xenv: DevEnv) -> None:
    """Issue #14 finding 1: a client sending escaped lone surrogates ("\\ud800", which Python's
    JSON decodes to text SQLite cannot store) in tool names, argument keys and values and the
    JSON-RPC id, concurrently with another client's ordinary calls. Records are committed in
    groups: the ordinary calls must all succeed with their full trail, and the chain verify."""
    mcp = Mcp(xenv)
    poisoner = "surrogate-" + secrets.token_hex(4)
    honest = "honest-" + secrets.token_hex(4)
    bad_token = xenv.token(poisoner, ["operator"])
    good_token = xenv.token(honest, ["operator"])
    headers = {"MCP-Protocol-Version": "2025-06-18", "Content-Type": "application/json"}
    # written by hand: the escapes reach the gateway as-is and its JSON parser makes lone surrogates of them
    poison_bodies = [
        '{"jsonrpc":"2.0","id":"p%d","method":"tools/call","params":{"name":"get_guest_status",'
        '"arguments":{"vmid":101,"\\ud800":"x"}}}',
        '{"jsonrpc":"2.0","id":"p%d","method":"tools/call","params":{"name":"snapshot_create",'
        '"arguments":{"vmid":101,"snapname":"s%d","description":"bad \\udfff text"}}}',
        '{"jsonrpc":"2.0","id":"p%d","method":"tools/call","params":{"name":"list_\\ud800","arguments":{}}}',
        '{"jsonrpc":"2.0","id":"\\ud800%d","method":"tools/call","params":{"name":"list_nodes",'
        '"arguments":{"x\\udbff":1}}}',
    ]

    # both clients share 127.0.0.1: stay under its limit of concurrent requests (max_inflight_per_client)
    poison_slots, ordinary_slots = asyncio.Semaphore(16), asyncio.Semaphore(40)
    async with httpx.AsyncClient(verify=mcp.ctx, timeout=60) as http:

        async def poison(i: int) -> int:
            body = poison_bodies[i % len(poison_bodies)].replace("%d", str(i))
            async with poison_slots:
                r = await http.post(
                    mcp.url, content=body.encode(), headers={**headers, "Authorization": f"Bearer {bad_token}"}
                )
            return r.status_code

        async def ordinary(i: int) -> tuple[int, dict[str, Any]]:
            async with ordinary_slots:
                return await mcp.call(good_token, "get_guest_status", {"vmid": 101}, http)

        poison_statuses, honest_results = await asyncio.gather(
            asyncio.gather(*[poison(i) for i in range(20)]), asyncio.gather(*[ordinary(i) for i in range(60)])
        )
    assert len(poison_statuses) == 20  # how the poisoning client is answered is the edge's concern (tests/adversarial)
    failures = [doc for status, doc in honest_results if status != 200 or "error" in doc]
    assert failures == []
    db = xenv.config.audit_path
    # On a loaded machine OPA may miss its timeout for a few calls: those fail closed before any
    # result, with their received and decision records. Nothing else may go wrong for them.
    served = 0
    for _, doc in honest_results:
        rows = audit_rows(db, rid(doc))
        trail = [(r["kind"], r["principal"], r["outcome"]) for r in rows]
        if doc["result"]["isError"]:
            assert doc["result"]["structuredContent"]["codes"] == [FAIL_CLOSED_CODE], doc
            assert trail == [("received", honest, None), ("decision", honest, "deny")]
            assert json.loads(rows[1]["body"])["failed_closed"] is True
            continue
        assert trail == [("received", honest, None), ("decision", honest, "allow"), ("result", honest, "ok")]
        served += 1
    assert served > 0  # the ordinary calls' records were committed alongside the poisoned ones
    # the poisoning client's own calls are on record too, its text kept in escaped form
    con = sqlite3.connect(db)
    try:
        poisoned = con.execute("SELECT kind, tool, body FROM audit WHERE principal = ?", (poisoner,)).fetchall()
    finally:
        con.close()
    assert any("\\ud800" in (tool or "") or "\\ud800" in body or "\\udfff" in body for _, tool, body in poisoned)
    assert auditlib.verify(db).ok
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "audit", "verify", "--config", str(xenv.config_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("OK:"), proc.stdout + proc.stderr


async def test_a_password_chosen_to_match_the_record_never_rewrites_it(
    xgw: GatewayThread, xenv: DevEnv, tmp_path: Path
) -> None:
    """A client's secret argument is scrubbed from its records as data: a password equal to the caller's own
    name keeps the principal (searchable), a piece of JSON keeps the body and the kept policy input JSON,
    and an invalid call's refusal stays JSON (export reads it)."""
    mcp = Mcp(xenv)
    who = "ci-probe-" + secrets.token_hex(4)
    token = xenv.token(who, ["operator"], kind="human")  # an agent setting credentials needs an approval
    calls = {}
    for password in (who, '{"approval":null,', '{"allow":true,', "ci-" + secrets.token_hex(6)):
        status, doc = await mcp.call(token, "vm_cloudinit_set", {"vmid": 102, "cipassword": password})
        assert status == 200 and doc["result"]["_meta"]["pvegate/outcome"] in ("allowed", "failed"), doc
        calls[password] = rid(doc)
    status, doc = await mcp.call(token, "vm_cloudinit_set", {"vmid": 102, "cipassword": '{"error":', "nope": 1})
    assert doc["result"]["_meta"]["pvegate/outcome"] == "invalid"
    invalid = rid(doc)

    db = xenv.config.audit_path
    for password, request_id in calls.items():
        rows = audit_rows(db, request_id)
        assert [r["kind"] for r in rows][:2] == ["received", "decision"] and rows[-1]["kind"] == "result"
        assert {r["principal"] for r in rows} == {who} and {r["tool"] for r in rows} == {"vm_cloudinit_set"}
        assert {r["target"] for r in rows} == {"default/qemu/102"}
        bodies = [json.loads(r["body"]) for r in rows]  # every body is JSON
        assert bodies[0]["arguments"]["cipassword"] == "[redacted]"
        kept = auditlib.unpack_input(bodies[1])  # what `pvegate policy replay` reads
        assert kept is not None and kept["arguments"]["cipassword"] == "[redacted]"
        assert kept["principal"]["sub"] == who and "approval" in kept
        assert bodies[1]["allow"] is True
        if password.startswith("ci-"):  # (the others are the caller's own name, or read as JSON's own text)
            assert all(password not in r["body"] for r in rows)
    refusal = audit_rows(db, invalid)
    assert [r["kind"] for r in refusal] == ["refusal"] and refusal[0]["principal"] == who
    assert "nope" in json.loads(refusal[0]["body"])["error"]
    found = auditlib.search(db, auditlib.Query(principal=who, kind="decision"))
    assert [r["request_id"] for r in found] == list(calls.values())  # none hidden from a search by principal
    out = tmp_path / "export.jsonl"
    assert await asyncio.to_thread(cli, ["audit", "export", "--db", str(db), "--jsonl", "--out", str(out)]) == 0
    assert invalid in out.read_text()
    assert auditlib.verify(db).ok


async def test_a_composites_commands_are_each_in_the_audit(xgw: GatewayThread, xenv: DevEnv) -> None:
    """Which commands a composite ran on which node: one dispatch record per command its
    sub-calls started, as a direct call has (before: none, only received/decision/result)."""
    mcp = Mcp(xenv)
    status, doc = await mcp.call(
        xenv.token("demo-agent", ["operator"]), "inspect_compose_stack", {"vmid": 200, "project": "app"}
    )
    assert status == 200 and not doc["result"].get("isError"), doc
    rows = audit_rows(xenv.config.audit_path, rid(doc))
    dispatched = [json.loads(r["body"]) for r in rows if r["kind"] == "dispatch"]
    assert dispatched and all(d["via"] and d["node"] and d["argv"][:2] == ["pct", "exec"] for d in dispatched), rows
    assert [r["kind"] for r in rows][-1] == "result"
