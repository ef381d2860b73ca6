"""Guest create and config tools end to end: SDK client -> HTTPS -> JWT -> real OPA ->
pve_api runtime -> simulator, with the example organisation's policy.

Each mutation runs as a human admin (pve-admins) and must send exactly the request its
YAML declares (the simulator's request log), and the simulator's state must show the
effect. Where the default policy holds or denies the call (destroy-class detach and
delete, the irreversible template conversion outside business hours), the test proves
nothing was sent and then runs the same connector through the gateway's runtime object.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import quote

from gateway.core.canonical import digest_json
from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv
from gateway.tools.runtimes.base import CallContext
from gateway.tools.tool import arguments_digest
from tests.approvals.conftest import Api
from tests.support import GatewayThread, audit_bytes, audit_rows, kept_input, per_module

CI_PASSWORD = "Sup3r-Secret-CI-Pw-7d1c"
CI_PASSWORD_2 = "Another-Secret-CI-Pw-e4a0"
CT_PASSWORD = "Ct-Root-Secret-Pw-93bb"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGsimKeyOnlyForTests0123456789abcdefghij ops@lab"
ISO = "debian-12.7.0-amd64-netinst.iso"
TEMPLATE = "debian-12-standard_12.7-1_amd64.tar.zst"

PROVISION_TOOLS = {
    "vm_create", "lxc_create", "guest_convert_to_template", "guest_disk_resize", "vm_disk_move",
    "lxc_volume_move", "vm_disk_attach", "lxc_mountpoint_add", "guest_disk_detach", "guest_unused_disk_delete",
    "vm_nic_set", "lxc_nic_set", "guest_nic_remove", "vm_cdrom_insert", "vm_cdrom_eject", "vm_boot_order_set",
    "guest_tags_set", "guest_description_set", "vm_cloudinit_set", "vm_cloudinit_regenerate", "guest_pending_revert",
}  # fmt: skip


def admin(env: DevEnv) -> str:
    return env.token(per_module("prov-admin"), [], groups=["pve-admins"], kind="human")


def text(res: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in res.content)


async def call(env: DevEnv, token: str, name: str, args: dict[str, Any]) -> Any:
    async with mcp_client(env.url, token, env.ca_file) as client:
        return await client.call_tool(name, args)


async def answered(env: DevEnv, name: str, args: dict[str, Any]) -> Any:
    """The answer of a call that reaches Proxmox whatever the clock says: the example policy
    holds more calls outside business hours (off_hours points), so when it holds this one,
    SRE leads approve it and the admin retries with the one-time token."""
    res = await call(env, admin(env), name, args)
    if (res.meta or {}).get("pvegate/outcome") != "pending_approval":
        return res
    api = Api(env)
    approval_id = res.structured_content["approval"]["id"]
    for voter in ("alice", "bob"):
        vote = await api.vote(approval_id, api.human(per_module(voter), ["sre-leads"]))
        assert vote.status_code == 200, vote.text
        if vote.json()["state"] == "approved":
            break
    assert vote.json()["state"] == "approved", vote.text
    async with mcp_client(env.url, admin(env), env.ca_file) as client:
        return await client.call_tool(name, args, meta={"pvegate/approval": vote.json()["token"]})


def sent(sim: Any) -> list[tuple[str, str, dict[str, str] | None]]:
    """The mutating requests the simulator received (task polls and lookups are GETs)."""
    return [(e["method"], e["path"], e["body"]) for e in sim.requests_log() if e["method"] != "GET"]


async def run(
    gw: GatewayThread, env: DevEnv, sim: Any, name: str, args: dict[str, Any], want: tuple[str, str, dict[str, str]]
) -> str:
    """Call through the gateway; if the policy holds or denies it, nothing may have been sent,
    and the connector then runs through the gateway's own runtime. Returns the verdict."""
    sim.clear_logs()
    res = await call(env, admin(env), name, args)
    verdict = "allowed"
    if res.is_error:
        assert "approval" in text(res) or "Denied" in text(res), f"{name}: {text(res)}"
        assert sent(sim) == [], f"{name} was held or denied but sent {sent(sim)}"
        verdict = "held" if "approval" in text(res) else "denied"
        c = gw.components
        tool = c.catalog.get(name)
        assert tool is not None and gw.loop is not None
        fut = asyncio.run_coroutine_threadsafe(
            c.runtime(tool).call(tool, tool.validate(args), CallContext("default")), gw.loop
        )
        out = fut.result(timeout=60)
        assert not isinstance(out.data, dict) or out.data.get("exitstatus", "OK") == "OK", out.data
    else:
        s = res.structured_content or {}
        assert s.get("exitstatus", "OK") == "OK", f"{name}: {s}"
    assert sent(sim) == [want], f"{name}: {sent(sim)}"
    return verdict


