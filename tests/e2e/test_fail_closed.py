"""The decision client denies on every kind of doubt. Faults come from the real OPA
running deliberately broken policies; only "something that is not OPA" is a raw socket."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.policy.decisions import DecisionClient
from gateway.policy.opa_sidecar import OPASidecar, free_port

CALL = {"contract_version": 1, "kind": "call"}

POLICIES = {
    # a buggy policy: allows without the rest of the contract
    "wrong_shape": 'package pvegate\n\ndecision := {"allow": true}\n',
    # allow is a string, deny is missing: still not a decision
    "wrong_types": 'package pvegate\n\ndecision := {"allow": "yes", "deny": "none"}\n',
    # two complete definitions disagree at run time: OPA answers HTTP 500
    "conflict": 'package pvegate\n\ndecision := {"allow": false, "deny": []} if true\n\n'
    'decision := {"allow": true, "deny": []} if input.kind == "call"\n',
    # no pvegate.decision at all: the result is undefined
    "undefined": "package pvegate\n\nsomething_else := true\n",
    # an expensive policy: slower than the gateway's timeout
    "slow": "package pvegate\n\ndecision := d if {\n"
    "\tn := count([x | some x in numbers.range(1, 30000000); x % 7 == 0])\n"
    '\td := {"allow": n > 0, "deny": []}\n}\n',
}


@pytest.fixture(params=sorted(POLICIES))
def broken_opa(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, OPASidecar]]:
    (tmp_path / "p.rego").write_text(POLICIES[request.param])
    opa = OPASidecar(policies=(tmp_path,), decision_logs=False)
    opa.start()
    yield request.param, opa
    opa.stop()


EXPECTED = {
    "wrong_shape": "does not match the contract",
    "wrong_types": "does not match the contract",
    "conflict": "OPA answered HTTP 500",
    "undefined": "policy result undefined",
    "slow": "did not answer within 300 ms",
}


async def test_broken_policies_deny(broken_opa: tuple[str, OPASidecar]) -> None:
    name, opa = broken_opa
    client = DecisionClient(opa.url, timeout_ms=300)
    try:
        d = await client.decide(CALL)
        assert d.allow is False and d.failed_closed
        assert EXPECTED[name] in d.deny[0], d.deny
        assert await client.visible_tools({"kind": "list"}) is None
        verdict = await client.may_approve({"kind": "approve"})
        assert verdict.allowed is False and verdict.reasons
    finally:
        await client.close()


def _garbage_server() -> tuple[int, threading.Event]:
    """Something that is not OPA answers on the port: HTTP 200 with an HTML page."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                body = b"<html>hello</html>"
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                )
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1], stop


async def test_a_peer_that_is_not_opa_denies() -> None:
    port, stop = _garbage_server()
    client = DecisionClient(f"http://127.0.0.1:{port}", timeout_ms=500)
    try:
        d = await client.decide(CALL)
        assert not d.allow and "not JSON" in d.deny[0]
    finally:
        stop.set()
        await client.close()


async def test_nothing_listening_denies() -> None:
    client = DecisionClient(f"http://127.0.0.1:{free_port()}", timeout_ms=300)
    try:
        d = await client.decide(CALL)
        assert not d.allow and "OPA unreachable" in d.deny[0]
    finally:
        await client.close()


# A policy bug that answers "allow" while its own answer says no: an allow with an unmet
# approval (the call would run unapproved) and an approver allowed with a reason against
# it. Both are contract breaches (decision.schema.json, the approver contract) and deny.
CONTRADICTIONS = {
    "decision.rego": "package pvegate\n\n"
    "decision := {\n"
    '\t"contract_version": 1,\n\t"allow": true,\n\t"deny": [],\n'
    '\t"risk": {"score": 90, "level": "critical", "factors": []},\n'
    '\t"approval": {"required": true, "satisfied": false, "approver_groups": ["sre-leads"],\n'
    '\t\t"min_approvals": 1, "ttl_seconds": 900, "reason": "critical risk"},\n'
    '\t"obligations": {"dry_run": false, "redact": [], "max_items": 10},\n'
    '\t"quota": null,\n}\n',
    "approver.rego": "package pvegate.approver\n\n"
    'decision := {"allow": true, "deny": ["the approver is the requester (four-eyes)"], "groups": ["sre-leads"]}\n',
}


@pytest.fixture
def contradicting_opa(tmp_path: Path) -> Iterator[OPASidecar]:
    for name, text in CONTRADICTIONS.items():
        (tmp_path / name).write_text(text)
    opa = OPASidecar(policies=(tmp_path,), decision_logs=False)
    opa.start()
    yield opa
    opa.stop()


async def test_allow_with_an_unmet_approval_fails_closed(contradicting_opa: OPASidecar) -> None:
    client = DecisionClient(contradicting_opa.url, timeout_ms=2000)
    try:
        d = await client.decide(CALL)
        assert d.allow is False and d.failed_closed, d
        assert "does not match the contract at approval" in d.deny[0], d.deny
        assert d.approval_required is False  # a contract breach asks nobody for an approval either
    finally:
        await client.close()


async def test_approver_allowed_with_a_deny_reason_fails_closed(contradicting_opa: OPASidecar) -> None:
    client = DecisionClient(contradicting_opa.url, timeout_ms=2000)
    try:
        verdict = await client.may_approve({"kind": "approve"})
        assert verdict.allowed is False and verdict.groups == [], verdict
        assert verdict.reasons == ["denied: approver decision does not match the contract"], verdict
    finally:
        await client.close()
