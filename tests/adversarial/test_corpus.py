"""The adversarial corpus (tests/adversarial/corpus/*.yaml) against the live gateway over HTTPS.

For every hostile input: a clean refusal (no 5xx, no stack trace, no secret in the
answer), the audit record its kind calls for (see docs/performance.md, "Adversarial
corpus"), and, from the simulator's request and SSH logs, nothing reached Proxmox
that the policy did not allow.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import pytest
import yaml

from gateway.dev.devenv import DevEnv
from tests.adversarial.tokens import authorization
from tests.support import GatewayThread

CORPUS = Path(__file__).resolve().parent / "corpus"
STACK_MARKERS = ("Traceback (most recent call last)", 'File "/', "Exception:", "Error(", "  at ", '.py", line')
ALL_STATUSES_UNDER_500 = range(100, 500)


def load_cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for path in sorted(CORPUS.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for case in doc["cases"]:
            case["family"] = doc["family"]
            cases.append(case)
    return cases


CASES = load_cases()


def test_corpus_is_big_and_ids_are_unique() -> None:
    ids = [c["id"] for c in CASES]
    assert len(ids) >= 300
    assert len(set(ids)) == len(ids)


# --- building the request -------------------------------------------------------------


def sub_for(case: dict[str, Any]) -> str:
    return "adv-" + re.sub(r"[^a-zA-Z0-9-]", "_", case["id"])[:56]


def body_of(case: dict[str, Any]) -> bytes | AsyncIterator[bytes] | None:
    if "body_raw" in case:
        return str(case["body_raw"]).encode("utf-8", "surrogatepass")
    if "body_hex" in case:
        return bytes.fromhex(case["body_hex"])
    if "body" in case:
        return json.dumps(case["body"]).encode()
    if "gen" in case:
        return generated(case["gen"])
    if "call" in case:
        c = case["call"]
        params: dict[str, Any] = {"name": c["tool"], "arguments": c.get("arguments", {})}
        if "meta" in c:
            params["_meta"] = c["meta"]
        return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).encode()
    return None


async def chunks(raw: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(raw), 65536):
        yield raw[i : i + 65536]


def generated(gen: dict[str, Any]) -> bytes | AsyncIterator[bytes]:
    kind, n = gen["kind"], int(gen["size"])
    head = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_nodes","arguments":'
    if kind == "pad_argument":
        return (head + '{"cluster":"' + "x" * n + '"}}}').encode()
    if kind == "pad_envelope":
        raw = (head + '{}},"pad":"' + "x" * n + '"}').encode()
        if gen.get("chunked"):  # no Content-Length: the cap must hold for a streamed body too
            return chunks(raw)
        return raw
    if kind == "many_keys":
        return (head + json.dumps({f"k{i}": i for i in range(n)}) + "}}").encode()
    if kind == "deep_arguments":
        return (head + '{"cluster":' + "[" * n + "]" * n + "}}}").encode()
    if kind == "batch":
        return json.dumps([{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(n)]).encode()
    raise KeyError(kind)


def headers_of(case: dict[str, Any], env: DevEnv) -> list[tuple[str, str]]:
    sub = sub_for(case)
    h: dict[str, str] = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2025-06-18",
    }
    p = case.get("principal") or {}
    auth: str | list[str] | None
    if "token" in case:
        auth = authorization(case["token"], env, sub)
    else:
        auth = "Bearer " + env.token(
            sub, p.get("roles", ["operator"]), groups=p.get("groups", []), kind=p.get("kind", "agent")
        )
    for k, v in (case.get("headers") or {}).items():
        h = {hk: hv for hk, hv in h.items() if hk.lower() != k.lower()}
        h[k] = v
    for k in case.get("headers_remove") or []:
        h = {hk: hv for hk, hv in h.items() if hk.lower() != k.lower()}
    out = list(h.items())
    if isinstance(auth, list):
        out += [("Authorization", a) for a in auth]
    elif auth is not None:
        out.append(("Authorization", auth))
    return out


# --- checking ---------------------------------------------------------------------------


def max_seq(db: Path) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(con.execute("SELECT COALESCE(MAX(seq), 0) FROM audit").fetchone()[0])
    finally:
        con.close()


def rows_after(db: Path, seq: int) -> list[dict[str, Any]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM audit WHERE seq > ? ORDER BY seq", (seq,))]
    finally:
        con.close()


def secrets_of(env: DevEnv, sim: Any) -> list[str]:
    out = [env.jwt_secret, *sim.tokens.values()]
    admin = env.config.admin.token
    if admin is not None:
        out.append(admin.read())
    return [s for s in out if s]


def is_refused(r: httpx.Response) -> bool:
    if r.status_code >= 400:
        return True
    try:
        doc = r.json()
    except ValueError:
        return False
    if not isinstance(doc, dict):
        return False
    if "error" in doc:
        return True
    res = doc.get("result") or {}
    return bool(res.get("isError"))


def check_clean(r: httpx.Response, secrets: list[str]) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:500])
    text = r.text
    for marker in STACK_MARKERS:
        assert marker not in text, f"stack-trace marker {marker!r} in answer: {text[:500]}"
    blob = text + "\n" + "\n".join(f"{k}: {v}" for k, v in r.headers.items())
    for s in secrets:
        assert s not in blob, "a secret reached the client"


def check_expectation(case: dict[str, Any], responses: list[httpx.Response]) -> None:
    exp = case.get("expect") or {}
    statuses = exp.get("status")
    want = exp.get("result", "refused")
    for r in responses:
        if statuses:
            assert r.status_code in statuses, (r.status_code, r.text[:300])
        if want == "refused":
            assert is_refused(r), r.text[:300]
        elif want == "empty":
            assert r.content in (b"", b"null"), r.text[:300]
        elif want == "ok":
            assert not is_refused(r), r.text[:300]
        if exp.get("text"):
            assert exp["text"].lower() in r.text.lower(), r.text[:300]


def check_audit(case: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    exp = case.get("expect") or {}
    kind = exp.get("audit", "any")
    if kind == "any":
        return
    if kind == "none":
        assert rows == [], [(r["kind"], r["outcome"]) for r in rows]
        return
    mine = [r for r in rows if r["kind"] == kind]
    assert mine, f"no {kind} audit record; got {[(r['kind'], r['outcome']) for r in rows]}"
    outcome = exp.get("outcome")
    if outcome is not None:
        allowed = outcome if isinstance(outcome, list) else [outcome]
        assert any(r["outcome"] in allowed for r in mine), [(r["kind"], r["outcome"]) for r in rows]
    if exp.get("source_ip"):
        for r in mine:
            assert json.loads(r["body"]).get("source_ip") == exp["source_ip"], r["body"]


def check_proxmox(
    case: dict[str, Any], rows: list[dict[str, Any]], requests: list[dict[str, Any]], ssh: list[Any]
) -> None:
    """Nothing reached Proxmox that the policy did not allow."""
    allowed = [r for r in rows if r["kind"] == "decision" and r["outcome"] == "allow"]
    for e in requests:
        segments = [unquote(s) for s in urlsplit(e["path"]).path.split("/")]
        assert "." not in segments and ".." not in segments, f"dot segment reached Proxmox: {e['path']}"
    if not allowed:
        # the only request allowed before a decision is the target-facts lookup
        stray = [e for e in requests if not (e["method"] == "GET" and e["path"].endswith("/cluster/resources"))]
        assert stray == [], f"reached Proxmox without an allow decision: {stray[:3]}"
        assert ssh == [], f"SSH command ran without an allow decision: {ssh[:3]}"
    else:
        mutations = [e for e in requests if e["method"] != "GET"]
        assert mutations == [], f"corpus inputs must never mutate: {mutations[:3]}"
    if "quota_denied_at_least" in (case.get("expect") or {}):
        exp = case["expect"]
        denied = [r for r in rows if r["kind"] == "decision" and exp["quota_text"] in r["body"]]
        assert len(denied) >= exp["quota_denied_at_least"], len(denied)
        if case["call"]["tool"] == "list_nodes":  # every allowed call read /nodes once, no denied one did
            reads = [e for e in requests if e["method"] == "GET" and e["path"].endswith("/api2/json/nodes")]
            assert len(reads) == len(allowed)


# --- the test ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
async def test_hostile_input(case: dict[str, Any], advgw: GatewayThread, advenv: DevEnv, advsim: Any) -> None:
    db = advenv.config.audit_path
    before = max_seq(db)
    advsim.clear_logs()
    url = f"https://127.0.0.1:{advenv.config.port}{case.get('path', '/mcp')}"
    if case.get("token") == "token_in_query":
        url += "?access_token=" + advenv.token(sub_for(case), ["operator"])
    method = case.get("method", "POST")
    hdrs = headers_of(case, advenv)
    n = int(case.get("concurrent", case.get("repeat", 1)))
    ctx = ssl.create_default_context(cafile=str(advenv.ca_file))
    limits = httpx.Limits(max_connections=max(n, 1) if "concurrent" in case else 4)
    async with httpx.AsyncClient(verify=ctx, timeout=60.0, limits=limits) as http:

        async def send() -> httpx.Response:
            return await http.request(method, url, content=body_of(case), headers=hdrs)

        if "concurrent" in case:
            responses = list(await asyncio.gather(*(send() for _ in range(n))))
        else:
            responses = [await send() for _ in range(n)]
    secrets = secrets_of(advenv, advsim)
    for r in responses:
        check_clean(r, secrets)
    check_expectation(case, responses)
    rows = rows_after(db, before)
    check_proxmox(case, rows, advsim.requests_log(), advsim.ssh_log())  # never excused
    try:
        check_audit(case, rows)
    except AssertionError:
        if case.get("xfail"):  # a known, reported gap: recorded, not hidden
            pytest.xfail(case["xfail"])
        raise
