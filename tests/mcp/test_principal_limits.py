"""Limits per principal (gateway/store/principal_limits.py) on the real gateway, real OPA and the simulator:
a principal over its refusal budget is refused at the door (nothing asked of OPA, nothing audited one by
one) while others are served; the throttle lifts after the window; its calls in flight are capped while
another principal's are not; door refusals are summed up in a bounded number of audit rows."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from gateway.dev.devenv import DevEnv, make_env
from gateway.mcp import principal_limits
from gateway.store.principal_limits import PrincipalLimits
from tests.adversarial.test_corpus import max_seq, rows_after
from tests.support import GatewayThread, free_port

BUDGET = 5  # refused_calls_per_minute_per_principal here
INFLIGHT = 3  # max_inflight_per_principal here
LIMITS = {"refused_calls_per_minute_per_principal": BUDGET, "max_inflight_per_principal": INFLIGHT}
T = TypeVar("T")


@pytest.fixture(scope="module")
def lsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("limsim"))  # its own: the faults set here
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def lenv(lsim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(tmp_path_factory.mktemp("limgw"), {"default": lsim}, port=free_port(), extra=LIMITS)


@pytest.fixture(scope="module")
def lgw(lenv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(lenv.config).start()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def http(lenv: DevEnv) -> Iterator[httpx.Client]:
    with httpx.Client(verify=ssl.create_default_context(cafile=str(lenv.ca_file)), timeout=60) as client:
        yield client


@pytest.fixture
def limits(lgw: GatewayThread) -> Iterator[PrincipalLimits]:
    lim = lgw.components.principal_limits
    clock = lim.clock
    yield lim
    lim.clock = clock


def headers(env: DevEnv, who: str, roles: list[str]) -> dict[str, str]:
    return {
        "authorization": f"Bearer {env.token(who, roles)}",
        "accept": "application/json",
        "content-type": "application/json",
        "mcp-protocol-version": "2025-06-18",
    }


def call_doc(tool: str, arguments: Any = None, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": tool, "arguments": arguments or {}}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}


def post(env: DevEnv, http: httpx.Client, who: str, roles: list[str], doc: Any) -> httpx.Response:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return http.post(env.url, content=body, headers=headers(env, who, roles))


def outcome(r: httpx.Response) -> str:
    assert r.status_code == 200, (r.status_code, r.text[:300])
    return str(r.json()["result"]["_meta"]["pvegate/outcome"])


def assert_throttled(r: httpx.Response, reason: str) -> dict[str, Any]:
    assert r.status_code == 429, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert err["code"] == principal_limits.TOO_MANY_REQUESTS and err["data"]["reason"] == reason, err
    assert r.json()["id"] == 7
    wait = err["data"]["retry_after_seconds"]
    assert r.headers["retry-after"] == str(wait)
    assert "Traceback" not in r.text
    return dict(err)


def on_loop(gw: GatewayThread, fn: Callable[[], T]) -> T:
    """`fn()` on the gateway's loop (what it reads the loop mutates)."""
    assert gw.loop is not None

    async def run() -> T:
        return fn()

    return asyncio.run_coroutine_threadsafe(run(), gw.loop).result(timeout=30)


def metric(gw: GatewayThread, name: str, labels: str = "") -> float:
    text = on_loop(gw, gw.components.metrics.render).decode()
    m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, flags=re.M)
    return float(m.group(1)) if m else 0.0


def decisions(gw: GatewayThread) -> float:
    return sum(metric(gw, "pvegate_decisions_total", f'{{outcome="{o}"}}') for o in ("allow", "deny", "pending"))


def mine(db: Path, before: int, who: str) -> list[dict[str, Any]]:
    return [r for r in rows_after(db, before) if r["principal"] == who]


