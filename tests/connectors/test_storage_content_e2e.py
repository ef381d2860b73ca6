"""Storage and content end to end (issue #19): SDK client -> HTTPS -> JWT -> real OPA ->
pve_api runtime -> simulator, with the example organisation's policy.

A simulator and gateway of this module's own (downloads, allocations and deletions change
what the session's shared storage tests count). Each mutation runs as a human admin and
must send exactly the request its YAML declares; volume deletion is destroy-class (held or
denied by default, proved unsent, then run through the gateway's runtime object), and a
download from a host the policy does not allow-list is denied before Proxmox hears of it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv, make_env
from gateway.tools.runtimes.base import CallContext
from tests.connectors.test_provision_e2e import admin, call, read, run, sent, text
from tests.support import GatewayThread, free_port

STORAGE_TOOLS = {
    "storage_volume_info",
    "storage_volume_set",
    "storage_volume_delete",
    "storage_download_url",
    "storage_url_metadata",
    "storage_transfer_status",
    "storage_status",
    "storage_rrd",
    "storage_disk_allocate",
    "storage_config_list",
    "storage_config_get",
}
API = "/api2/json/nodes"
ISO_URL = "https://cdimage.debian.org/debian-cd/current/amd64/iso-cd/debian-12.8.0-amd64-netinst.iso"
ISO = "debian-12.8.0-amd64-netinst.iso"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("sim-storage"))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def env(sim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(Path(tmp_path_factory.mktemp("gw-storage")), {"default": sim}, port=free_port())


@pytest.fixture(scope="module")
def gateway(env: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(env.config).start()
    yield gw
    gw.stop()


def _on_gateway_loop(gw: GatewayThread, coro: Any) -> Any:
    assert gw.loop is not None
    return asyncio.run_coroutine_threadsafe(coro, gw.loop).result(timeout=60)


async def content(env: DevEnv, node: str, storage: str, **kw: Any) -> dict[str, dict[str, Any]]:
    rows = (await read(env, "list_storage_content", {"node": node, "storage": storage, **kw}))["items"]
    return {r["volid"]: r for r in rows}


async def test_download_from_an_allowed_host(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    meta = await read(env, "storage_url_metadata", {"node": "pve1", "url": ISO_URL})
    assert meta == {"filename": ISO, "size": 659554304, "mimetype": "application/x-iso9660-image"}
    checksum = hashlib.sha256(f"sim:{ISO_URL}".encode()).hexdigest()  # the simulator's file is "sim:<url>"
    args = {
        "node": "pve1",
        "storage": "local",
        "url": ISO_URL,
        "content": "iso",
        "filename": ISO,
        "checksum": checksum,
        "checksum_algorithm": "sha256",
    }
    body = {"url": ISO_URL, "content": "iso", "filename": ISO, "checksum": checksum, "checksum-algorithm": "sha256"}
    verdict = await run(
        gateway, env, sim, "storage_download_url", args, ("POST", f"{API}/pve1/storage/local/download-url", body)
    )
    assert verdict == "allowed"
    volid = f"local:iso/{ISO}"
    assert (await content(env, "pve1", "local", content="iso"))[volid]["size"] == 659554304
    assert volid not in await content(env, "pve2", "local", content="iso")  # local storage: that node only
    info = await read(env, "storage_volume_info", {"node": "pve1", "storage": "local", "volume": volid})
    assert info["format"] == "iso" and info["size"] == 659554304 and "path" not in info
    tasks = (await read(env, "storage_transfer_status", {"node": "pve1", "typefilter": "download"}))["items"]
    assert [(t["type"], t["id"], t["status"]) for t in tasks] == [("download", ISO, "OK")]

    # the same file again: PVE refuses to overwrite; a wrong checksum fails the task
    again = await call(env, admin(env), "storage_download_url", args)
    assert again.is_error and "refusing to override existing file" in text(again)
    bad = await call(env, admin(env), "storage_download_url", {**args, "node": "pve2", "checksum": "0" * 64})
    assert bad.is_error and "checksum mismatch" in text(bad)
    failed = (await read(env, "storage_transfer_status", {"node": "pve2", "typefilter": "download"}))["items"]
    assert failed[0]["status"].startswith("checksum mismatch")


async def test_downloads_only_from_allow_listed_hosts(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    sim.clear_logs()
    elsewhere = "https://mirror.example.net/isos/tools.iso"  # the simulator could serve it; the policy says no
    res = await call(
        env,
        admin(env),
        "storage_download_url",
        {"node": "pve1", "storage": "local", "url": elsewhere, "content": "iso", "filename": "tools.iso"},
    )
    assert res.is_error and "guardrail.download_host" in res.structured_content["codes"], text(res)
    assert 'host "mirror.example.net" is not one of them' in text(res)
    res = await call(env, admin(env), "storage_url_metadata", {"node": "pve1", "url": elsewhere})
    assert res.is_error and "allow-listed hosts" in text(res)
    # credentials in a URL, or a look-alike host, never get that far
    for url in (
        "https://download.proxmox.com@mirror.example.net/x.iso",
        "https://cdimage.debian.org.evil.example/x.iso",
    ):
        res = await call(env, admin(env), "storage_url_metadata", {"node": "pve1", "url": url})
        assert res.is_error, url
    assert sent(sim) == [] and not [e for e in sim.requests_log() if "url" in e["query"]]


async def test_notes_protection_allocation_and_deletion(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    iso = f"local:iso/{ISO}"
    if iso not in await content(env, "pve1", "local", content="iso"):
        made = await call(
            env,
            admin(env),
            "storage_download_url",
            {"node": "pve1", "storage": "local", "url": ISO_URL, "content": "iso", "filename": ISO},
        )
        assert not made.is_error, text(made)
    await run(
        gateway,
        env,
        sim,
        "storage_volume_set",
        {"node": "pve1", "storage": "local", "volume": iso, "notes": "bookworm 12.8"},
        ("PUT", f"{API}/pve1/storage/local/content/{iso}", {"notes": "bookworm 12.8"}),
    )
    assert (await read(env, "storage_volume_info", {"node": "pve1", "storage": "local", "volume": iso}))[
        "notes"
    ] == "bookworm 12.8"
    res = await call(
        env, admin(env), "storage_volume_set", {"node": "pve1", "storage": "local", "volume": iso, "protected": True}
    )
    assert res.is_error and "only supported for backups" in text(res)

    backup = next(v for v, r in (await content(env, "pve2", "local", content="backup")).items() if r["vmid"] == 201)
    await run(
        gateway,
        env,
        sim,
        "storage_volume_set",
        {"node": "pve2", "storage": "local", "volume": backup, "protected": True},
        ("PUT", f"{API}/pve2/storage/local/content/{backup}", {"protected": "1"}),
    )
    assert (await content(env, "pve2", "local", content="backup"))[backup]["protected"] == 1

    await run(
        gateway,
        env,
        sim,
        "storage_disk_allocate",
        {"node": "pve2", "storage": "local-lvm", "vmid": 102, "filename": "vm-102-disk-5", "size_gib": 2},
        ("POST", f"{API}/pve2/storage/local-lvm/content", {"vmid": "102", "filename": "vm-102-disk-5", "size": "2G"}),
    )
    disk = "local-lvm:vm-102-disk-5"
    assert (await content(env, "pve2", "local-lvm", vmid=102))[disk]["size"] == 2 << 30
    res = await call(
        env,
        admin(env),
        "storage_disk_allocate",
        {"node": "pve2", "storage": "local-lvm", "vmid": 102, "filename": "vm-103-disk-5", "size_gib": 1},
    )
    assert res.is_error and "must start with 'vm-102-'" in text(res)

    # destroy-class: held or denied by the default policy, then sent by the runtime
    for node, storage, volid in (("pve2", "local-lvm", disk), ("pve1", "local", iso)):
        verdict = await run(
            gateway,
            env,
            sim,
            "storage_volume_delete",
            {"node": node, "storage": storage, "volume": volid},
            ("DELETE", f"{API}/{node}/storage/{storage}/content/{volid}", None),
        )
        assert verdict in ("held", "denied")
        assert volid not in await content(env, node, storage)
    # PVE's own refusal: a protected backup
    tool = gateway.components.catalog.get("storage_volume_delete")
    assert tool is not None

    def direct(node: str, storage: str, volid: str) -> Any:  # past the policy, as Proxmox answers it
        args = tool.validate({"node": node, "storage": storage, "volume": volid})
        return _on_gateway_loop(gateway, gateway.components.runtime(tool).call(tool, args, CallContext("default")))

    with pytest.raises(Exception, match="is protected"):
        direct("pve2", "local", backup)
    # a disk its guest still uses: PVE deletes it (vdisk_free has no such check) and the guest's
    # config keeps naming it, so the gateway's policy refuses it (guardrail.guest_disk)
    used = "local-lvm:vm-102-disk-0"
    sim.clear_logs()
    res = await call(env, admin(env), "storage_volume_delete", {"node": "pve2", "storage": "local-lvm", "volume": used})
    assert res.is_error and "guardrail.guest_disk" in res.structured_content["codes"], text(res)
    assert sent(sim) == []
    direct("pve2", "local-lvm", used)
    assert used not in await content(env, "pve2", "local-lvm")
    assert str((await read(env, "get_guest_config", {"vmid": 102}))["config"]["scsi0"]).startswith(f"{used},")


STATUS_READS: list[tuple[str, dict[str, Any], Any]] = [
    (
        "storage_status",
        {"node": "pve1", "storage": "local-lvm"},
        lambda s: s["type"] == "lvmthin" and s["total"] == 350 << 30 and s["active"] == 1,
    ),
    (
        "storage_rrd",
        {"node": "pve1", "storage": "local-lvm", "timeframe": "day"},
        lambda s: len(s["items"]) == 70 and all(r["total"] == 350 << 30 for r in s["items"]),
    ),
    (
        "storage_rrd",
        {"node": "pve1", "storage": "nas-iso", "timeframe": "hour"},  # not mounted: no samples
        lambda s: all(set(r) == {"time"} for r in s["items"]),
    ),
    (
        "storage_config_list",
        {"type": "pbs"},
        lambda s: [r["storage"] for r in s["items"]] == ["pbs"] and s["items"][0]["datastore"] == "store1",
    ),
    ("storage_config_get", {"storage": "local"}, lambda s: s["path"] == "/var/lib/vz" and "iso" in s["content"]),
]


@pytest.mark.parametrize(
    ("name", "args", "check"), STATUS_READS, ids=[f"{r[0]}-{i}" for i, r in enumerate(STATUS_READS)]
)
async def test_storage_reads(gateway: GatewayThread, env: DevEnv, name: str, args: dict[str, Any], check: Any) -> None:
    s = await read(env, name, args)
    assert check(s), s
    assert "password" not in str(s)
