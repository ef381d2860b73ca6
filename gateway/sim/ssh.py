"""One asyncssh server per simulated node: pinned host key, key-only auth, exec only.

Commands are answered by `shell.run`, from the same state as the API, and every
exec is recorded (node, command, argv, timeout, exit status, signal, start and end)
for the ssh log. Like OpenSSH: at most MAX_SESSIONS sessions at once per connection,
a command the client abandons (closed channel) keeps running, and a coreutils
`timeout` prefix is enforced (so a hung command, fault `ssh_hang`, is killed by it).
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from collections.abc import Awaitable, Callable
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


MAX_SESSIONS = 10  # OpenSSH's default MaxSessions: sessions open at once on one connection
HANG_POLL_SECONDS = 0.05


class _Server(asyncssh.SSHServer):
    """One client connection. Like sshd, it refuses a session beyond MAX_SESSIONS, and a session
    counts until its channel is closed *and* its command has ended: a client that closes the
    channel of a command still running does not get the session back (nor end the command)."""

    def __init__(
        self,
        authorized: asyncssh.SSHAuthorizedKeys,
        online: Callable[[], bool],
        handle: Callable[[asyncssh.SSHServerChannel[str]], Awaitable[None]],
    ) -> None:
        self._authorized = authorized
        self._online = online
        self._handle = handle
        self._conn: asyncssh.SSHServerConnection | None = None
        self.sessions = 0

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
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

    def session_requested(self) -> tuple[asyncssh.SSHServerChannel[str], Callable[..., Awaitable[None]]]:
        conn = self._conn
        assert conn is not None
        if self.sessions >= MAX_SESSIONS:  # sshd: "no more sessions" -> SSH_MSG_CHANNEL_OPEN_FAILURE
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, "open failed")
        self.sessions += 1
        chan: asyncssh.SSHServerChannel[str] = conn.create_server_channel(encoding="utf-8")
        started: list[bool] = []
        ended = asyncio.Event()

        async def run() -> None:
            try:
                await self._handle(chan)
            finally:
                ended.set()

        def session(*_streams: object) -> Awaitable[None]:  # (stdin, stdout, stderr): the command starts
            started.append(True)
            return run()

        async def release() -> None:
            await chan.wait_closed()
            if started:
                await ended.wait()
            self.sessions -= 1

        conn.create_task(release())
        return chan, session


async def start_node_server(rt: Runtime, node: str, keys: SshKeys, port: int) -> tuple[Any, int]:
    authorized = asyncssh.import_authorized_keys(keys.client_pub + "\n")

    async def handle(chan: asyncssh.SSHServerChannel[str]) -> None:
        command = chan.get_command()
        entry: dict[str, Any] = {
            "node": node,
            "command": command,
            "argv": None,
            "timeout": None,
            "exit_status": None,
            "signal": None,
            "time": time.time(),
            "ended": None,
        }
        rt.ssh.append(entry)

        def finish(res: shell.Result, signal: str | None = None) -> None:
            entry["exit_status"] = res.exit_status
            entry["signal"] = signal
            entry["ended"] = time.time()
            if chan.is_closing():  # the client went away: nobody reads it (the command ended all the same)
                return
            try:
                if res.stdout:
                    chan.write(res.stdout)
                if res.stderr:
                    chan.write_stderr(res.stderr)
                chan.exit(res.exit_status)
            except (OSError, asyncssh.Error):
                pass

        if not rt.node_online(node):  # went offline after the client connected: the session dies
            entry["exit_status"] = -1
            entry["ended"] = time.time()
            chan.get_connection().abort()
            return
        if command is None:
            finish(shell.Result(stderr="interactive shells are not available on the simulator\n", exit_status=1))
            return
        try:
            argv = shlex.split(command)
        except ValueError as e:
            finish(shell.Result(stderr=f"bash: -c: line 1: syntax error: {e}\n", exit_status=2))
            return
        entry["argv"] = argv
        split = shell.split_timeout(argv)
        if isinstance(split, shell.Result):
            finish(split)
            return
        limit, argv = split
        entry["argv"] = argv  # the command itself; a `timeout` prefix is in `timeout`
        entry["timeout"] = limit.duration if limit else None
        line = shlex.join(argv)

        async def execute() -> shell.Result:
            if rt.faults.ssh_latency_ms:
                await asyncio.sleep(rt.faults.ssh_latency_ms / 1000)
            # blocked (a dead NFS mount) until the fault is lifted; faults are plain data set by the admin API
            while rt.faults.ssh_hangs(line):  # noqa: ASYNC110
                await asyncio.sleep(HANG_POLL_SECONDS)
            try:
                return shell.run(rt, node, argv)
            except Exception as e:  # a simulator bug must not hang the client
                log.exception("ssh command %r crashed", command)
                return shell.Result(stderr=f"simulator error: {e}\n", exit_status=255)

        if limit is None or not limit.duration:
            finish(await execute())
            return
        try:
            res = await asyncio.wait_for(execute(), limit.duration)
        except TimeoutError:  # `timeout` sends its signal, which ends the command (the simulator's commands die of it)
            status = 128 + shell.SIGNALS[limit.signal] if limit.preserve_status else 124
            finish(shell.Result(exit_status=status), signal=limit.signal)
            return
        finish(res)

    server = await asyncssh.create_server(
        lambda: _Server(authorized, lambda: rt.node_online(node), handle),
        "127.0.0.1",
        port,
        server_host_keys=[str(keys.host_keys[node])],
        encoding="utf-8",
        agent_forwarding=False,
        x11_forwarding=False,
        server_version="OpenSSH_9.2p1 Debian-2+deb12u3",
    )
    sock_port = server.sockets[0].getsockname()[1]
    return server, int(sock_port)