async def read(env: DevEnv, name: str, args: dict[str, Any]) -> dict[str, Any]:
    res = await call(env, admin(env), name, args)
    assert not res.is_error, text(res)
    return dict(res.structured_content)


async def config(env: DevEnv, vmid: int) -> dict[str, Any]:
    return dict((await read(env, "get_guest_config", {"vmid": vmid}))["config"])


async def guests(env: DevEnv) -> dict[int, dict[str, Any]]:
    return {g["vmid"]: g for g in (await read(env, "list_guests", {}))["items"]}


API = "/api2/json/nodes"


def sent_sizes(sim: Any, env: DevEnv, res: Any, keys: tuple[str, ...]) -> dict[str, int]:
    """The sizes one create sent to Proxmox, after checking that they are the arguments the
    policy decided on (the audit's `received` record): the quota counts what is sent."""
    posted = [body for method, _, body in sent(sim) if method == "POST"]
    assert len(posted) == 1, sent(sim)
    rows = audit_rows(env.config.audit_path, res.meta["pvegate/request_id"])
    decided = next(json.loads(r["body"])["arguments"] for r in rows if r["kind"] == "received")
    body = posted[0] or {}
    assert {k: str(decided.get(k)) for k in keys} == {k: body.get(k) for k in keys}, (decided, body)
    return {k: int(body[k]) for k in keys}


