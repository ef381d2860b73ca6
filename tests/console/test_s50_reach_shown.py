"""An approver was not shown the guests a held call reaches beyond its target.

The policy decides a pool move, a node reboot, a backup prune (and an HA rule, a backup job, a restore
from another guest's backup, a volume deletion) on the guests it reaches (target.members,
prune_removes, backup_of, volume_of), and the approval token is bound to them; but the console's
approval page listed only the target's own cluster/node/vmid/pool/tags, and `pvegate approvals show`
only "pool_members_add on default", with neither the risk factors nor the dry-run sentence. Moving
guest 101 (pool prod, tagged protected) into lab read as a harmless cluster call: the approver could
not know what they approve. Both now list each reached guest with its node, pool and tags (and the
destination); `show` also prints the risk factors and what Proxmox is asked to do. Real simulator,
real OPA, the gateway over HTTPS, the real CLI.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from tests.approvals.conftest import Api, outcome, text
from tests.approvals.test_cli import pvegate
from tests.console.conftest import CAROL, Browsers, console_env, console_policy
from tests.support import GatewayThread

HELD = ["pool_members_add", "node_reboot", "backup_prune"]


def held(data: dict[str, Any]) -> None:
    """The calls here wait for an SRE lead; the maintenance window is always open (a prune is destroy)."""
    data["approval"]["rules"].append(
        {"name": "s50-reach", "tools": HELD, "reason": "an SRE lead approves", "approver_groups": ["sre-leads"]}
    )
    days = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    data["guardrails"]["maintenance_windows"] = [{"name": "always", "from_hour": 0, "to_hour": 24, "weekdays": days}]


@pytest.fixture(scope="module")
def renv(csim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return console_env(tmp_path_factory, csim, "reach", console_policy(tmp_path_factory.mktemp("rpol"), edit=held))


@pytest.fixture(scope="module")
def rapi(renv: DevEnv) -> Iterator[Api]:
    gw = GatewayThread(renv.config).start()
    try:
        yield Api(renv)
    finally:
        gw.stop()


async def held_call(api: Api, tool: str, args: dict[str, Any]) -> str:
    res = await api.call(api.human("s50-admin", groups=["pve-admins"]), tool, args)
    assert outcome(res) == "pending_approval", text(res)
    return str(res["structuredContent"]["approval"]["id"])


def page_text(body: str) -> str:
    return html.unescape(body)


async def test_a_pool_move_shows_the_guest_it_moves(rapi: Api, renv: DevEnv, browsers: Browsers) -> None:
    aid = await held_call(rapi, "pool_members_add", {"poolid": "lab", "vmids": "101", "allow_move": True})
    moved = "guest 101 (node pve1; pool prod; tags prod, protected)"
    carol = browsers(renv, CAROL)
    page = carol.get(f"/admin/approvals/{aid}")
    assert page.status_code == 200, page.text
    shown = page_text(page.text)
    assert f"<th>reaches</th><td>{moved}</td>" in shown, shown
    assert "<th>destination</th><td>pool lab</td>" in shown, shown
    queue = carol.get("/admin/approvals")
    assert queue.status_code == 200 and "+ 2 more" in queue.text, queue.text

    out = pvegate("approvals", "show", aid, "--config", str(renv.config_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert f"  reaches:    {moved}" in lines, out.stdout
    assert "  destination: pool lab" in lines, out.stdout
    assert any(x.startswith("  would:      Add guests 101 ") and "resource pool lab" in x for x in lines), out.stdout
    assert any(x.strip().startswith("target_tag:prod (+") and "guest 101" in x for x in lines), out.stdout


async def test_a_node_reboot_and_a_prune_show_the_guests_they_reach(
    rapi: Api, renv: DevEnv, browsers: Browsers
) -> None:
    carol = browsers(renv, CAROL)
    reboot = await held_call(rapi, "node_reboot", {"node": "pve1"})
    shown = page_text(carol.get(f"/admin/approvals/{reboot}").text)
    for vmid in (100, 101, 200, 9000):
        assert f"<th>reaches</th><td>guest {vmid} (node pve1;" in shown, shown
    prune = await held_call(rapi, "backup_prune", {"node": "pve2", "storage": "local", "keep": "keep-last=1"})
    shown = page_text(carol.get(f"/admin/approvals/{prune}").text)
    assert "<th>deletes backups of</th><td>guest 103 (node pve2; pool lab; tags dev)</td>" in shown, shown
    out = pvegate("approvals", "show", prune, "--config", str(renv.config_path))
    assert out.returncode == 0, out.stderr
    assert "  deletes backups of: guest 103 (node pve2; pool lab; tags dev)" in out.stdout.splitlines(), out.stdout


async def test_the_plain_approval_page_shows_them_too(rapi: Api, renv: DevEnv) -> None:
    """Without the console, /admin/approvals/{id} is the admin API's own page (api._page): it listed the
    call's cluster alone, and now the guests it reaches, as the console does."""
    from gateway.admin.api import _page
    from gateway.store.approvals import Approvals, ApprovalStore

    aid = await held_call(rapi, "pool_members_add", {"poolid": "lab", "vmids": "101", "allow_move": True})
    store = ApprovalStore(renv.config.audit_path)
    await store.open()
    try:
        req = await store.get(aid)
    finally:
        await store.close()
    shown = page_text(bytes(_page(req, Approvals(store)).body).decode())
    assert "<tr><th>reaches</th><td>guest 101 (node pve1; pool prod; tags prod, protected)</td></tr>" in shown, shown
    assert "<tr><th>destination</th><td>pool lab</td></tr>" in shown, shown
