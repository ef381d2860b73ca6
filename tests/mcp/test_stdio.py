"""`pvegate stdio`: the SDK's own stdio client starts `.venv/bin/pvegate stdio` as a desktop client
would, and every call goes through the same pipeline as over HTTP: real OPA with the shipped
policy, the simulator, the audit on disk, approvals handed off by URL (and approved with the CLI).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.client.client import Client
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from gateway.app import build_components
from gateway.dev.devenv import DevEnv, make_env
from gateway.mcp import methods
from gateway.mcp.stdio import local_principal
from gateway.sim.harness import start_simulator
from gateway.store.outcomes import AUDIT_UNAVAILABLE
from tests.mcp.stdio_pipe import exchange
from tests.support import audit_rows, free_port

PVEGATE = Path(sys.executable).with_name("pvegate")
LOCAL = {
    "desk-agent": {"kind": "agent", "roles": ["operator"]},
    "desk-viewer": {"roles": ["viewer"]},
}


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A simulator of this module's own: an approved shutdown really stops a guest."""
    handle = start_simulator("small", tmp_path_factory.mktemp("stdio-sim"))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def stdio_env(sim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(
        tmp_path_factory.mktemp("stdio"), {"default": sim}, port=free_port(), extra={"local_principals": LOCAL}
    )


def params(env: DevEnv, principal: str) -> StdioServerParameters:
    # the SDK passes a child only a few variables: keep ours (PYTHONDONTWRITEBYTECODE among them,
    # or the child writes __pycache__ into gateway/schemas/, which `opa check --schema` then reads)
    return StdioServerParameters(
        command=str(PVEGATE),
        args=["stdio", "--config", str(env.config_path), "--principal", principal],
        env=dict(os.environ),
    )


@asynccontextmanager
async def session(env: DevEnv, principal: str) -> AsyncIterator[ClientSession]:
    async with stdio_client(params(env, principal)) as (read, write), ClientSession(read, write) as s:
        await s.initialize()
        yield s


def text(res: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in res.content)


async def test_the_pipeline_over_stdio(stdio_env: DevEnv, sim: Any) -> None:
    env = stdio_env
    async with stdio_client(params(env, "desk-agent")) as (read, write), ClientSession(read, write) as s:
        init = await s.initialize()
        assert init.server_info.name == "pvegate"

        # tools/list: what the policy shows an operator agent, nothing else
        listed = {t.name for t in (await s.list_tools()).tools}
        assert {"list_nodes", "vm_shutdown", "check_ip_availability"} <= listed
        assert not {"get_token_permissions", "guest_delete", "guest_migrate"} & listed

        # an allowed read
        sim.clear_logs()
        ok = await s.call_tool("list_nodes", {})
        assert not ok.is_error and {r["node"] for r in ok.structured_content["items"]} == {"pve1", "pve2", "pve3"}
        assert any(e["path"] == "/api2/json/nodes" for e in sim.requests_log())

        # a denied call, with the policy's reasons and codes
        denied = await s.call_tool("guest_delete", {"vmid": 102})
        assert denied.is_error and "Denied by policy" in text(denied)
        assert denied.structured_content["allowed"] is False and denied.structured_content["reasons"]

        # a held call: pending, with the approval page's URL; nothing sent to Proxmox
        sim.clear_logs()
        held = await s.call_tool("vm_shutdown", {"vmid": 100})
        assert held.is_error and held.meta["pvegate/outcome"] == "pending_approval"
        approval = held.structured_content["approval"]
        aid = approval["id"]
        assert approval["approve_url"] == f"{env.config.public_url}/admin/approvals/{aid}"
        assert approval["approve_url"] in text(held)
        assert [e for e in sim.requests_log() if e["method"] != "GET"] == []

        # a protocol fault is answered, not fatal: the session goes on
        with pytest.raises(Exception, match="Method not found"):
            await s.list_resources()
        assert not (await s.call_tool("get_version", {})).is_error

    rows = audit_rows(env.config.audit_path)
    mine = [r for r in rows if r["principal"] == "desk-agent"]
    decided = {(r["tool"], r["outcome"]) for r in mine if r["kind"] == "decision"}
    assert {("list_nodes", "allow"), ("guest_delete", "deny"), ("vm_shutdown", "pending")} <= decided
    assert ("list_nodes", "ok") in {(r["tool"], r["outcome"]) for r in mine if r["kind"] == "result"}
    assert any(r["kind"] == "approval" and r["outcome"] == "requested" and aid in r["body"] for r in mine)
    received = next(r for r in mine if r["kind"] == "received" and r["tool"] == "list_nodes")
    assert json.loads(received["body"])["protocol"] == init.protocol_version


async def test_a_held_call_runs_after_a_human_approves_it(stdio_env: DevEnv, sim: Any) -> None:
    env = stdio_env
    args = {"vmid": 100, "timeout": 30}
    async with session(env, "desk-agent") as s:
        held = await s.call_tool("vm_shutdown", args)
        assert held.meta["pvegate/outcome"] == "pending_approval", text(held)
        aid = held.structured_content["approval"]["id"]
        approver = env.token("alice", [], groups=["sre-leads"], kind="human")
        vote = subprocess.run(
            [str(PVEGATE), "approvals", "approve", aid, "--config", str(env.config_path), "--token", approver],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert vote.returncode == 0, vote.stdout + vote.stderr
        token = re.search(r"([A-Za-z0-9_-]{40,})", vote.stdout)
        assert token, vote.stdout
        sim.clear_logs()
        done = await s.call_tool("vm_shutdown", args, meta={"pvegate/approval": token.group(1)})  # type: ignore[arg-type]
        assert not done.is_error, text(done)
        assert [(e["method"], e["path"]) for e in sim.requests_log() if e["method"] == "POST"] == [
            ("POST", "/api2/json/nodes/pve1/qemu/100/status/shutdown")
        ]
    presented = f'"approval_presented":"{aid}"'
    decision = [r for r in audit_rows(env.config.audit_path) if r["kind"] == "decision" and presented in r["body"]]
    assert [r["outcome"] for r in decision] == ["allow"]


async def test_modern_stateless_requests_over_stdio(stdio_env: DevEnv) -> None:
    """The 2026-07-28 revision (no handshake, a `_meta` envelope per request) on the same pipe."""
    async with Client(params(stdio_env, "desk-viewer"), mode="2026-07-28") as client:
        listed = {t.name for t in (await client.list_tools()).tools}
        assert "list_nodes" in listed and "vm_shutdown" not in listed
        res = await client.call_tool("vm_shutdown", {"vmid": 100})
        assert res.is_error and "Denied by policy" in text(res)


def test_unknown_principal_is_refused_in_one_line(stdio_env: DevEnv) -> None:
    done = subprocess.run(
        [str(PVEGATE), "stdio", "--config", str(stdio_env.config_path), "--principal", "mallory"],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "--principal mallory: not a local_principals entry (desk-agent, desk-viewer)" in done.stderr


def test_stdout_carries_only_protocol_messages(stdio_env: DevEnv) -> None:
    """Raw lines in, raw lines out: every stdout line is a JSON-RPC reply; a parse error is one too."""
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "get_version", "arguments": {}}},
    ]  # fmt: skip
    stdin = "\n".join(json.dumps(m) for m in lines) + "\n{not json\n" + "x" * (2 << 20) + "\n"
    done = subprocess.run(
        [str(PVEGATE), "stdio", "--config", str(stdio_env.config_path), "--principal", "desk-viewer"],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    by_id = {r.get("id"): r for r in replies if r.get("id") is not None}
    assert by_id[1]["result"]["protocolVersion"] == "2025-06-18"
    assert by_id[2]["result"]["isError"] is False
    errors = [r["error"] for r in replies if r.get("id") is None]
    assert [e["code"] for e in errors] == [-32700, -32600]  # the parse error, then the over-long line
    assert "at most 1048576 bytes" in errors[1]["message"]
    assert len(replies) == 4


def rpc(id_: Any, method: str, params: dict[str, Any] | None = None) -> bytes:
    doc: dict[str, Any] = {"jsonrpc": "2.0", "method": method, **({"id": id_} if id_ is not None else {})}
    if params is not None:
        doc["params"] = params
    return json.dumps(doc).encode()


async def test_a_message_that_fails_is_still_answered(
    stdio_env: DevEnv, sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in review: when handling a message raised (the audit store unavailable, a bug), nothing
    was written back and the client waited for ever. Now each request gets its error under its id,
    as over HTTP; notifications still get nothing. The same parser as HTTP refuses what is not JSON."""
    c = await build_components(stdio_env.config)
    me = local_principal(stdio_env.config.local_principals["desk-agent"])
    try:

        async def broken(x: Any) -> dict[str, Any]:
            raise RuntimeError("internals the client must not see")

        monkeypatch.setattr(methods, "list_tools", broken)
        replies = await exchange(c, me, [
            rpc(1, "tools/list"),
            rpc(None, "notifications/initialized"),
            b'{"jsonrpc":"2.0","id":2,"method":"ping","params":{"a":NaN}}',
            b"\xef\xbb\xbf" + rpc(3, "ping"),
            rpc(4, "ping"),
        ])  # fmt: skip
        by_id = {r["id"]: r for r in replies}
        assert len(replies) == 4 and by_id[4]["result"] == {}
        assert by_id[1]["error"]["code"] == -32603 and "internals" not in json.dumps(by_id[1])
        assert re.fullmatch(r"Internal error \(request [0-9a-f]{32}\)", by_id[1]["error"]["message"])
        assert [r["error"]["code"] for r in replies if r["id"] is None] == [-32700, -32700]  # NaN, then the BOM
        monkeypatch.undo()

        await c.audit.close()  # the store takes no more writes
        sim.clear_logs()
        replies = await exchange(c, me, [
            rpc("a", "tools/call", {"name": "list_nodes", "arguments": {}}),
            rpc(2, "resources/list"),  # a refusal that cannot be recorded
            rpc(None, "notifications/cancelled"),
            rpc(3, "ping"),
            b"{not json",
            b"x" * (c.config.max_body_bytes + 1),
        ])  # fmt: skip
        by_id = {r["id"]: r for r in replies}
        assert len(replies) == 5 and by_id[3]["result"] == {}
        for id_ in ("a", 2, None):
            error = by_id[id_]["error"]
            assert error["code"] == AUDIT_UNAVAILABLE and "nothing was sent to Proxmox" in error["message"], error
        assert [r["error"]["code"] for r in replies if r["id"] is None] == [AUDIT_UNAVAILABLE] * 2
        assert sim.requests_log() == []
    finally:
        await c.close()


async def test_protocol_faults_over_stdio_count_against_the_principals_budget(stdio_env: DevEnv) -> None:
    """As over HTTP: a local agent looping on faults writes rows only up to its refusal budget; beyond,
    each fault is still answered, counted in its principal's summary, not written one by one."""
    c = await build_components(stdio_env.config)
    me = local_principal(stdio_env.config.local_principals["desk-agent"])
    c.principal_limits.refusals_per_window = 3
    try:
        before = len(audit_rows(stdio_env.config.audit_path))
        replies = await exchange(c, me, [rpc(i, "foo/bar") for i in range(10)])
        assert [r["error"]["code"] for r in replies] == [-32601] * 10  # every one answered
        rows = audit_rows(stdio_env.config.audit_path)[before:]
        assert [(r["principal"], r["outcome"]) for r in rows] == [(me.sub, "protocol_error")] * 3
        assert c.principal_limits.summaries.pending() == 7  # counted, summed up in one row
    finally:
        await c.close()
    summary = [r for r in audit_rows(stdio_env.config.audit_path) if r["outcome"] == "suppressed"]
    assert summary and json.loads(summary[-1]["body"])["count"] == 7
