"""A call the connector runtime refuses before anything is sent (a container tool aimed at a VM, an SSH
command off its allow-list) gives its quota slot back, as every other refusal before sending does.

It kept it: three such refusals spent three of the principal's calls of the tool in every window, so
a quota could be used up by calls Proxmox never heard of. Real gateway, real OPA, the simulator."""

from __future__ import annotations

import asyncio

import httpx

from gateway.dev.devenv import DevEnv
from tests.mcp.test_bounded_refusals import http, post, tool_call
from tests.support import GatewayThread

__all__ = ["http"]  # the fixture, used by name


def test_a_runtime_refusal_gives_its_quota_slot_back(gateway: GatewayThread, env: DevEnv, http: httpx.Client) -> None:
    who = "runtime-refused-agent"
    for _ in range(3):
        r = post(env, http, who, ["operator"], tool_call("lxc_docker_ps", {"vmid": 100}))  # 100 is a VM
        assert r.status_code == 200, r.text[:300]
        result = r.json()["result"]
        assert result["_meta"]["pvegate/outcome"] == "invalid" and "is a VM" in result["content"][0]["text"], result
    assert gateway.loop is not None

    async def counts() -> dict[str, dict[str, int]]:
        return gateway.components.usage.counts(who, "lxc_docker_ps")  # type: ignore[attr-defined,no-any-return]

    got = asyncio.run_coroutine_threadsafe(counts(), gateway.loop).result(timeout=30)
    assert got == {"tool": {"1m": 0, "1h": 0, "24h": 0}, "all": {"1m": 0, "1h": 0, "24h": 0}}, got
