"""`pvegate approvals approve --opa-url`: the caller picks the OPA that decides whether they may vote (an
accepted risk, docs/threat-model.md). What it cannot do is leave that unsaid: the vote's audit record
names the OPA that decided when it is not the configured one."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.auth.tokens import mint_hs256
from gateway.core.config import load
from gateway.store import audit as auditlib
from gateway.store.approvals import ApprovalRequest, ApprovalStore, target_key
from gateway.store.audit import AuditLog
from gateway.store.db import database
from tests.config.conftest import minimal, run_pvegate, write


class _AllowAll(http.server.BaseHTTPRequestHandler):
    """An "OPA" that lets every approver vote (and calls its data valid: a vote is decided only on
    data that passed the policy's data check, which this server answers as any OPA of the caller's
    choosing can)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if urllib.parse.urlsplit(self.path).path.rstrip("/").endswith("/pvegate/data_check"):
            result: dict[str, object] = {"valid": True, "problems": []}
        else:
            result = {"allow": True, "deny": [], "groups": ["sre-leads"]}
        body = json.dumps({"result": result, "decision_id": "d"})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def allow_all() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AllowAll)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def _pending(cfg_path: Path) -> str:
    cfg = load(cfg_path)
    log = AuditLog(cfg.audit_path)  # the database, sealed, as after the gateway's first start
    await log.open()
    await log.close()
    store = ApprovalStore(database(cfg))
    await store.open()
    try:
        target = {"cluster": "default", "node": "pve1", "vmid": 101}
        req = ApprovalRequest(
            id="apr-" + uuid.uuid4().hex[:12], created_at=0, request_id="r-" + uuid.uuid4().hex,
            requester="bot", requester_facts={"sub": "bot", "kind": "agent", "roles": ["operator"], "groups": []},
            tool="vm_stop", tool_facts={"name": "vm_stop", "effect": "write"}, arguments_digest="sha256:" + "0" * 64,
            arguments={"vmid": 101}, target_key=target_key(target), target=target,
            risk={"level": "high", "score": 80}, reason="needs approval", approver_groups=["sre-leads"],
            min_approvals=2, ttl_seconds=900, expires_at=0, state="pending",
        )  # fmt: skip
        made, _ = await store.find_or_create(req)
        return made.id
    finally:
        await store.close()


def test_a_vote_decided_by_an_opa_of_the_caller_s_choosing_says_so(tmp_path: Path, allow_all: str) -> None:
    cfg_path = write(tmp_path, minimal(tmp_path))
    aid = asyncio.run(_pending(cfg_path))
    cfg = load(cfg_path)
    assert cfg.auth.hs256_secret is not None
    token = mint_hs256(
        cfg.auth.hs256_secret.read(), issuer=cfg.auth.issuer, audience=cfg.auth.audience, sub="alice",
        roles=[], groups=["sre-leads"], kind="human",
    )  # fmt: skip
    token_file = tmp_path / "alice.jwt"
    token_file.write_text(token)
    r = run_pvegate(
        "approvals", "approve", aid, "-c", str(cfg_path), "--token-file", str(token_file), "--opa-url", allow_all,
        timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "approval recorded: 1/2" in r.stdout
    votes = [
        row
        for row in auditlib.search(cfg.audit_path, auditlib.Query(kind="approval", limit=10))
        if row["request_id"] == aid
    ]
    assert len(votes) == 1
    body = auditlib.parse_body(votes[0])
    assert body["verdict"] == "approve" and body["ok"] is True
    assert body["opa"] == {"url": allow_all, "chosen_by": "--opa-url", "configured": "managed sidecar"}