def test_a_principal_over_its_refusal_budget_is_refused_at_the_door_while_another_is_served(
    lgw: GatewayThread, lenv: DevEnv, http: httpx.Client
) -> None:
    db = lenv.config.audit_path
    bad, good = "lim-roleless", "lim-viewer"
    before = max_seq(db)
    for _ in range(BUDGET):  # no role: every call denied by policy, each decided and audited
        assert outcome(post(lenv, http, bad, [], call_doc("list_nodes"))) == "denied"
    assert [(r["kind"], r["outcome"]) for r in mine(db, before, bad)] == [("received", None), ("decision", "deny")] * 5
    asked, limited = decisions(lgw), metric(lgw, "pvegate_principal_limited_total", '{reason="refusal_budget"}')
    seq = max_seq(db)

    err = assert_throttled(post(lenv, http, bad, [], call_doc("list_nodes")), "refusal_budget")
    assert 1 <= err["data"]["retry_after_seconds"] <= 60
    assert "refused_calls_per_minute_per_principal" in err["message"] and "retry after" in err["message"]
    # its tools/list too, and a protocol fault is answered as usual but not written
    assert_throttled(post(lenv, http, bad, [], {"jsonrpc": "2.0", "id": 7, "method": "tools/list"}), "refusal_budget")
    assert post(lenv, http, bad, [], b"{").status_code == 400

    assert mine(db, seq, bad) == []  # counted, not audited one by one
    assert decisions(lgw) == asked  # OPA was not asked
    assert metric(lgw, "pvegate_principal_limited_total", '{reason="refusal_budget"}') == limited + 3
    text = on_loop(lgw, lgw.components.metrics.render).decode()
    assert bad not in text  # no principal in a label

    assert outcome(post(lenv, http, good, ["viewer"], call_doc("list_nodes"))) == "allowed"  # another principal


def test_every_kind_of_refusal_counts_and_allowed_calls_never_do(
    lgw: GatewayThread, lenv: DevEnv, http: httpx.Client
) -> None:
    who = "lim-mixed"
    for _ in range(3 * BUDGET):  # allowed calls: any number
        assert outcome(post(lenv, http, who, ["viewer"], call_doc("list_nodes"))) == "allowed"
    assert outcome(post(lenv, http, who, ["viewer"], call_doc("vm_start", {"vmid": 100}))) == "denied"  # policy
    assert outcome(post(lenv, http, who, ["viewer"], call_doc("list_nodes", {"bogus": 1}))) == "invalid"
    r = post(lenv, http, who, ["viewer"], call_doc("no_such_tool"))
    assert r.json()["error"]["code"] == -32602  # an unknown tool
    assert post(lenv, http, who, ["viewer"], b"{").status_code == 400  # a protocol fault
    assert outcome(post(lenv, http, who, ["viewer"], call_doc("list_nodes"))) == "allowed"  # 4 refused: room left
    r = post(lenv, http, who, ["viewer"], call_doc("list_nodes", {}, {"dry_run": "yes"}))
    assert r.json()["error"]["code"] == -32602  # the fifth
    assert_throttled(post(lenv, http, who, ["viewer"], call_doc("list_nodes")), "refusal_budget")


def test_upstream_failures_do_not_count(lgw: GatewayThread, lenv: DevEnv, http: httpx.Client, lsim: Any) -> None:
    who = "lim-upstream"
    lsim.set_faults(error_rate=1.0, error_path="^/nodes$")
    try:
        for _ in range(BUDGET + 2):
            assert outcome(post(lenv, http, who, ["viewer"], call_doc("list_nodes"))) == "failed"
    finally:
        lsim.set_faults(error_rate=0, error_path=None)
    assert outcome(post(lenv, http, who, ["viewer"], call_doc("list_nodes"))) == "allowed"


def test_the_throttle_lifts_after_the_window(
    lgw: GatewayThread, lenv: DevEnv, http: httpx.Client, limits: PrincipalLimits
) -> None:
    who = "lim-later"
    for _ in range(BUDGET):
        assert outcome(post(lenv, http, who, [], call_doc("list_nodes"))) == "denied"
    err = assert_throttled(post(lenv, http, who, [], call_doc("list_nodes")), "refusal_budget")
    real = limits.clock
    limits.clock = lambda: real() + err["data"]["retry_after_seconds"] - 1.5  # not yet
    assert_throttled(post(lenv, http, who, [], call_doc("list_nodes")), "refusal_budget")
    limits.clock = lambda: real() + 61  # a window later
    assert outcome(post(lenv, http, who, [], call_doc("list_nodes"))) == "denied"  # decided again
    assert outcome(post(lenv, http, who, ["viewer"], call_doc("list_nodes"))) == "allowed"


