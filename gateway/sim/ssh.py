"""One asyncssh server per simulated node: pinned host key, key-only auth, exec only.

Commands are answered by `shell.run`, from the same state as the API, and every
exec is recorded (node, command, argv, exit status) for the ssh log.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from gateway.sim import shell
from gateway.sim.runtime import Runtime

log = logging.getLogger("pvegate.sim.ssh")


@dataclass(frozen=True)
class SshKeys:
    host_keys: dict[str, Path]  # node -> private key file
    host_pub: dict[str, str]  # node -> "ssh-ed25519 AAAA..."
    client_key: Path
    client_pub: str


def make_keys(workdir: Path, nodes: list[str]) -> SshKeys:
    workdir.mkdir(parents=True, exist_ok=True)
    host_keys: dict[str, Path] = {}
    host_pub: dict[str, str] = {}
    for n in nodes:
        k = asyncssh.generate_private_key("ssh-ed25519", comment=f"root@{n}")
        p = workdir / f"ssh_host_{n}_ed25519_key"
        k.write_private_key(str(p))
        p.chmod(0o600)
        host_keys[n] = p
        host_pub[n] = k.export_public_key().decode().strip()
    ck = asyncssh.generate_private_key("ssh-ed25519", comment="pvegate-sim-client")
    cp = workdir / "sim_client_ed25519"
    ck.write_private_key(str(cp))
    cp.chmod(0o600)
    pub = ck.export_public_key().decode().strip()
    (workdir / "sim_client_ed25519.pub").write_text(pub + "\n")
    return SshKeys(host_keys, host_pub, cp, pub)


def host_key_fingerprint(pub_line: str) -> str:
    return str(asyncssh.import_public_key(pub_line).get_fingerprint("sha256"))


class _Server(asyncssh.SSHServer):
    def __init__(self, authorized: asyncssh.SSHAuthorizedKeys, online: Callable[[], bool]) -> None:
        self._authorized = authorized
        self._online = online

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        if not self._online():
            conn.abort()  # an offline node: the TCP session dies before the SSH handshake completes

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return username == "root" and self._authorized.validate(key, "127.0.0.1", "127.0.0.1") is not None


async def start_node_server(rt: Runtime, node: str, keys: SshKeys, port: int) -> tuple[Any, int]:
    authorized = asyncssh.import_authorized_keys(keys.client_pub + "\n")

    async def handle(process: asyncssh.SSHServerProcess[str]) -> None:
        command = process.command
        entry: dict[str, Any] = {
            "node": node,
            "command": command,
            "argv": None,
            "exit_status": None,
            "time": time.time(),
        }
        rt.ssh.append(entry)
        if not rt.node_online(node):  # went offline after the client connected: the session dies
            entry["exit_status"] = -1
            process.get_extra_info("connection").abort()
            return
        if rt.faults.ssh_latency_ms:
            await asyncio.sleep(rt.faults.ssh_latency_ms / 1000)
        if command is None:
            process.stderr.write("interactive shells are not available on the simulator\n")
            entry["exit_status"] = 1
            process.exit(1)
            return
        try:
            entry["argv"] = shlex.split(command)
        except ValueError as e:
            process.stderr.write(f"bash: -c: line 1: syntax error: {e}\n")
            entry["exit_status"] = 2
            process.exit(2)
            return
        try:
            res = shell.run(rt, node, entry["argv"])
        except Exception as e:  # a simulator bug must not hang the client
            log.exception("ssh command %r crashed", command)
            res = shell.Result(stderr=f"simulator error: {e}\n", exit_status=255)
        if res.stdout:
            process.stdout.write(res.stdout)
        if res.stderr:
            process.stderr.write(res.stderr)
        entry["exit_status"] = res.exit_status
        process.exit(res.exit_status)

    server = await asyncssh.create_server(
        lambda: _Server(authorized, lambda: rt.node_online(node)),
        "127.0.0.1",
        port,
        server_host_keys=[str(keys.host_keys[node])],
        process_factory=handle,
        encoding="utf-8",
        allow_scp=False,
        agent_forwarding=False,
        x11_forwarding=False,
        server_version="OpenSSH_9.2p1 Debian-2+deb12u3",
    )
    sock_port = server.sockets[0].getsockname()[1]
    return server, int(sock_port)
