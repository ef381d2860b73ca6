"""list_backups and guest_health_summary when part of what they read fails, end to end: SDK
client -> HTTPS -> JWT -> real OPA -> composite runtime -> simulator, on a simulator of this
module's own (its faults stay here).

The small scenario has pve3 offline and the shared backup storage nas-iso inactive, so the
backup listing is incomplete even without a fault: a guest with no backup found is unknown,
never "has none". A storage listing that fails makes every guest's count unknown. A guest whose
status cannot be read and that shows no concern is neither healthy nor unhealthy: null."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv, make_env
from tests.support import GatewayThread, free_port


@pytest.fixture(scope="module")
def usim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("usim"))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def uenv(usim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(tmp_path_factory.mktemp("ugw"), {"default": usim}, port=free_port())


@pytest.fixture(scope="module")
def ugw(uenv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(uenv.config).start()
    yield gw
    gw.stop()


async def read(env: DevEnv, name: str, args: dict[str, Any]) -> dict[str, Any]:
    async with mcp_client(env.url, env.token("unknowns-auditor", ["auditor"]), env.ca_file) as client:
        res = await client.call_tool(name, args)
    assert not res.is_error, res.content
    return dict(res.structured_content or {})


def per_guest(out: dict[str, Any]) -> dict[int, tuple[Any, Any]]:
    return {p["vmid"]: (p["count"], p["newest_age_hours"]) for p in out["per_guest"]}


async def test_list_backups_unread_storage_is_unknown(ugw: GatewayThread, uenv: DevEnv, usim: Any) -> None:
    out = await read(uenv, "list_backups", {})
    assert out["complete"] is False
    assert "node pve3 is offline" in out["reason"] and "nas-iso" in out["reason"], out["reason"]
    seen = per_guest(out)
    assert seen[100][0] == 1 and seen[100][1] == pytest.approx(20, abs=1)  # found: stands
    assert seen[300] == (None, None) and seen[102] == (None, None)  # none found: unknown, not 0
    try:
        usim.set_faults(error_rate=1.0, error_status=500, error_path="/storage/[^/]+/content")
        out = await read(uenv, "list_backups", {})
    finally:
        usim.set_faults(error_rate=0.0)
    assert out["complete"] is False and "simulated internal error" in out["reason"]
    assert set(per_guest(out).values()) == {(None, None)}


async def test_health_unknown_when_status_unread(ugw: GatewayThread, uenv: DevEnv, usim: Any) -> None:
    guests = [g["vmid"] for g in (await read(uenv, "list_guests", {}))["items"]]
    healthy = [v for v in guests if (await read(uenv, "guest_health_summary", {"vmid": v}))["healthy"] is True]
    assert healthy, "the scenario has a healthy guest"
    vmid = healthy[0]
    try:
        usim.set_faults(error_rate=1.0, error_status=500, error_path=f"/{vmid}/status/current")
        out = await read(uenv, "guest_health_summary", {"vmid": vmid})
    finally:
        usim.set_faults(error_rate=0.0)
    assert out["healthy"] is None and out["concerns"] == [], out
    assert out["not_checked"] and out["not_checked"][0].startswith("status: "), out