async def test_calls_in_flight_are_capped_per_principal_not_across_principals(
    lgw: GatewayThread, lenv: DevEnv, lsim: Any
) -> None:
    busy, other = "lim-busy", "lim-other"
    lsim.set_faults(latency_ms=2500, latency_path="^/nodes$")  # list_nodes takes 2.5 s: calls stay in flight
    ctx = ssl.create_default_context(cafile=str(lenv.ca_file))
    try:
        async with httpx.AsyncClient(verify=ctx, timeout=60, limits=httpx.Limits(max_connections=20)) as client:

            async def send(who: str) -> httpx.Response:
                body = json.dumps(call_doc("list_nodes")).encode()
                return await client.post(lenv.url, content=body, headers=headers(lenv, who, ["viewer"]))

            held = [asyncio.create_task(send(busy)) for _ in range(INFLIGHT)]
            deadline = time.monotonic() + 20
            while metric(lgw, "pvegate_calls_in_flight") < INFLIGHT:  # all of them held by the slow /nodes
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            started = time.monotonic()
            refused = await send(busy)  # the N+1th: at once, not after the 2.5 s
            assert time.monotonic() - started < 2.0
            err = assert_throttled(refused, "inflight")
            assert err["data"]["retry_after_seconds"] == 1 and "max_inflight_per_principal" in err["message"]
            others = [asyncio.create_task(send(other)) for _ in range(INFLIGHT)]  # another principal: served
            for r in await asyncio.gather(*held, *others):
                assert outcome(r) == "allowed"
            assert metric(lgw, "pvegate_calls_in_flight") == 0
            assert outcome(await send(busy)) == "allowed"
    finally:
        lsim.set_faults(latency_ms=0, latency_path=None)


def test_door_refusals_are_summed_up_in_one_row_per_principal_and_minute(
    lgw: GatewayThread, lenv: DevEnv, http: httpx.Client, limits: PrincipalLimits
) -> None:
    db = lenv.config.audit_path
    who, n = "lim-flood", 1000
    for _ in range(BUDGET):
        assert outcome(post(lenv, http, who, [], call_doc("list_nodes"))) == "denied"
    seq = max_seq(db)
    frozen = limits.clock()
    limits.clock = lambda: frozen  # all n inside the window, however slow the machine
    limited = metric(lgw, "pvegate_principal_limited_total", '{reason="refusal_budget"}')
    for _ in range(n):
        assert post(lenv, http, who, [], call_doc("list_nodes")).status_code == 429
    assert metric(lgw, "pvegate_principal_limited_total", '{reason="refusal_budget"}') == limited + n
    summaries = limits.summaries
    later = time.time() + 120
    summaries.clock = lambda: later  # the minute is over: its summary is due (the sweep a moment later)
    assert lgw.loop is not None
    asyncio.run_coroutine_threadsafe(summaries.sweep(), lgw.loop).result(timeout=30)
    rows = mine(db, seq, who)
    assert 1 <= len(rows) <= 2, [(r["kind"], r["outcome"]) for r in rows]  # two if the flood crossed a minute
    assert {(r["kind"], r["outcome"]) for r in rows} == {("refusal", "suppressed")}
    bodies = [json.loads(r["body"]) for r in rows]
    assert sum(b["count"] for b in bodies) == n and all(b["principal"] == who for b in bodies), bodies
    assert sum(b["outcomes"]["refusal_budget"] for b in bodies) == n and bodies[0]["audited"] == 0
    assert "refused at its door" in bodies[0]["reason"]


