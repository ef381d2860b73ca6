"""Where a call runs is the node its scope must cover. A tool that names both a guest and a node
without locating the guest (a guest's backups on some node's storage: backup_prune,
backup_prune_preview, storage_disk_allocate) sends its request to the node it names: the
policy's target.node is that node, not the node the guest runs on. Before, a binding scoped to
pve1 could prune the backups a pve1 guest had on pve2's local storage."""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.dev.devenv import DevEnv
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.pve_api import PveApiClient
from gateway.tools.targets import TargetResolver


async def test_a_call_on_a_named_node_is_decided_on_that_node(env: DevEnv, sim: Any) -> None:
    catalog = Catalog.load(REPO_ROOT / "connectors")
    client = PveApiClient(env.config.clusters["default"])
    try:
        rows = await client.request("GET", "/cluster/resources")
        nodes = sorted(r["node"] for r in rows if r.get("type") == "node")
        guest = next(r for r in rows if r.get("type") in ("qemu", "lxc"))
        other = next(n for n in nodes if n != guest["node"])
        resolver = TargetResolver({"default": client})
        for name in ("backup_prune", "backup_prune_preview", "storage_disk_allocate"):
            tool = catalog.get(name)
            assert tool is not None
            args = {"node": other, "storage": "local", "vmid": guest["vmid"]}
            target = await resolver.resolve(tool, args, "default")
            assert target["node"] == other and target["vmid"] == guest["vmid"] and target["known"], (name, target)
        # the node's placeholder is the node parameter's, whatever its name (it was matched as "{node}" only)
        prune = catalog.get("backup_prune")
        assert prune is not None
        renamed = dataclasses.replace(
            prune,
            target={**prune.target, "node": "where"},
            spec={**prune.spec, "path": str(prune.spec["path"]).replace("{node}", "{where}")},
        )
        target = await resolver.resolve(renamed, {"where": other, "storage": "local", "vmid": guest["vmid"]}, "default")
        assert target["node"] == other, target
        # a tool that locates its guest keeps the guest's node (a differing node argument is refused there)
        located = catalog.get("get_guest_status")
        assert located is not None and located.spec.get("locate")
        target = await resolver.resolve(located, {"vmid": guest["vmid"]}, "default")
        assert target["node"] == guest["node"]
    finally:
        await client.close()
