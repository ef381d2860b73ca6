"""A restore copies the guest its backup was taken of (target.backup_of). When that guest is gone
from the cluster, or the cluster could not be asked, the gateway cannot tell which pool it was
in: `pool_known` is false, so a pool-scoped deny holds there (fail closed) and a pool-scoped
grant does not cover it. Read against the simulator through the gateway's own client.

Its own simulator: the small scenario plus a PBS backup of guest 333, which no longer exists."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.dev.devenv import DevEnv, make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.pve_api import PveApiClient
from gateway.tools.targets import TargetResolver
from tests.support import free_port

SCENARIOS = Path(__file__).resolve().parents[2] / "gateway" / "sim" / "scenarios"
GONE = 333


@pytest.fixture(scope="module")
def gsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    work = tmp_path_factory.mktemp("gone-sim")
    scenario = yaml.safe_load((SCENARIOS / "small.yaml").read_text())
    assert all(int(g["vmid"]) != GONE for g in scenario["guests"])
    scenario["backups"].append({"storage": "pbs", "vmid": GONE, "age_hours": 5, "size_mb": 100})
    path = work / "gone.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    handle = start_simulator(str(path), work / "sim", ssh=False)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def genv(gsim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(tmp_path_factory.mktemp("gone-gw"), {"default": gsim}, port=free_port())


def backed_up(
    env: DevEnv, archive: str, cluster: str = "default", api_url: str | None = None, alone: bool = False
) -> dict[str, Any]:
    """target.backup_of as the gateway resolves it for a vm_restore of `archive` on `cluster`
    (the simulator's API, or `api_url`); `alone`: that lookup only, not the whole target."""
    tool = Catalog.load(REPO_ROOT / "connectors").get("vm_restore")
    assert tool is not None and tool.target.get("backup_of") == "archive"

    async def run(resolver: TargetResolver) -> dict[str, Any]:
        if alone:
            return await resolver._backed_up(archive, cluster)
        args = tool.validate({"node": "pve1", "vmid": 190, "archive": archive, "pool": "lab"})
        return dict((await resolver.resolve(tool, args, cluster))["backup_of"])

    return resolving(env, api_url, run)


def resolving(
    env: DevEnv, api_url: str | None, run: Callable[[TargetResolver], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """`run` with the gateway's own target resolver on the simulator's cluster (or at `api_url`)."""

    async def go() -> dict[str, Any]:
        config = env.config.clusters["default"]
        if api_url is not None:
            config = dataclasses.replace(config, api_url=api_url, timeout=2.0)
        client = PveApiClient(config)
        try:
            return await run(TargetResolver({"default": client}, ttl=3600))
        finally:
            await client.close()

    return asyncio.run(go())


def archive_of(sim: Any, vmid: int) -> str:
    return next(v for v in sim.state()["volumes"] if v.startswith("pbs:backup/") and f"/{vmid}/" in v)


def test_a_backups_guest_that_is_gone_has_no_known_pool(genv: DevEnv, gsim: Any) -> None:
    gone = backed_up(genv, archive_of(gsim, GONE))
    assert (gone["vmid"], gone["node"], gone["pool"], gone["tags"]) == (GONE, None, None, []), gone
    assert gone["pool_known"] is False, gone  # not "in no pool": it may have been in a fenced one


def test_a_backups_guest_on_a_cluster_that_cannot_be_asked_has_no_known_pool(genv: DevEnv, gsim: Any) -> None:
    unknown = backed_up(genv, archive_of(gsim, 101), cluster="elsewhere")
    assert (unknown["vmid"], unknown["pool"], unknown["pool_known"]) == (101, None, False), unknown


def test_a_backups_guest_that_cannot_be_read_has_no_known_pool(genv: DevEnv, gsim: Any) -> None:
    # (a resolve whose first read fails is refused as a whole: only the guest's own read fails here)
    closed = f"https://127.0.0.1:{free_port()}/api2/json"  # nothing listens: the index read fails
    unread = backed_up(genv, archive_of(gsim, 101), api_url=closed, alone=True)
    assert (unread["vmid"], unread["node"], unread["pool"], unread["pool_known"]) == (101, None, None, False), unread


def test_a_backups_guest_that_is_listed_keeps_its_pool(genv: DevEnv, gsim: Any) -> None:
    listed = backed_up(genv, archive_of(gsim, 101))
    row = gsim.state()["guests"]["101"]
    assert (listed["node"], listed["pool"], listed["pool_known"]) == (row["node"], row.get("pool"), True), listed


def owned_by(env: DevEnv, volume: str, api_url: str | None = None, cluster: str = "default") -> dict[str, Any]:
    """target.volume_of as the gateway resolves it for `volume` (the simulator's API, or `api_url`)."""

    return resolving(env, api_url, lambda resolver: resolver._volume_owner(volume, cluster))


def test_a_volume_whose_owner_cannot_be_looked_up_has_no_known_pool(genv: DevEnv, gsim: Any) -> None:
    """Found in review: the owner lookup failing left pool_known true ("in no pool"), so a pool-scoped
    deny did not hold on deleting a fenced pool's disk while the cluster could not be read."""
    closed = f"https://127.0.0.1:{free_port()}/api2/json"
    unread = owned_by(genv, "local-lvm:vm-101-disk-0", api_url=closed)
    assert (unread["vmid"], unread["exists"], unread["pool"], unread["pool_known"]) == (101, None, None, False), unread
    elsewhere = owned_by(genv, "local-lvm:vm-101-disk-0", cluster="elsewhere")
    assert (elsewhere["exists"], elsewhere["pool_known"]) == (None, False), elsewhere
    ambiguous = owned_by(genv, "local:101/vm-102-disk-0.qcow2")  # two ids that disagree: nobody can tell whose
    assert (ambiguous["vmid"], ambiguous["pool_known"]) == (None, False), ambiguous


def test_a_volume_nobody_owns_or_an_orphan_is_in_no_pool(genv: DevEnv, gsim: Any) -> None:
    iso = owned_by(genv, "local:iso/debian.iso")
    assert (iso["content"], iso["pool_known"]) == (None, True), iso
    orphan = owned_by(genv, f"local-lvm:vm-{GONE}-disk-0")
    assert (orphan["exists"], orphan["pool"], orphan["pool_known"]) == (False, None, True), orphan
    listed = owned_by(genv, "local-lvm:vm-101-disk-0")
    row = gsim.state()["guests"]["101"]
    assert (listed["exists"], listed["pool"], listed["pool_known"]) == (True, row.get("pool"), True), listed
