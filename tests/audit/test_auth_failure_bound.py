"""Bad credentials cannot grow the audit without bound (a real gateway, its default bound): per client
address and minute the first failures get their own `auth_failure` row, the rest are counted and
written as one summary row (outcome `suppressed`) once the minute is over or the gateway stops; the
client's answer does not change, and /metrics counts every failure."""

from __future__ import annotations

import json
import ssl
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.dev.devenv import DevEnv, make_env
from gateway.store import audit as auditlib
from tests.support import GatewayThread, audit_rows, free_port

BAD = {"Authorization": "Bearer not-a-jwt", "MCP-Protocol-Version": "2025-06-18"}
LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


class Clock:
    """The bound's clock, held still at the start of a minute, so no real minute ends mid-test."""

    def __init__(self) -> None:
        self.now = time.time() // 60 * 60 + 1

    def __call__(self) -> float:
        return self.now


def bounded_env(tmp_path: Path, sim: Any) -> DevEnv:
    # make_env lifts the bound for the other tests; `audit: {}` gives this gateway the default again
    env = make_env(tmp_path / "gw", {"default": sim}, port=free_port(), extra={"audit": {}})
    assert env.config.audit_auth_failure_rows_per_minute == 20
    return env


def start(env: DevEnv) -> tuple[GatewayThread, Clock]:
    gw = GatewayThread(env.config).start()
    clock = Clock()
    gw.components.auth_failures.clock = clock
    return gw, clock


def client(env: DevEnv) -> httpx.Client:
    return httpx.Client(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=30)


def failures(env: DevEnv) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the auth_failure rows of their own, the bodies of the summary rows)"""
    rows = [r for r in audit_rows(env.config.audit_path) if r["kind"] == "auth_failure"]
    return [r for r in rows if r["outcome"] != "suppressed"], [
        json.loads(r["body"]) for r in rows if r["outcome"] == "suppressed"
    ]


def answer(r: httpx.Response) -> tuple[int, Any, str | None]:
    return r.status_code, r.json(), r.headers.get("www-authenticate")


def auth_failure_counts(http: httpx.Client, env: DevEnv) -> dict[tuple[str, str], float]:
    admin = env.config.admin.token.read()  # type: ignore[union-attr]
    r = http.get(f"https://127.0.0.1:{env.config.port}/metrics", headers={"Authorization": f"Bearer {admin}"})
    assert r.status_code == 200, r.text
    return {
        (s.labels["surface"], s.labels["recorded"]): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
        if s.name == "pvegate_auth_failures_total"
    }


def test_rows_per_address_then_one_summary_row(xsim: Any, tmp_path: Path) -> None:
    env = bounded_env(tmp_path, xsim)
    n = env.config.audit_auth_failure_rows_per_minute
    gw, clock = start(env)
    base = f"https://127.0.0.1:{env.config.port}"
    try:
        with client(env) as http:
            mcp = [answer(http.post(base + "/mcp", json=LIST, headers=BAD)) for _ in range(n + 10)]
            admin = [
                answer(http.get(base + "/admin/health", headers={"Authorization": "Bearer wrong"})) for _ in range(5)
            ]
            # the answer is the same, whether the failure got a row of its own or was only counted
            assert mcp[0][0] == 401 and all(a == mcp[0] for a in mcp), mcp[0]
            assert admin[0][0] == 401 and all(a == admin[0] for a in admin), admin[0]

            full, summaries = failures(env)
            assert len(full) == n and summaries == []  # n + 15 failures from 127.0.0.1, n rows
            assert all(json.loads(r["body"])["source_ip"] == "127.0.0.1" for r in full)
            counts = auth_failure_counts(http, env)
            assert counts[("mcp", "row")] == n and counts[("mcp", "suppressed")] == 10
            assert counts[("admin", "row")] == 0 and counts[("admin", "suppressed")] == 5
            assert sum(counts.values()) == n + 15  # every failure counted

            clock.now += 60  # the next minute: its first failure has a row again, after the summary
            assert http.post(base + "/mcp", json=LIST, headers=BAD).status_code == 401
            full, summaries = failures(env)
            assert len(full) == n + 1
            (summary,) = summaries
            assert summary["source_ip"] == "127.0.0.1" and summary["count"] == 15 and summary["audited"] == n
            assert summary["surfaces"] == {"admin": 5, "mcp": 10}
            assert summary["outcomes"] == {"invalid_token": 15}
            assert summary["window_start"] < summary["window_end"]
            assert sum(auth_failure_counts(http, env).values()) == n + 16
    finally:
        gw.stop()
    assert auditlib.verify(env.config.audit_path, key=env.config.audit_key_path).ok  # one chain, summaries too


def test_what_was_only_counted_is_written_at_shutdown(xsim: Any, tmp_path: Path) -> None:
    env = bounded_env(tmp_path, xsim)
    n = env.config.audit_auth_failure_rows_per_minute
    gw, _ = start(env)
    try:
        with client(env) as http:
            for _ in range(n + 3):
                assert http.post(env.url, json=LIST, headers=BAD).status_code == 401
        full, summaries = failures(env)
        assert len(full) == n and summaries == []  # the last 3 only counted, so far
    finally:
        gw.stop()
    full, summaries = failures(env)
    assert len(full) == n
    assert [(s["source_ip"], s["count"], s["surfaces"]) for s in summaries] == [("127.0.0.1", 3, {"mcp": 3})]
