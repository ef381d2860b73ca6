"""The SSH path against a hostile node or guest: a real asyncssh server on 127.0.0.1
(tests/connectors/hostile_ssh.py) and the real SshRuntime, pinned to it.

- inspect_compose_stack ran one `docker inspect` per `docker ps` row the guest printed, with
  no de-duplication, no cap and no overall deadline: ~20,000 rows fit in the output cap, so
  one call could run 20,000 commands on the node, for hours when each hangs to its timeout.
  Now each container is inspected once, at most MAX_COMPOSE_INSPECTS of them, and a
  composite call has one deadline.
- asyncssh trusted X.509 CAs from ~/.ssh/ca-bundle.crt and ~/.ssh/crt by default: with
  pyOpenSSL importable, a man in the middle with a host certificate from such a CA got past
  the pinned host key. Now the pin is the only trust.
- json_lines output was split with str.splitlines, which also splits at U+0085 and U+2028:
  docker's JSON leaves those raw, so one container with one in a field broke the listing.
- the SSH private key was used whatever its mode, while the audit head key is refused when
  others may read it. Now the gateway refuses to start with such a key.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from gateway.core.config import load
from gateway.server import check_ssh_keys
from gateway.tools.runtimes import reducers
from gateway.tools.runtimes.base import CallContext, ToolError
from gateway.tools.runtimes.composite import CompositeRuntime
from gateway.tools.runtimes.ssh import parse_output
from tests.config.conftest import minimal, run_pvegate, write
from tests.connectors.hostile_ssh import CATALOG, GuestList, answer, client_key, hostile_node

CAP = 50  # reducers.MAX_COMPOSE_INSPECTS, as docs/connectors.md states it
MARGIN = 1.5  # scheduling slack on a busy 2-core machine


def ps_row(container_id: str, service: str) -> str:
    """One line of `docker ps --format '{{json .}}'` for a container of Compose project "app"."""
    labels = f"com.docker.compose.project=app,com.docker.compose.service={service}"
    row = {"ID": container_id, "Names": f"app-{service}-1", "Image": "nginx", "Labels": labels, "State": "running"}
    return json.dumps(row, separators=(",", ":"))


def guest(ps_lines: list[str], inspect: Any) -> Any:
    """A guest whose docker ps prints `ps_lines`, whose compose ls knows project "app", and whose
    docker inspect is answered by `inspect`."""
    listing = ("\n".join(ps_lines) + "\n").encode()

    async def handle(p: asyncssh.SSHServerProcess[bytes]) -> None:
        argv = str(p.command).split()
        if "ps" in argv:
            p.stdout.write(listing)
        elif "compose" in argv:
            p.stdout.write(b'[{"Name":"app","Status":"running(3)","ConfigFiles":"/srv/app/compose.yaml"}]\n')
        else:
            await inspect(p)
        p.exit(0)

    return handle


async def inspect_ok(p: asyncssh.SSHServerProcess[bytes]) -> None:
    p.stdout.write(b'{"name":"/x","restart":{"Name":"always"},"state":{"ExitCode":0},"networks":{"app_default":{}}}\n')


async def inspect_hangs(p: asyncssh.SSHServerProcess[bytes]) -> None:
    await asyncio.sleep(3600)  # as a guest's docker can; the node's `timeout` would end it, this node has none


# --- inspect_compose_stack: de-duplicated, capped, and under one deadline ---------------------------------


async def test_compose_stack_inspects_each_container_once_and_at_most_the_cap(tmp_path: Path) -> None:
    # 200 rows of project "app": 120 containers, 80 of them printed twice
    ids = [f"{i:012x}" for i in range(120)]
    lines = [ps_row(i, f"svc{n:03d}") for n, i in enumerate(ids)] + [ps_row(i, "dup") for i in ids[:80]]
    async with hostile_node(tmp_path, guest(lines, inspect_ok)) as node:
        composite = CompositeRuntime(CATALOG, {"ssh": node.runtime, "pve_api": GuestList()}, {"default": node.cluster})
        out = await composite.call(CATALOG.tools["inspect_compose_stack"], {"vmid": 200, "project": "app"},
                                   CallContext("default"))  # fmt: skip
    inspects = [c for c in node.commands if " inspect " in c]
    assert len(inspects) <= CAP, f"{len(inspects)} docker inspects for one call"  # before: 200
    assert len(node.commands) <= CAP + 2  # and docker ps, docker compose ls
    assert len(set(inspects)) == len(inspects)  # no container twice
    services = out.data["services"]
    assert len(services) == 120  # every container listed once; the first row printed for it wins
    assert {s["service"] for s in services} == {f"svc{n:03d}" for n in range(120)}
    assert sum("restart_policy" in s for s in services) == CAP  # the rest from their docker ps row alone
    assert all(s["state"] == "running" and s["image"] == "nginx" for s in services)
    assert f"70 more container(s) of project app not inspected (at most {CAP} per call)" in " ".join(out.warnings)
    assert reducers.MAX_COMPOSE_INSPECTS == CAP


async def test_compose_stack_ends_at_its_deadline_when_inspects_hang(tmp_path: Path) -> None:
    """Each inspect hangs to its timeout: before, 40 of them ran 8 at a time, 3.5 s each (timeout,
    KILL grace, verdict grace), ~17.5 s for the call, ~8 h for 20,000 rows at the default 10 s.
    Now the call ends at its deadline, 6 x the longer of the two timeouts (3 s here), its sub-calls
    cancelled: their channels closed, and each command that reached the node has its dispatch record."""
    lines = [ps_row(f"{i:012x}", f"svc{i:03d}") for i in range(40)]
    dispatched: list[dict[str, Any]] = []

    async def record(info: dict[str, Any]) -> None:
        dispatched.append(info)

    async with hostile_node(tmp_path, guest(lines, inspect_hangs), command_timeout=0.5, api_timeout=0.5) as node:
        composite = CompositeRuntime(CATALOG, {"ssh": node.runtime, "pve_api": GuestList()}, {"default": node.cluster})
        deadline = 3.0
        started = time.monotonic()
        async with asyncio.timeout(deadline + 2 * MARGIN):  # before: no deadline, the call ran on
            with pytest.raises(ToolError) as caught:
                await composite.call(CATALOG.tools["inspect_compose_stack"], {"vmid": 200, "project": "app"},
                                     CallContext("default", on_dispatch=record))  # fmt: skip
        took = time.monotonic() - started
        assert deadline - 0.1 <= took <= deadline + MARGIN, took
        assert str(caught.value) == (
            "inspect_compose_stack did not finish within its 3s deadline (6 times the longer of the cluster's "
            "timeout and ssh.command_timeout); the sub-calls still running were cancelled"
        )
        hung = [c for c in node.commands if " inspect " in c]
        assert hung  # some were running when the deadline came
        for _ in range(50):  # the node sees each cancelled command's channel closed
            if len(node.closed) == len(hung):
                break
            await asyncio.sleep(0.02)
        assert sorted(node.closed) == sorted(hung)
    assert len(dispatched) == len(node.commands)  # no command ran on the node unrecorded
    assert all(d["via"] and d["node"] == "pve1" for d in dispatched)


# --- the pinned host key is the only trust ----------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:X509.get_:DeprecationWarning")  # asyncssh's use of pyOpenSSL
async def test_an_x509_host_certificate_from_a_ca_in_home_does_not_pass_the_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        import OpenSSL  # noqa: F401  # asyncssh verifies X.509 host certificates only with it
    except ImportError:
        pytest.fail("pyOpenSSL is not installed (a dev extra): run `make venv`")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))  # asyncssh looks for ~/.ssh/ca-bundle.crt at each connect
    ca = asyncssh.generate_private_key("ssh-rsa")
    ca.generate_x509_ca_certificate(ca, "CN=some-ca").write_certificate(str(home / ".ssh" / "ca-bundle.crt"), "pem")
    mitm = asyncssh.generate_private_key("ssh-rsa")
    cert = ca.generate_x509_host_certificate(mitm, "CN=127.0.0.1", issuer="CN=some-ca", principals=["127.0.0.1"])
    node_key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()  # the real node's
    async with hostile_node(tmp_path, answer(b"VMID NAME STATUS\n"), host_keys=[(mitm, cert)], pinned=node_key) as node:
        # the test's premise: asyncssh left at its X.509 defaults takes this man in the middle
        port = node.cluster.ssh.nodes["pve1"].port  # type: ignore[union-attr]
        pin = asyncssh.import_public_key(node_key)
        async with asyncssh.connect(
            "127.0.0.1", port, username="root", client_keys=[str(client_key(tmp_path))],
            known_hosts=([pin], [], []), agent_path=None, config=None,
        ) as conn:  # fmt: skip
            assert conn.get_server_host_key() != pin
        node.commands.clear()

        with pytest.raises(ToolError, match="SSH to node pve1 failed"):  # before: the call ran on the MITM
            await node.runtime.call(CATALOG.tools["node_qm_list"], {"node": "pve1"}, CallContext("default"))
        assert node.commands == []


# --- json_lines are lines at "\n" only --------------------------------------------------------------------


def test_json_lines_split_at_newlines_only() -> None:
    rows = [{"ID": "a", "Command": "sh -c 'echo hi\u0085there'"}, {"ID": "b", "Names": "db\u2028x\u2029\u000c"}]
    stdout = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)  # raw, as docker's Go JSON leaves them
    assert parse_output("json_lines", stdout, 0) == rows
    assert parse_output("json_lines", stdout.replace("\n", "\r\n"), 0) == rows
    header = "Filesystem Type 1B-blocks Used Avail Mounted on\n"
    df = parse_output("df", header + "/dev/x ext4 10 4 6 /mnt/a\u2028/dev/y xfs 1 1 0 /fake\n", 0)
    assert [r["mountpoint"] for r in df] == ["/mnt/a\u2028/dev/y xfs 1 1 0 /fake"]  # one filesystem, not two
    assert parse_output("table", "VMID NAME\n100  a\u0085b\n", 0) == [{"vmid": "100", "name": "a\u0085b"}]


async def test_docker_ps_with_a_next_line_in_a_field_lists_every_container(tmp_path: Path) -> None:
    rows = [{"ID": "aaa", "Names": "web", "Command": "\"sh -c 'echo hi\u0085there'\"", "State": "running"},
            {"ID": "bbb", "Names": "db", "Command": '"postgres"', "State": "running"}]  # fmt: skip
    stdout = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows)
    async with hostile_node(tmp_path, answer(stdout.encode())) as node:
        out = await node.runtime.call(CATALOG.tools["lxc_docker_ps"], {"vmid": 200}, CallContext("default"))
    assert out.data == rows  # before: "command output was not the expected JSON"


# --- the SSH key is the gateway's alone -------------------------------------------------------------------


def ssh_config(tmp_path: Path, mode: int) -> Path:
    raw = minimal(tmp_path)
    key = client_key(tmp_path)
    key.chmod(mode)
    node_key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    raw["clusters"][0]["ssh"] = {"key_file": str(key), "nodes": {"pve1": {"host": "127.0.0.1", "host_key": node_key}}}
    # checked after the SSH key: a gateway that passed it stops there rather than starting (and serving)
    raw["tls"] = {"cert": str(tmp_path / "no-cert.pem"), "key": str(tmp_path / "no-key.pem")}
    return write(tmp_path, raw)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620], ids=oct)
def test_an_ssh_key_others_may_read_is_refused_at_start(tmp_path: Path, mode: int) -> None:
    r = run_pvegate("serve", "--config", str(ssh_config(tmp_path, mode)))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr  # before: it started
    assert r.stderr.strip().splitlines()[-1] == (
        f"pvegate: cannot start: clusters.default.ssh.key_file: {tmp_path / 'client-key'} is readable or "
        f"writable by other users (mode {mode:o}): chmod 600 it"
    )


@pytest.mark.parametrize("mode", [0o600, 0o400], ids=oct)
def test_an_ssh_key_only_its_owner_may_read_passes(tmp_path: Path, mode: int) -> None:
    config = load(ssh_config(tmp_path, mode))
    check_ssh_keys(config)
    assert os.stat(tmp_path / "client-key").st_mode & 0o777 == mode
