"""Approval hand-off inside the protocol, end to end: real OPA, real approvals, real simulator.

2026-07-28 + URL elicitation → input_required with a sealed requestState; 2025-11-25 + URL
elicitation → -32042; neither → the plain pending result. Each ends with the call running once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import ssl
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import ElicitRequestURLParams, ElicitResult

from gateway.dev.client import mcp_client
from tests.approvals.conftest import Api
from tests.mcp.test_inspector import CLI
from tests.mcp.wire import modern_body, modern_headers
from tests.support import audit_rows

_timeouts = itertools.count(501)
URL_ELICITATION = {"elicitation": {"url": {}}}


def shutdown_args() -> dict[str, Any]:
    return {"vmid": 100, "timeout": next(_timeouts)}  # unique: a distinct call, visible in the sim log


def shutdowns(sim: Any, timeout: int) -> int:
    return sum(
        1
        for r in sim.requests_log()
        if r["method"] == "POST"
        and r["path"].endswith("/status/shutdown")
        and str((r.get("body") or {}).get("timeout")) == str(timeout)
    )


def approver(api: Api) -> str:
    return api.human("alice", ["sre-leads"])


async def _accept(context: Any, params: Any) -> ElicitResult:
    return ElicitResult(action="accept")


Post = Callable[[dict[str, Any]], httpx.Response]


@contextlib.contextmanager
def approved_retry(api: Api, args: dict[str, Any]) -> Iterator[tuple[Post, dict[str, Any]]]:
    """A 2026-07-28 vm_shutdown held for approval and approved: (post, the retry's params).

    The retry carries the held call's requestState and the accepted input response; nothing has
    been sent to Proxmox yet."""
    token = api.agent()
    ctx = ssl.create_default_context(cafile=str(api.env.ca_file))
    with httpx.Client(verify=ctx, timeout=30) as http:

        def post(params: dict[str, Any]) -> httpx.Response:
            body = modern_body("tools/call", params, capabilities=URL_ELICITATION)
            return http.post(api.env.url, json=body, headers=modern_headers(token, "tools/call", "vm_shutdown"))

        first = post({"name": "vm_shutdown", "arguments": args}).json()["result"]
        aid = first["inputRequests"]["pvegate_approval"]["params"]["url"].rsplit("/", 1)[-1]
        assert asyncio.run(api.vote(aid, approver(api))).status_code == 200
        responses = {"pvegate_approval": {"action": "accept"}}
        yield (
            post,
            {
                "name": "vm_shutdown",
                "arguments": args,
                "requestState": first["requestState"],
                "inputResponses": responses,
            },
        )


def legacy_client(api: Api) -> Any:
    """A 2025-11-25 session that declares URL elicitation (the callback is never asked: -32042 instead)."""
    return mcp_client(api.env.url, api.agent(), api.env.ca_file, mode="legacy", elicitation_callback=_accept)


async def test_2026_input_required_round_trip_with_the_sdk_client(api: Api, asim: Any) -> None:
    args = shutdown_args()
    seen: list[ElicitRequestURLParams] = []

    async def on_elicit(context: Any, params: Any) -> ElicitResult:
        assert isinstance(params, ElicitRequestURLParams) and params.url.startswith(api.base + "/admin/approvals/")
        assert shutdowns(asim, args["timeout"]) == 0  # nothing ran before the human said yes
        seen.append(params)
        vote = await api.vote(params.url.rsplit("/", 1)[-1], approver(api))  # the human, on the approval page
        assert vote.status_code == 200, vote.text
        return ElicitResult(action="accept")

    async with mcp_client(
        api.env.url, api.agent(), api.env.ca_file, mode="2026-07-28", elicitation_callback=on_elicit
    ) as client:
        res = await client.call_tool("vm_shutdown", args)
    assert len(seen) == 1 and "human must approve" in seen[0].message
    assert res.meta and res.meta["pvegate/outcome"] in ("allowed", "failed"), res  # it ran
    assert shutdowns(asim, args["timeout"]) == 1


async def test_2025_11_25_url_elicitation_error_then_retry(api: Api, asim: Any) -> None:
    args = shutdown_args()

    async with legacy_client(api) as client:
        with pytest.raises(MCPError) as info:
            await client.call_tool("vm_shutdown", args)
        assert info.value.error.code == -32042
        elicitation = info.value.error.data["elicitations"][0]
        assert elicitation["mode"] == "url" and elicitation["url"].endswith(
            "/admin/approvals/" + elicitation["elicitationId"]
        )
        assert shutdowns(asim, args["timeout"]) == 0
        vote = await api.vote(elicitation["elicitationId"], approver(api))
        assert vote.status_code == 200, vote.text
        res = await client.call_tool("vm_shutdown", args)  # the identical retry redeems it, once
    assert res.meta and res.meta["pvegate/outcome"] in ("allowed", "failed"), res
    assert shutdowns(asim, args["timeout"]) == 1


async def test_2025_11_25_a_retry_refused_before_sending_keeps_its_hand_off(api: Api, asim: Any, agw: Any) -> None:
    """The 2025-11-25 client's identical retry is refused before anything is sent (OPA paused) and
    gives the approval back: the next identical retry still redeems it, not a new approval request."""
    args = shutdown_args()

    async with legacy_client(api) as client:
        with pytest.raises(MCPError) as info:
            await client.call_tool("vm_shutdown", args)
        aid = info.value.error.data["elicitations"][0]["elicitationId"]
        assert (await api.vote(aid, approver(api))).status_code == 200
        opa = agw.components.sidecar.process
        opa.send_signal(signal.SIGSTOP)
        try:
            refused = await client.call_tool("vm_shutdown", args)
        finally:
            opa.send_signal(signal.SIGCONT)
        assert refused.is_error and refused.meta and refused.meta["pvegate/outcome"] == "denied", refused
        res = await client.call_tool("vm_shutdown", args)
    assert res.meta and res.meta["pvegate/outcome"] in ("allowed", "failed"), res
    assert shutdowns(asim, args["timeout"]) == 1


async def test_clients_without_elicitation_get_the_plain_pending_result(api: Api) -> None:
    for mode in ("legacy", "2026-07-28"):
        async with mcp_client(api.env.url, api.agent(), api.env.ca_file, mode=mode) as client:
            res = await client.call_tool("vm_shutdown", shutdown_args())
        assert res.is_error and res.meta and res.meta["pvegate/outcome"] == "pending_approval"
        assert res.structured_content["approval"]["id"].startswith("apr-")


def test_request_state_is_single_use_and_bound_to_the_call(api: Api, asim: Any) -> None:
    args = shutdown_args()
    token = api.agent()
    ctx = ssl.create_default_context(cafile=str(api.env.ca_file))

    def post(params: dict[str, Any], who: str = token) -> httpx.Response:
        body = modern_body("tools/call", params, capabilities=URL_ELICITATION)
        return http.post(api.env.url, json=body, headers=modern_headers(who, "tools/call", "vm_shutdown"))

    with httpx.Client(verify=ctx, timeout=30) as http:
        first = post({"name": "vm_shutdown", "arguments": args}).json()["result"]
        assert first["resultType"] == "input_required"
        state = first["requestState"]
        url = first["inputRequests"]["pvegate_approval"]["params"]["url"]
        assert asyncio.run(api.vote(url.rsplit("/", 1)[-1], approver(api))).status_code == 200
        responses = {"pvegate_approval": {"action": "accept"}}
        other_args = {**args, "timeout": args["timeout"] + 1000}
        changed = post(
            {"name": "vm_shutdown", "arguments": other_args, "requestState": state, "inputResponses": responses}
        )
        assert changed.status_code == 400 and "different tool call" in changed.json()["error"]["message"]
        thief = post(
            {"name": "vm_shutdown", "arguments": args, "requestState": state, "inputResponses": responses},
            api.agent("mallory"),
        )
        assert thief.status_code == 400 and "another principal" in thief.json()["error"]["message"]
        ok = post(
            {"name": "vm_shutdown", "arguments": args, "requestState": state, "inputResponses": responses}
        ).json()["result"]
        assert ok["_meta"]["pvegate/outcome"] in ("allowed", "failed"), ok
        replay = post({"name": "vm_shutdown", "arguments": args, "requestState": state, "inputResponses": responses})
        assert replay.status_code == 400 and "already used" in replay.json()["error"]["message"]
    assert shutdowns(asim, args["timeout"]) == 1


def test_a_retry_before_the_vote_is_held_again_and_keeps_the_approval(api: Api, asim: Any) -> None:
    """A client's "accept" of a URL elicitation means the page was opened, not approved: real clients
    retry at once. That retry must neither burn the hand-off nor orphan the approval."""
    args = shutdown_args()
    token = api.agent()
    ctx = ssl.create_default_context(cafile=str(api.env.ca_file))
    responses = {"pvegate_approval": {"action": "accept"}}

    def post(params: dict[str, Any]) -> httpx.Response:
        body = modern_body("tools/call", params, capabilities=URL_ELICITATION)
        return http.post(api.env.url, json=body, headers=modern_headers(token, "tools/call", "vm_shutdown"))

    def retry(state: str) -> httpx.Response:
        return post({"name": "vm_shutdown", "arguments": args, "requestState": state, "inputResponses": responses})

    with httpx.Client(verify=ctx, timeout=30) as http:
        first = post({"name": "vm_shutdown", "arguments": args}).json()["result"]
        url = first["inputRequests"]["pvegate_approval"]["params"]["url"]
        early = post(
            {
                "name": "vm_shutdown",
                "arguments": args,
                "requestState": first["requestState"],
                "inputResponses": responses,
            }
        ).json()["result"]
        assert early["resultType"] == "input_required", early  # still held: the same approval, a fresh state
        assert early["inputRequests"]["pvegate_approval"]["params"]["url"] == url
        assert early["requestState"] != first["requestState"]
        assert asyncio.run(api.vote(url.rsplit("/", 1)[-1], approver(api))).status_code == 200
        old = post(
            {
                "name": "vm_shutdown",
                "arguments": args,
                "requestState": first["requestState"],
                "inputResponses": responses,
            }
        )
        assert old.status_code == 400 and "already used" in old.json()["error"]["message"]
        ok = post(
            {
                "name": "vm_shutdown",
                "arguments": args,
                "requestState": early["requestState"],
                "inputResponses": responses,
            }
        ).json()["result"]
        assert ok["_meta"]["pvegate/outcome"] in ("allowed", "failed"), ok
    assert shutdowns(asim, args["timeout"]) == 1
    held = [
        r
        for r in audit_rows(api.env.config.audit_path)
        if r["kind"] == "refusal" and r["outcome"] == "approval_pending"
    ]
    assert held, "the early retry is audited"


def test_a_retry_refused_before_sending_keeps_its_request_state(api: Api, asim: Any, agw: Any) -> None:
    """The approved retry is refused before anything is sent (OPA paused: it fails closed) and gives
    the approval back; its requestState must work again, as a token does (found by a review: it was
    spent, the client was told to call without it, and a second approval request was opened)."""
    args = shutdown_args()
    with approved_retry(api, args) as (post, retry):
        opa = agw.components.sidecar.process
        opa.send_signal(signal.SIGSTOP)
        try:
            refused = post(retry).json()["result"]
        finally:
            opa.send_signal(signal.SIGCONT)
        assert refused["isError"] and refused["_meta"]["pvegate/outcome"] == "denied", refused
        assert shutdowns(asim, args["timeout"]) == 0
        again = post(retry)
        assert again.status_code == 200, again.text
        done = again.json()["result"]
        assert done["_meta"]["pvegate/outcome"] in ("allowed", "failed"), done
        replay = post(retry)
        assert replay.status_code == 400 and "already used" in replay.json()["error"]["message"]
    assert shutdowns(asim, args["timeout"]) == 1


async def test_2025_11_25_a_retry_before_the_vote_gets_the_same_elicitation(api: Api, asim: Any) -> None:
    args = shutdown_args()

    async with legacy_client(api) as client:
        ids = []
        for _ in range(2):  # the call, then an immediate retry before anyone voted
            with pytest.raises(MCPError) as info:
                await client.call_tool("vm_shutdown", args)
            assert info.value.error.code == -32042
            ids.append(info.value.error.data["elicitations"][0]["elicitationId"])
        assert ids[0] == ids[1]  # the same approval, not a new one
        vote = await api.vote(ids[0], approver(api))
        assert vote.status_code == 200, vote.text
        res = await client.call_tool("vm_shutdown", args)
    assert res.meta and res.meta["pvegate/outcome"] in ("allowed", "failed"), res
    assert shutdowns(asim, args["timeout"]) == 1


@pytest.mark.skipif(not CLI.exists(), reason="MCP Inspector not installed: run scripts/provision-inspector.sh")
def test_inspector_approval_round_trip(api: Api, asim: Any) -> None:
    args = shutdown_args()

    def inspector(*extra: str) -> dict[str, Any]:
        cmd = ["node", str(CLI), api.env.url, "--transport", "http", "--header", f"Authorization: Bearer {api.agent()}"]
        cmd += [
            "--method",
            "tools/call",
            "--tool-name",
            "vm_shutdown",
            "--tool-arg",
            "vmid=100",
            f"timeout={args['timeout']}",
            *extra,
        ]
        env = {**os.environ, "NODE_EXTRA_CA_CERTS": str(api.env.ca_file)}
        proc = subprocess.run(cmd, cwd=CLI.parent, capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return dict(json.loads(proc.stdout))

    pending = inspector()
    assert pending["isError"] is True and pending["_meta"]["pvegate/outcome"] == "pending_approval"
    vote = asyncio.run(api.vote(pending["_meta"]["pvegate/approval_id"], approver(api)))
    assert vote.status_code == 200, vote.text
    done = inspector("--tool-metadata", f"pvegate/approval={vote.json()['token']}")
    assert done["_meta"]["pvegate/outcome"] in ("allowed", "failed"), done
    assert shutdowns(asim, args["timeout"]) == 1
