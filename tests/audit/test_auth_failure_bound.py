"""Bad credentials cannot grow the audit without bound (a real gateway, its default bound): per client
address and minute the first failures get their own `auth_failure` row, the rest are counted and
written as one summary row (outcome `suppressed`) once the minute is over or the gateway stops; the
client's answer does not change, and /metrics counts every failure. The same holds, in one budget per
address, for the other rows anyone can cause without a credential: the transport guard's refusals
(kind `refusal`) and refused console sign-ins (kind `console`), each summed up in its own kind."""

from __future__ import annotations

import json
import secrets
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
        if s.name == "pvegate_unauthenticated_refusals_total"
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


def bounded_at(tmp_path: Path, sim: Any, rows: int, extra: dict[str, Any] | None = None) -> DevEnv:
    """A gateway with the bound set low (make_env lifts it for the other tests)."""
    bound = {"audit": {"auth_failure_rows_per_minute": rows}}
    env = make_env(tmp_path / "gw", {"default": sim}, port=free_port(), extra={**bound, **(extra or {})})
    assert env.config.audit_auth_failure_rows_per_minute == rows
    return env


def of_kind(env: DevEnv, kind: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the rows of `kind` of their own, the bodies of its summary rows)"""
    rows = [r for r in audit_rows(env.config.audit_path) if r["kind"] == kind]
    return [r for r in rows if r["outcome"] != "suppressed"], [
        json.loads(r["body"]) for r in rows if r["outcome"] == "suppressed"
    ]


def test_refusals_before_authentication_share_the_bound(xsim: Any, tmp_path: Path) -> None:
    """A wrong Host is refused (421) before any credential is looked at, so anyone can send it: its
    `refusal` rows are bounded per address like auth failures, in one budget with them, and summed up
    in a `refusal` row of outcome `suppressed`."""
    n, k = 4, 7
    env = bounded_at(tmp_path, xsim, n)
    gw, clock = start(env)
    base = f"https://127.0.0.1:{env.config.port}"
    wrong_host = {"Host": "evil.example", "MCP-Protocol-Version": "2025-06-18"}
    try:
        with client(env) as http:
            refused = [answer(http.post(base + "/mcp", json=LIST, headers=wrong_host)) for _ in range(n + k)]
            assert refused[0][0] == 421 and all(a == refused[0] for a in refused), refused[0]
            assert "evil.example" in refused[0][1]["error"]["message"]
            # the address's budget is spent: its bad credentials are only counted now, same answer
            assert [http.post(base + "/mcp", json=LIST, headers=BAD).status_code for _ in range(2)] == [401, 401]

            full, summaries = of_kind(env, "refusal")
            assert [r["outcome"] for r in full] == ["host_refused"] * n and summaries == []
            assert all(json.loads(r["body"])["source_ip"] == "127.0.0.1" for r in full)
            assert of_kind(env, "auth_failure") == ([], [])
            counts = auth_failure_counts(http, env)
            assert counts[("transport", "row")] == n and counts[("transport", "suppressed")] == k
            assert counts[("mcp", "row")] == 0 and counts[("mcp", "suppressed")] == 2

            clock.now += 60  # the next minute: its first refusal has a row again, after the summaries
            assert http.post(base + "/mcp", json=LIST, headers=wrong_host).status_code == 421
            full, summaries = of_kind(env, "refusal")
            assert len(full) == n + 1
            (summary,) = summaries
            assert summary["source_ip"] == "127.0.0.1" and summary["count"] == k and summary["audited"] == n
            assert summary["outcomes"] == {"host_refused": k} and summary["surfaces"] == {"transport": k}
            assert summary["window_start"] < summary["window_end"]
            assert [(s["count"], s["audited"], s["surfaces"]) for s in of_kind(env, "auth_failure")[1]] == [
                (2, 0, {"mcp": 2})
            ]
    finally:
        gw.stop()
    assert auditlib.verify(env.config.audit_path, key=env.config.audit_key_path).ok


def test_refused_console_sign_ins_are_bounded(xsim: Any, tmp_path: Path) -> None:
    """/admin/callback refuses a sign-in with no attempt in progress to anyone who asks: its `console`
    rows (action sign_in, outcome refused) are bounded per address, summed up in a `console` row of
    outcome `suppressed`."""
    n, k = 3, 5
    key = tmp_path / "console-session-key"
    key.write_text(secrets.token_urlsafe(48))
    key.chmod(0o600)
    console = {
        "enabled": True,
        "issuer": f"http://127.0.0.1:{free_port()}/realms/none",  # never asked: no attempt gets that far
        "client_id": "pvegate-console",
        "session_key": {"file": str(key)},
    }
    env = bounded_at(tmp_path, xsim, n, {"console": console})
    assert env.config.console.enabled
    gw, clock = start(env)
    url = f"https://127.0.0.1:{env.config.port}/admin/callback?code=x&state=y"
    try:
        with client(env) as http:
            pages = [http.get(url) for _ in range(n + k)]
            assert all(p.status_code == 400 and "no attempt in progress" in p.text for p in pages)
            assert len({p.text for p in pages}) == 1  # the same page, recorded or counted

            def sign_ins() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
                full, summaries = of_kind(env, "console")
                return [json.loads(r["body"]) for r in full if r["outcome"] == "refused"], summaries

            full, summaries = sign_ins()
            assert len(full) == n and summaries == []
            assert all(b["action"] == "sign_in" and b["source_ip"] == "127.0.0.1" for b in full)
            counts = auth_failure_counts(http, env)
            assert counts[("console", "row")] == n and counts[("console", "suppressed")] == k

            clock.now += 60
            assert http.get(url).status_code == 400
            full, summaries = sign_ins()
            assert len(full) == n + 1
            (summary,) = summaries
            assert summary["action"] == "sign_in" and summary["source_ip"] == "127.0.0.1"
            assert summary["count"] == k and summary["audited"] == n
            assert summary["outcomes"] == {"refused": k} and summary["surfaces"] == {"console": k}
    finally:
        gw.stop()
    assert auditlib.verify(env.config.audit_path, key=env.config.audit_key_path).ok