async def test_create_and_configure_a_vm(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    args = {
        "node": "pve1", "vmid": 180, "name": "ci-vm", "cores": 2, "memory": 2048, "ostype": "l26",
        "disk_storage": "local-lvm", "disk_gib": 16, "iso_storage": "local", "iso": ISO,
        "bridge": "vmbr0", "vlan": 20, "firewall": True, "cloudinit_storage": "local-lvm",
        "ciuser": "ops", "cipassword": CI_PASSWORD, "ssh_public_key": SSH_KEY,
        "ip_cidr": "10.10.1.180/24", "gateway": "10.10.1.1", "pool": "sandbox", "tags": "ci;sandbox", "start": True,
    }  # fmt: skip
    body = {
        "vmid": "180", "name": "ci-vm", "cores": "2", "sockets": "1", "memory": "2048", "ostype": "l26",
        "scsi0": "local-lvm:16", "ide2": f"local:iso/{ISO},media=cdrom", "ide0": "local-lvm:cloudinit",
        "net0": "virtio,bridge=vmbr0,tag=20,firewall=1", "ciuser": "ops", "cipassword": CI_PASSWORD,
        "sshkeys": quote(SSH_KEY, safe=""), "ipconfig0": "ip=10.10.1.180/24,gw=10.10.1.1", "pool": "sandbox",
        "tags": "ci;sandbox", "start": "1", "scsihw": "virtio-scsi-single",
    }  # fmt: skip
    await run(gateway, env, sim, "vm_create", args, ("POST", f"{API}/pve1/qemu", body))
    g = (await guests(env))[180]
    assert (g["status"], g["pool"], g["node"], g["maxcpu"]) == ("running", "sandbox", "pve1", 2)
    cfg = await config(env, 180)
    assert cfg["scsi0"].startswith("local-lvm:vm-180-disk-") and "size=16G" in cfg["scsi0"]
    assert cfg["net0"].startswith("virtio=BC:24:11:") and "cipassword" not in cfg

    await run(
        gateway, env, sim, "guest_disk_resize", {"vmid": 180, "disk": "scsi0", "grow_gib": 4},
        ("PUT", f"{API}/pve1/qemu/180/resize", {"disk": "scsi0", "size": "+4G"}),
    )  # fmt: skip
    assert "size=20G" in (await config(env, 180))["scsi0"]
    assert (await guests(env))[180]["maxdisk"] == 20 << 30

    await run(
        gateway, env, sim, "vm_disk_attach", {"vmid": 180, "index": 1, "storage": "local-lvm", "disk_gib": 2},
        ("POST", f"{API}/pve1/qemu/180/config", {"scsi1": "local-lvm:2"}),
    )  # fmt: skip
    assert "size=2G" in (await config(env, 180))["scsi1"]
    await run(
        gateway, env, sim, "vm_disk_move", {"vmid": 180, "disk": "scsi1", "storage": "ssd"},
        ("POST", f"{API}/pve1/qemu/180/move_disk", {"disk": "scsi1", "storage": "ssd"}),
    )  # fmt: skip
    cfg = await config(env, 180)
    assert cfg["scsi1"].startswith("ssd:vm-180-disk-") and cfg["unused0"].startswith("local-lvm:vm-180-disk-")

    await run(
        gateway, env, sim, "vm_nic_set", {"vmid": 180, "index": 1, "model": "virtio", "bridge": "vmbr0", "vlan": 30},
        ("PUT", f"{API}/pve1/qemu/180/config", {"net1": "virtio,bridge=vmbr0,tag=30,firewall=1"}),
    )  # fmt: skip
    assert "tag=30" in (await config(env, 180))["net1"]
    await run(
        gateway, env, sim, "guest_nic_remove", {"vmid": 180, "index": 1},
        ("PUT", f"{API}/pve1/qemu/180/config", {"delete": "net1"}),
    )  # fmt: skip
    assert "net1" not in await config(env, 180)

    await run(
        gateway, env, sim, "vm_cdrom_eject", {"vmid": 180},
        ("PUT", f"{API}/pve1/qemu/180/config", {"ide2": "none,media=cdrom"}),
    )  # fmt: skip
    await run(
        gateway, env, sim, "vm_cdrom_insert", {"vmid": 180, "iso_storage": "local", "iso": ISO},
        ("PUT", f"{API}/pve1/qemu/180/config", {"ide2": f"local:iso/{ISO},media=cdrom"}),
    )  # fmt: skip
    assert (await config(env, 180))["ide2"] == f"local:iso/{ISO},media=cdrom"

    # a running VM's boot order waits for the next start: pending, then reverted
    await run(
        gateway, env, sim, "vm_boot_order_set", {"vmid": 180, "order": "scsi0;ide2;net0"},
        ("PUT", f"{API}/pve1/qemu/180/config", {"boot": "order=scsi0;ide2;net0"}),
    )  # fmt: skip
    pending = {r["key"]: r for r in (await read(env, "get_guest_pending", {"vmid": 180}))["items"]}
    assert pending["boot"]["pending"] == "order=scsi0;ide2;net0"
    await run(
        gateway, env, sim, "guest_pending_revert", {"vmid": 180, "keys": "boot"},
        ("PUT", f"{API}/pve1/qemu/180/config", {"revert": "boot"}),
    )  # fmt: skip
    pending = {r["key"]: r for r in (await read(env, "get_guest_pending", {"vmid": 180}))["items"]}
    assert "pending" not in pending.get("boot", {})

    await run(
        gateway, env, sim, "guest_tags_set", {"vmid": 180, "tags": "ci;sandbox;web"},
        ("PUT", f"{API}/pve1/qemu/180/config", {"tags": "ci;sandbox;web"}),
    )  # fmt: skip
    await run(
        gateway, env, sim, "guest_description_set", {"vmid": 180, "description": "made by the provision e2e"},
        ("PUT", f"{API}/pve1/qemu/180/config", {"description": "made by the provision e2e"}),
    )  # fmt: skip
    assert "web" in (await guests(env))[180]["tags"]
    await run(
        gateway, env, sim, "vm_cloudinit_set",
        {"vmid": 180, "ciuser": "ops2", "cipassword": CI_PASSWORD_2, "index": 0, "ip_cidr": "dhcp"},
        ("PUT", f"{API}/pve1/qemu/180/config", {"ciuser": "ops2", "cipassword": CI_PASSWORD_2, "ipconfig0": "ip=dhcp"}),
    )  # fmt: skip
    await run(
        gateway, env, sim, "vm_cloudinit_regenerate", {"vmid": 180},
        ("PUT", f"{API}/pve1/qemu/180/cloudinit", {}),
    )  # fmt: skip
    assert (await config(env, 180))["ipconfig0"] == "ip=dhcp"

    # destroy-class: detaching a used disk, then deleting the unused volume
    await run(
        gateway, env, sim, "guest_disk_detach", {"vmid": 180, "disk": "scsi1"},
        ("PUT", f"{API}/pve1/qemu/180/config", {"delete": "scsi1"}),
    )  # fmt: skip
    cfg = await config(env, 180)
    assert "scsi1" not in cfg and cfg["unused1"].startswith("ssd:vm-180-disk-")
    volid = cfg["unused1"]
    await run(
        gateway, env, sim, "guest_unused_disk_delete", {"vmid": 180, "unused": 1},
        ("PUT", f"{API}/pve1/qemu/180/config", {"delete": "unused1"}),
    )  # fmt: skip
    assert "unused1" not in await config(env, 180)
    assert volid not in str(sim.state())


async def test_create_and_configure_a_container(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    # on pve1: the read tests pin pve2's containers
    args = {
        "node": "pve1", "vmid": 181, "hostname": "ct-ci", "template_storage": "local", "template": TEMPLATE,
        "disk_storage": "local-lvm", "disk_gib": 8, "memory": 512, "bridge": "vmbr0", "ip_cidr": "dhcp",
        "password": CT_PASSWORD, "ssh_public_key": SSH_KEY, "pool": "sandbox",
    }  # fmt: skip
    body = {
        "vmid": "181", "hostname": "ct-ci", "ostemplate": f"local:vztmpl/{TEMPLATE}", "rootfs": "local-lvm:8",
        "cores": "1", "memory": "512", "swap": "512", "net0": "name=eth0,bridge=vmbr0,ip=dhcp,firewall=1",
        "password": CT_PASSWORD, "ssh-public-keys": SSH_KEY, "pool": "sandbox", "unprivileged": "1",
    }  # fmt: skip
    await run(gateway, env, sim, "lxc_create", args, ("POST", f"{API}/pve1/lxc", body))
    assert (await guests(env))[181]["status"] == "stopped"
    await run(
        gateway, env, sim, "lxc_volume_move",
        {"vmid": 181, "volume": "rootfs", "storage": "ssd", "delete_source": True},
        ("POST", f"{API}/pve1/lxc/181/move_volume", {"volume": "rootfs", "storage": "ssd", "delete": "1"}),
    )  # fmt: skip
    cfg = await config(env, 181)
    assert cfg["rootfs"].startswith("ssd:vm-181-disk-") and "unused0" not in cfg
    await run(
        gateway, env, sim, "lxc_mountpoint_add",
        {"vmid": 181, "index": 0, "storage": "local-lvm", "disk_gib": 1, "path": "/srv/data"},
        ("PUT", f"{API}/pve1/lxc/181/config", {"mp0": "local-lvm:1,mp=/srv/data"}),
    )  # fmt: skip
    assert "mp=/srv/data" in (await config(env, 181))["mp0"]
    await run(
        gateway, env, sim, "lxc_nic_set",
        {"vmid": 181, "index": 1, "ifname": "eth1", "bridge": "vmbr0", "ip_cidr": "10.10.2.181/24",
         "gateway": "10.10.2.1"},
        ("PUT", f"{API}/pve1/lxc/181/config",
         {"net1": "name=eth1,bridge=vmbr0,ip=10.10.2.181/24,gw=10.10.2.1,firewall=1"}),
    )  # fmt: skip
    assert (await config(env, 181))["net1"].startswith("name=eth1")
    res = await call(env, admin(env), "lxc_start", {"vmid": 181})
    assert not res.is_error, text(res)
    assert (await guests(env))[181]["status"] == "running"


async def test_convert_to_template(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    made = await call(
        env, admin(env), "vm_create",
        {"node": "pve2", "vmid": 182, "name": "tmpl-src", "disk_storage": "local-lvm", "disk_gib": 4},
    )  # fmt: skip
    assert not made.is_error, text(made)
    await run(
        gateway, env, sim, "guest_convert_to_template", {"vmid": 182},
        ("POST", f"{API}/pve2/qemu/182/template", {}),
    )  # fmt: skip
    assert (await guests(env))[182]["template"] == 1
    assert "base-182-disk-" in (await config(env, 182))["scsi0"]
    res = await call(env, admin(env), "vm_start", {"vmid": 182})
    assert res.is_error and "template" in text(res)


async def test_property_strings_refuse_smuggled_options(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    sim.clear_logs()
    # the patterns already refuse separators; a partial template is an error, never a shorter string
    res = await call(env, admin(env), "vm_create", {"node": "pve1", "vmid": 183, "disk_storage": "local-lvm"})
    assert res.is_error and "disk_storage needs disk_gib" in text(res), text(res)
    res = await call(env, admin(env), "vm_nic_set", {"vmid": 103, "index": 0, "model": "virtio", "bridge": "vmbr0,x=1"})
    assert res.is_error and "bridge" in text(res)
    assert sent(sim) == []


async def test_provisioner_agent_quota(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    """The example organisation: provisioning agents create in pool sandbox only, up to 4 cores / 8 GiB."""
    tok = env.token("prov-agent", ["provisioner"], kind="agent")
    base = {"node": "pve1", "disk_storage": "local-lvm", "disk_gib": 8, "pool": "sandbox"}
    sim.clear_logs()
    big = await call(env, tok, "vm_create", {**base, "vmid": 184, "cores": 8})
    assert big.is_error and "provisioners-in-sandbox" in text(big) and "8 cores" in text(big), text(big)
    assert "quota.resource_per_guest" in big.structured_content["codes"]
    elsewhere = await call(env, tok, "vm_create", {**base, "vmid": 184, "cores": 2, "pool": "lab"})
    assert elsewhere.is_error and "no role" in text(elsewhere), text(elsewhere)
    assert sent(sim) == []
    ok = await call(env, tok, "vm_create", {**base, "vmid": 184, "cores": 4, "memory": 8192})
    assert not ok.is_error, text(ok)
    assert (await guests(env))[184]["pool"] == "sandbox"
    # the quota counted cores x sockets with sockets 1: Proxmox is told so, not left to its default
    assert sent_sizes(sim, env, ok, ("cores", "sockets", "memory")) == {"cores": 4, "sockets": 1, "memory": 8192}

    # a container: what the quota counts is what Proxmox gets. Without `cores` Proxmox lets a
    # container use every core of its node, so the counted 1 is sent; swap counts as memory
    ct = {**base, "template_storage": "local", "template": TEMPLATE, "hostname": "ct-quota"}
    sim.clear_logs()
    for big_swap in ({"swap": 1048576}, {"memory": 8192, "swap": 512}):
        res = await call(env, tok, "lxc_create", {**ct, "vmid": 188, **big_swap})
        assert res.is_error and "quota.resource_per_guest" in res.structured_content["codes"], text(res)
        assert "MiB of memory" in text(res), text(res)
    assert sent(sim) == []
    small_ct = await call(env, tok, "lxc_create", {**ct, "vmid": 188})
    assert not small_ct.is_error, text(small_ct)
    assert sent_sizes(sim, env, small_ct, ("cores", "memory", "swap")) == {"cores": 1, "memory": 512, "swap": 512}
    assert (await guests(env))[188]["maxcpu"] == 1

    # a clone of a sandbox guest is a new guest: it too must land in the sandbox (the policy sees
    # target.destination); out of it, or in no pool at all, no binding of the agent covers it
    sim.clear_logs()
    for pool in ("prod", None):
        args = {"vmid": 184, "newid": 185, "name": "out-of-sandbox", **({"pool": pool} if pool else {})}
        out = await call(env, tok, "guest_clone", args)
        assert out.is_error and "no role" in text(out) and "into guest 185" in text(out), text(out)
    assert sent(sim) == [] and 185 not in await guests(env)
    inside = await call(env, tok, "guest_clone", {"vmid": 184, "newid": 185, "name": "in-sandbox", "pool": "sandbox"})
    assert not inside.is_error, text(inside)
    assert (await guests(env))[185]["pool"] == "sandbox"


def test_cloudinit_secrets_never_reach_audit_or_results(gateway: GatewayThread, env: DevEnv) -> None:
    """The cloud-init and root passwords sent above: not in the audit database, its WAL, or
    the policy inputs the decision records keep (compressed: searched unpacked)."""
    raw, rows = audit_bytes(env.config.audit_path)
    for secret in (CI_PASSWORD, CI_PASSWORD_2, CT_PASSWORD):
        assert secret.encode() not in raw
    creates = ("vm_create", "vm_cloudinit_set", "lxc_create")
    decisions = [r for r in rows if r["tool"] in creates and r["kind"] == "decision"]
    assert decisions, "the create calls were audited"
    kept = [kept_input(r) for r in decisions]
    assert any(k and k["arguments"].get("cipassword") == "[redacted]" for k in kept)
    # nor as a digest: with the other arguments beside it, an unsalted hash over a password gives it
    # back to a word list. Put each password back where it was redacted: no recorded digest matches.
    checked = 0
    for row, doc in zip(decisions, kept, strict=True):
        assert doc is not None
        hidden = [k for k, v in doc["arguments"].items() if v == "[redacted]"]
        if not hidden:
            continue
        checked += 1
        body = json.loads(row["body"])
        for secret in (CI_PASSWORD, CI_PASSWORD_2, CT_PASSWORD):
            guess = {**doc["arguments"], **dict.fromkeys(hidden, secret)}
            raw_digest = arguments_digest(row["tool"], guess, dry_run=doc["dry_run"])
            assert raw_digest != doc["arguments_digest"]
            assert digest_json({**doc, "arguments": guess}) != body["input_digest"]
            assert digest_json({**doc, "arguments": guess, "arguments_digest": raw_digest}) != body["input_digest"]
    assert checked >= 3  # the two cloud-init passwords and the container's root password
