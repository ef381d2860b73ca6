"""check_ip_availability's verdict rule on hand-made check results (the e2e scenario always
has an offline node, so "free" can only be shown here)."""

from __future__ import annotations

import copy
from typing import Any

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import ToolError
from gateway.tools.runtimes.reducers import TRANSFORMS, check_ip_availability, guests, storage, tag_list

GUESTS = [{"vmid": 100, "type": "qemu", "status": "running", "name": "web"}]
NODES = [{"node": "pve1", "status": "online"}, {"node": "pve2", "status": "online"}]


def fake(answers: dict[str, Any]) -> Any:
    async def sub(name: str, args: dict[str, Any]) -> Any:
        value = answers[name]
        if isinstance(value, Exception):
            raise value
        return value(args) if callable(value) else value

    return sub


def base(**over: Any) -> dict[str, Any]:
    answers: dict[str, Any] = {
        "list_guests": GUESTS,
        "get_guest_stored_config": {"config": {"ipconfig0": "ip=10.0.0.5/24,gw=10.0.0.1"}},
        "vm_agent_network": ToolError("QEMU guest agent is not running"),
        "list_nodes": NODES,
        "node_arp_table": [{"dst": "10.0.0.9", "state": ["FAILED"]}],
        "node_ping": {"ok": False, "exit_status": 1},
    }
    answers.update(over)
    return answers


async def test_free_only_when_every_check_ran_and_agreed() -> None:
    w: list[str] = []
    out = await check_ip_availability(fake(base()), {"ip": "10.0.0.9"}, w)
    assert out["status"] == "free" and out["evidence"] == [] and w == []


async def test_a_failed_check_makes_it_unknown_never_free() -> None:
    w: list[str] = []
    out = await check_ip_availability(fake(base(node_ping=ToolError("ssh down"))), {"ip": "10.0.0.9"}, w)
    assert out["status"] == "unknown" and w
    out = await check_ip_availability(fake(base(list_nodes=[*NODES, {"node": "pve3", "status": "offline"}])),
                                      {"ip": "10.0.0.9"}, [])  # fmt: skip
    assert out["status"] == "unknown"


async def test_any_sighting_is_in_use_even_when_partial() -> None:
    out = await check_ip_availability(fake(base(node_ping=ToolError("ssh down"))), {"ip": "10.0.0.5"}, [])
    assert out["status"] == "in_use" and "configured on guest 100 (web)" in out["evidence"]
    arp = [{"dst": "10.0.0.9", "lladdr": "aa:bb", "state": ["STALE"]}]
    out = await check_ip_availability(fake(base(node_arp_table=arp)), {"ip": "10.0.0.9"}, [])
    assert out["status"] == "in_use"


def test_storage_available_is_never_computed() -> None:
    rows = storage(
        [
            {"storage": "a", "node": "n", "active": 1, "total": 100, "used": 40, "avail": 50, "content": "images"},
            {"storage": "b", "node": "n", "active": 1, "total": 100, "used": 40, "content": "iso"},
            {"storage": "c", "node": "n", "active": 0, "content": "backup"},
        ],
        {},
    )["items"]
    assert [r["available"] for r in rows] == [50, None, None]  # never 100 - 40
    assert rows[2]["total"] is None and rows[2]["content"] == ["backup"]


def test_a_listing_shows_the_tags_the_policy_matches() -> None:
    """A hand-written `tags: prod  Protected` is two tags to Proxmox, compared without case: the listing
    shows them as the policy sees them (targets.tag_list), so an agent reads what a guard rail matches."""
    rows = [
        {"type": "qemu", "vmid": 101, "node": "pve1", "tags": "prod  Protected"},
        {"type": "lxc", "vmid": 102, "node": "pve1", "tags": "web;db,Web"},
        {"type": "qemu", "vmid": 103, "node": "pve1"},
    ]
    listed = {g["vmid"]: g["tags"] for g in guests(rows, {})}
    assert listed == {101: ["prod", "protected"], 102: ["web", "db"], 103: []}
    assert tag_list(["Prod", "web"]) == ["prod", "web"]  # an answer that is already a list


def test_apt_repository_uris_lose_their_credentials() -> None:
    """A source line `deb https://user:S3cret@repo.vendor.example/debian ...` came back with its
    password (found in review): node_apt_repositories declares the reducer that strips every
    URI's user name and password, wherever the answer quotes one."""
    tool = Catalog.load(REPO_ROOT / "connectors").tools["node_apt_repositories"]
    reduce = TRANSFORMS[str(tool.output.get("reducer"))]
    vendor = {"Types": ["deb"], "URIs": ["https://user:S3cret@repo.vendor.example/debian", "http://deb.debian.org/d"],
              "Suites": ["trixie"], "Components": ["main"], "Enabled": True, "FileType": "list",
              "Options": [{"Key": "signed-by", "Values": ["/usr/share/keyrings/vendor.gpg"]}],
              "Comment": " mirror: ftp://mirror:p/a#ss@ftp.vendor.example/debian"}  # fmt: skip
    answer = {
        "files": [{"path": "/etc/apt/sources.list.d/vendor.list", "repositories": [vendor], "digest": [1, 2]}],
        "errors": [{"path": "/etc/apt/sources.list.d/x.list", "error": "malformed entry 'deb http://u:pw@h/ x'"}],
        "infos": [],
        "digest": "abc",
    }
    before = copy.deepcopy(answer)
    out = reduce(answer, {})
    assert answer == before  # a new copy
    repo = out["files"][0]["repositories"][0]
    assert repo["URIs"] == ["https://***@repo.vendor.example/debian", "http://deb.debian.org/d"]
    assert repo["Comment"] == " mirror: ftp://***@ftp.vendor.example/debian"  # a '/' or '#' in a password too
    assert out["errors"][0]["error"] == "malformed entry 'deb http://***@h/ x'"
    assert {k: v for k, v in repo.items() if k not in ("URIs", "Comment")} == {
        k: v for k, v in vendor.items() if k not in ("URIs", "Comment")
    }
    assert out["files"][0]["digest"] == [1, 2] and out["digest"] == "abc"
    assert "S3cret" not in str(out) and "pw@" not in str(out) and "p/a#ss" not in str(out)