def test_door_refusals_are_summed_up_at_shutdown(lsim: Any, tmp_path: Path) -> None:
    env = make_env(tmp_path / "gw", {"default": lsim}, port=free_port(), extra=LIMITS)
    gw = GatewayThread(env.config).start()
    who, n = "lim-shutdown", 40
    try:
        with httpx.Client(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=60) as client:
            for _ in range(BUDGET):
                assert outcome(post(env, client, who, [], call_doc("list_nodes"))) == "denied"
            lim = gw.components.principal_limits
            frozen = lim.clock()
            lim.clock = lambda: frozen  # the window never ends here
            for _ in range(n):
                assert post(env, client, who, [], call_doc("list_nodes")).status_code == 429
            assert [r["kind"] for r in mine(env.config.audit_path, 0, who)] == ["received", "decision"] * BUDGET
    finally:
        gw.stop()
    rows = [r for r in mine(env.config.audit_path, 0, who) if r["outcome"] == "suppressed"]
    assert sum(json.loads(r["body"])["count"] for r in rows) == n and 1 <= len(rows) <= 2


def test_a_held_call_and_its_retries_count_so_polling_is_bounded(
    lgw: GatewayThread, lenv: DevEnv, http: httpx.Client
) -> None:
    """Each answer `pending_approval` (the held call, and each retry of it before the vote) is a
    `refusal` row: an agent polling as fast as it likes would be an unbounded row source."""
    db, who = lenv.config.audit_path, "lim-poller"
    stop = call_doc("vm_stop", {"vmid": 100})  # an agent stopping a prod guest: held for an approver
    before = max_seq(db)
    for _ in range(BUDGET):
        assert outcome(post(lenv, http, who, ["operator"], stop)) == "pending_approval"
    assert_throttled(post(lenv, http, who, ["operator"], stop), "refusal_budget")
    assert len([r for r in mine(db, before, who) if r["outcome"] in ("pending", "approval_pending")]) == BUDGET


def test_refused_approval_votes_count_and_over_the_budget_are_refused_unwritten(
    lgw: GatewayThread, lenv: DevEnv, http: httpx.Client
) -> None:
    """An agent's token passes the approver endpoints' authentication too: its refused votes are full
    audit rows, bounded by its refusal budget like its refused calls."""
    db, who = lenv.config.audit_path, "lim-voter"
    url = lenv.url.removesuffix("/mcp") + "/admin/approvals/no-such-request/approve"
    auth = {"authorization": f"Bearer {lenv.token(who, ['operator'])}", "content-type": "application/json"}
    for _ in range(BUDGET):
        assert http.post(url, content=b"{}", headers=auth).status_code == 404
    seq = max_seq(db)
    r = http.post(url, content=b"{}", headers=auth)
    assert r.status_code == 429 and r.json()["error"] == "too_many_refusals", r.text
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert mine(db, seq, who) == []
    # its calls are held at the door too: one budget per principal
    assert_throttled(post(lenv, http, who, ["operator"], call_doc("list_nodes")), "refusal_budget")


async def test_refused_votes_sent_at_once_pass_the_budget_by_at_most_the_slots(
    lgw: GatewayThread, lenv: DevEnv
) -> None:
    """A vote takes one of its voter's call slots while it runs: a burst of refused votes is held to the
    refusal budget plus the slots in flight, as a burst of calls is, not to however many arrive at once."""
    who = "lim-burst-voter"
    url = lenv.url.removesuffix("/mcp") + "/admin/approvals/no-such-request/approve"
    auth = {"authorization": f"Bearer {lenv.token(who, ['operator'])}", "content-type": "application/json"}
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(lenv.ca_file)), timeout=60) as client:
        answers = await asyncio.gather(*(client.post(url, content=b"{}", headers=auth) for _ in range(30)))
    codes = [r.status_code for r in answers]
    assert set(codes) <= {404, 429}, codes
    assert codes.count(404) <= BUDGET + INFLIGHT - 1, codes  # the refused votes written (each a row)
    assert {r.json()["error"] for r in answers if r.status_code == 429} <= {"too_many_refusals", "too_many_in_flight"}
