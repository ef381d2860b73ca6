"""The ssh runtime: a declared argv form → one exec on one node, read-only.

The allow-list is exactly the set of argv forms declared in connectors/: after
substitution, the whole argument vector must match one declared form (literals
equal, placeholders whole elements with safe, schema-valid values) before any
connection is opened. No code path takes a command string. The argv is joined
with shlex quoting because SSH exec carries a single string.

Two limits protect the node. A pooled connection carries at most `ssh.max_sessions`
commands at once (sshd refuses a session beyond its MaxSessions, 10 by default); more
wait for a free session within their timeout. And every command runs under coreutils
`timeout` (`timeout -k 2 <seconds left>`, prefixed after the allow-list check): sshd
does not end a command whose channel the client closed, so without it a command hung
on a dead NFS mount would run (and hold its session) forever, one more per retry.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncssh
import jsonschema

from gateway.core import jsonread
from gateway.core.config import ClusterConfig, SSHConfig, SSHNodeConfig
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import (
    CallContext,
    CommandFailed,
    GuestLocator,
    ToolError,
    ToolOutput,
    UpstreamError,
)
from gateway.tools.runtimes.base import Refused as BaseRefused
from gateway.tools.runtimes.transport import CALLER, CALLER_SHARE
from gateway.tools.tool import PLACEHOLDER, Tool

log = logging.getLogger("pvegate.ssh")
# Whitespace and everything a POSIX shell gives meaning to; placeholders may hold none of it.
UNSAFE = re.compile(r"[\s;&|<>()$`\\\"'*?\[\]{}!#~^=,%]")
MAX_VALUE = 256


class Refused(BaseRefused):
    """The argv is not on the allow-list; nothing was sent."""


def safe_value(value: str) -> str | None:
    """Why a placeholder value is unsafe, or None."""
    if not value:
        return "empty"
    if value.startswith("-"):
        return "starts with '-'"
    if len(value) > MAX_VALUE:
        return "too long"
    if UNSAFE.search(value) or not value.isascii() or not value.isprintable():
        return "contains whitespace, a shell metacharacter or a non-ASCII character"
    return None


@dataclass(frozen=True)
class Form:
    tool: str
    argv: tuple[str, ...]
    schemas: dict[str, dict[str, Any]]

    def matches(self, argv: list[str]) -> bool:
        if len(argv) != len(self.argv):
            return False
        for template, value in zip(self.argv, argv, strict=True):
            m = PLACEHOLDER.fullmatch(template)
            if m is None:
                if value != template:
                    return False
                continue
            if safe_value(value) is not None:
                return False
            schema = self.schemas[m.group(1)]
            typed: Any = int(value) if schema.get("type") == "integer" and value.isdigit() else value
            if not jsonschema.Draft202012Validator(schema).is_valid(typed):
                return False
        return True


class AllowList:
    """Every argv form declared by an ssh tool; nothing else may run."""

    def __init__(self, catalog: Catalog) -> None:
        self.forms = [
            Form(t.name, tuple(t.spec["argv"]), dict(t.parameters["properties"]))
            for t in catalog
            if t.connector == "ssh"
        ]

    def match(self, argv: list[str]) -> str | None:
        return next((f.tool for f in self.forms if f.matches(argv)), None)


def render_argv(tool: Tool, args: dict[str, Any]) -> list[str]:
    argv: list[str] = []
    for element in tool.spec["argv"]:
        m = PLACEHOLDER.fullmatch(element)
        if m is None:
            argv.append(element)
            continue
        name = m.group(1)
        if name not in args:
            raise Refused(f"refused: {name} is required for this command")
        value = args[name]
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise Refused(f"refused: {name} must be a string or an integer")
        text = str(value)
        why = safe_value(text)
        if why:
            raise Refused(f"refused: {name} {why}")
        argv.append(text)
    return argv


def lines_of(text: str) -> list[str]:
    """Lines split at "\n" (a "\r" before it dropped) and nowhere else: str.splitlines also splits at
    U+0085, U+2028 and the like, which docker's JSON and a path may hold raw, so one such field would
    cut a row (or a JSON document) in two."""
    return [line.removesuffix("\r") for line in text.split("\n")]


# the headers of `qm list` (PVE/CLI/qm.pm: "%10s %-20s %-10s %-10s %12s %-10s") and `pct list`
# (PVE/CLI/pct.pm: "%-10s %-10s %-12s %-20s"): a value wider than its column (a VM name over 20
# characters, PVE allows 63; the lock "snapshot-delete") pushes the rest of its row to the right,
# so these rows are split into their whitespace-free values, never cut at the header's offsets
QM_LIST = ["vmid", "name", "status", "mem(mb)", "bootdisk(gb)", "pid"]
PCT_LIST = ["vmid", "status", "lock", "name"]


def _qm_row(line: str) -> dict[str, str] | None:
    """vmid first, status, memory, boot disk and pid last, the name (no spaces, maybe none) between."""
    words = line.split()
    if len(words) < 5 or len(words) > 6:
        return None
    vmid, *name, status, mem, disk, pid = words
    return dict(zip(QM_LIST, [vmid, "".join(name), status, mem, disk, pid], strict=True))


def _pct_row(line: str, name_at: int) -> dict[str, str] | None:
    """vmid, status, then the lock (often empty) and the name. Neither holds a space (a container's
    name is its hostname, or CT<vmid>), so four values are all of them; of three, the third is the
    lock when it starts before the Name column (an empty name), else the name (no lock)."""
    found = list(re.finditer(r"\S+", line))
    words = [m.group(0) for m in found]
    if len(words) == 4:
        return dict(zip(PCT_LIST, words, strict=True))
    if len(words) == 3:
        lock_only = found[2].start() < name_at
        return dict(zip(PCT_LIST, [*words[:2], *((words[2], "") if lock_only else ("", words[2]))], strict=True))
    if len(words) == 2:
        return dict(zip(PCT_LIST, [*words, "", ""], strict=True))
    return None


def parse_table(text: str) -> list[dict[str, str]]:
    """CLI tables (qm list, pct list): a row of `qm list` or `pct list` by its values (see QM_LIST),
    any other table's columns where the header's words start."""
    lines = [ln for ln in lines_of(text) if ln.strip()]
    if not lines:
        return []
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = [m.group(0).lower() for m in re.finditer(r"\S+", header)]
    rows = []
    for line in lines[1:]:
        row = None
        if names == QM_LIST:
            row = _qm_row(line)
        elif names == PCT_LIST:
            row = _pct_row(line, starts[3])
        if row is None:  # another table, or a row these do not describe: as the header places it
            cuts = [0, *starts[1:], max(len(line), len(header)) + 1]
            row = {n: line[cuts[i] : cuts[i + 1]].strip() for i, n in enumerate(names)}
        rows.append(row)
    return rows


def parse_df(text: str) -> list[dict[str, Any]]:
    """GNU `df --output=source,fstype,size,used,avail,target -B1`: one row per mounted filesystem."""
    rows: list[dict[str, Any]] = []
    for line in lines_of(text)[1:]:
        parts = line.split(maxsplit=5)
        if len(parts) != 6:
            continue
        source, fstype, size, used, avail, target = parts

        def num(v: str) -> int | None:  # "-" where a filesystem has no figure; no guessing at anything else
            # ASCII only: str.isdigit takes "²", which int() refuses; 20 digits is more bytes than exist
            return int(v) if v.isascii() and v.isdigit() and len(v) <= 20 else None

        rows.append({"filesystem": source, "type": fstype, "total": num(size), "used": num(used),
                     "available": num(avail), "mountpoint": target})  # fmt: skip
    return rows


MAX_OUTPUT_DEPTH = 64  # nesting a command's JSON may have: deeper is no docker or pvesh answer


def parse_output(kind: str, stdout: str, exit_status: int) -> Any:
    """A command's output as its tool declares it. The output is the node's (a guest's, through
    pct exec) to choose: anything but the expected JSON is a tool error, never an internal one."""
    try:
        if kind == "json":
            return jsonread.loads(stdout, MAX_OUTPUT_DEPTH) if stdout.strip() else None
        if kind == "json_lines":
            return [jsonread.loads(line, MAX_OUTPUT_DEPTH) for line in lines_of(stdout) if line.strip()]
    except json.JSONDecodeError as exc:
        raise ToolError(f"command output was not the expected JSON ({exc.msg})") from exc
    except ValueError as exc:  # NaN, 1e999, nesting too deep, an integer too long to convert
        raise ToolError(f"command output was not the expected JSON ({str(exc)[:80]})") from exc
    if kind == "table":
        return parse_table(stdout)
    if kind == "df":
        return parse_df(stdout)
    if kind == "exit_status":
        return {"exit_status": exit_status, "ok": exit_status == 0}
    return {"text": stdout}


KEEPALIVE_SECONDS = 15
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
KILL_AFTER_SECONDS = 2  # the node's `timeout` sends KILL this long after TERM: a command ignoring TERM ends too
ANSWER_GRACE_SECONDS = 1.0  # for the node's verdict (exit status or signal) to arrive after that KILL
TIMED_OUT = 124  # coreutils timeout's status when it had to stop the command
REOPEN_DELAY, REOPEN_MAX_DELAY = 0.02, 0.5  # between attempts at a session the node refused (doubling)


def node_timeout(seconds: float) -> list[str]:
    """The prefix a command runs under on the node: TERM once `seconds` (rounded up to a tenth)
    have passed, KILL 2 s later. Never 0, which would mean no limit."""
    tenths = max(1, math.ceil(seconds * 10 - 1e-6))
    duration = str(tenths // 10) if tenths % 10 == 0 else f"{tenths // 10}.{tenths % 10}"
    return ["timeout", "-k", str(KILL_AFTER_SECONDS), duration]


class _Share:
    """One caller's part of a node's sessions: at most `size` held at once; `users`: its commands holding or
    waiting for one (the share is forgotten at 0)."""

    __slots__ = ("slots", "users")

    def __init__(self, size: int) -> None:
        self.slots = asyncio.Semaphore(size)
        self.users = 0


class SshPool:
    """One authenticated connection per (cluster, node), reused; host keys pinned.

    A node whose SSH port accepts and never speaks must cost each call at most its
    own timeout: concurrent callers share one connection attempt per node (no
    storm of handshakes), but each waits for it only until its own deadline, and no
    lock is held across the handshake, so callers are never queued behind a
    previous caller's timeout. Other nodes have attempts of their own.

    Each pooled connection has `max_sessions` session slots (`slots`): sshd counts a
    session until its command has ended, so a slot is held until the node is known to
    have ended the command, or could have at the latest (`release_at`). One caller (principal) holds at
    most 1/CALLER_SHARE of them (`share`): its commands that hang on the node (df on a dead NFS mount), as
    many at once as there are sessions, would otherwise hold them all until their timeout, and every other
    principal's command to the node waited for a session and failed `busy`.
    """

    def __init__(self, clusters: dict[str, ClusterConfig]) -> None:
        self.clusters = clusters
        self._conns: dict[tuple[str, str], asyncssh.SSHClientConnection] = {}
        self._connecting: dict[tuple[str, str], asyncio.Future[asyncssh.SSHClientConnection]] = {}
        self._keys: dict[str, asyncssh.SSHKey] = {}
        self._slots: dict[tuple[str, str], tuple[asyncssh.SSHClientConnection, asyncio.Semaphore]] = {}
        self._held: set[asyncio.TimerHandle] = set()  # slots to free once a command abandoned mid-run has ended
        self._shares: dict[tuple[str, str, str], _Share] = {}  # (cluster, node, caller)

    def _config(self, cluster: str, node: str) -> tuple[SSHConfig, SSHNodeConfig]:
        # a gap in the gateway's configuration, not in the call's arguments (the cluster is a configured one):
        # nothing was sent, so an upstream_error, as for a node the gateway cannot reach
        cl = self.clusters.get(cluster)
        if cl is None or cl.ssh is None:
            raise UpstreamError(
                f"cluster {cluster} has no SSH access configured (clusters.{cluster}.ssh); nothing was sent",
                "unreachable",
            )
        n = cl.ssh.nodes.get(node)
        if n is None:
            raise UpstreamError(
                f"node {node} has no SSH access configured in cluster {cluster} (clusters.{cluster}.ssh.nodes); "
                "nothing was sent",
                "unreachable",
            )
        return cl.ssh, n

    async def get(self, cluster: str, node: str) -> tuple[asyncssh.SSHClientConnection, SSHConfig]:
        ssh, n = self._config(cluster, node)
        key = (cluster, node)
        conn = self._conns.get(key)
        if conn is not None and not conn.is_closed():
            return conn, ssh
        attempt = self._connecting.get(key)
        if attempt is None:
            attempt = asyncio.ensure_future(self._connect(key, ssh, n))
            self._connecting[key] = attempt
            attempt.add_done_callback(lambda f: self._settled(key, f))
        try:
            # shield: a caller giving up (its deadline, a cancelled request) does not abort the
            # attempt others are waiting on; the attempt has its own timeout
            conn = await asyncio.wait_for(asyncio.shield(attempt), ssh.command_timeout)
        except TimeoutError as exc:  # no connection yet, so no session: nothing was sent
            raise UpstreamError(
                f"SSH to node {node} failed (TimeoutError): no SSH connection within {ssh.command_timeout:g}s; "
                "nothing was sent",
                "unreachable",
            ) from exc
        except UpstreamError as exc:  # the shared attempt's failure, as this caller's own error
            raise UpstreamError(str(exc), exc.cause) from exc
        except ToolError as exc:
            raise ToolError(str(exc)) from exc
        return conn, ssh

    def slots(self, cluster: str, node: str, conn: asyncssh.SSHClientConnection, limit: int) -> asyncio.Semaphore:
        """The session slots of this connection (a new connection starts with all of them free)."""
        entry = self._slots.get((cluster, node))
        if entry is None or entry[0] is not conn:
            entry = (conn, asyncio.Semaphore(limit))
            self._slots[(cluster, node)] = entry
        return entry[1]

    def share(self, cluster: str, node: str, caller: str, size: int) -> _Share:
        """`caller`'s part of the node's sessions, for one more command (give it back with `unshare`)."""
        key = (cluster, node, caller)
        share = self._shares.get(key) or self._shares.setdefault(key, _Share(size))
        share.users += 1
        return share

    def unshare(self, cluster: str, node: str, caller: str, share: _Share, held: bool, when: float | None) -> None:
        """One command done with its caller's share: its slot (if `held`) freed now or at loop time `when`."""

        def done() -> None:
            if held:
                share.slots.release()
            share.users -= 1
            if not share.users and self._shares.get((cluster, node, caller)) is share:
                del self._shares[(cluster, node, caller)]

        self._later(when, done)

    def release_at(self, slots: asyncio.Semaphore, when: float | None) -> None:
        """Free one slot now (when=None or past), or at loop time `when`."""
        self._later(when, slots.release)

    def _later(self, when: float | None, fn: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        if when is None or when <= loop.time():
            fn()
            return

        def free() -> None:
            self._held.discard(handle)
            fn()

        handle = loop.call_at(when, free)
        self._held.add(handle)

    def _settled(self, key: tuple[str, str], attempt: asyncio.Future[asyncssh.SSHClientConnection]) -> None:
        if self._connecting.get(key) is attempt:
            del self._connecting[key]
        if not attempt.cancelled():
            attempt.exception()  # retrieved here, so a failure nobody waited for is not logged as lost

    async def _connect(self, key: tuple[str, str], ssh: SSHConfig, n: SSHNodeConfig) -> asyncssh.SSHClientConnection:
        """An authenticated connection, or UpstreamError: a session (and so a command) can only be opened on a
        connection `asyncssh.connect` returned, so a failure here provably sent nothing to run."""
        try:
            if str(ssh.key_file) not in self._keys:
                self._keys[str(ssh.key_file)] = await asyncio.to_thread(asyncssh.read_private_key, str(ssh.key_file))
        except (OSError, ValueError, asyncssh.Error) as exc:  # the type only: an exception's text may quote the key
            raise UpstreamError(
                f"the gateway's SSH key for cluster {key[0]} (ssh.key_file) could not be read "
                f"({type(exc).__name__}); nothing was sent",
                "auth",
            ) from exc
        try:
            pinned = asyncssh.import_public_key(n.host_key)
        except (ValueError, asyncssh.Error) as exc:
            raise UpstreamError(
                f"the pinned SSH host key of node {n.name} could not be read ({type(exc).__name__}); nothing was sent",
                "host_key",
            ) from exc
        try:
            conn = await asyncio.wait_for(
                asyncssh.connect(
                    n.host,
                    n.port,
                    username=ssh.user,
                    client_keys=[self._keys[str(ssh.key_file)]],
                    known_hosts=([pinned], [], []),  # only the pinned key; unknown or changed fails closed
                    agent_path=None,
                    password=None,
                    kbdint_auth=False,
                    preferred_auth="publickey",
                    config=None,
                    # the pin is the only trust: no X.509 CA from ~/.ssh/ca-bundle.crt or ~/.ssh/crt (with
                    # pyOpenSSL importable, a host cert from such a CA would pass with any key), no GSS/Kerberos
                    x509_trusted_certs=None,
                    x509_trusted_cert_paths=[],
                    gss_host=None,
                    # a peer gone without a word (an expired NAT entry) never reports closed: without
                    # keepalives every later call on the pooled connection would time out
                    keepalive_interval=KEEPALIVE_SECONDS,
                    keepalive_count_max=3,
                ),
                timeout=ssh.command_timeout,
            )
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            raise _not_connected(n, ssh, exc) from exc
        self._conns[key] = conn
        return conn

    def drop(self, cluster: str, node: str, conn: asyncssh.SSHClientConnection) -> None:
        """Forget (and abort) a connection that failed under a command, so the next call connects
        afresh. Another connection made meanwhile is left alone."""
        if self._conns.get((cluster, node)) is conn:
            del self._conns[(cluster, node)]
        if (entry := self._slots.get((cluster, node))) is not None and entry[0] is conn:
            del self._slots[(cluster, node)]
        conn.abort()

    async def close(self) -> None:
        for attempt in list(self._connecting.values()):
            attempt.cancel()
        for handle in self._held:
            handle.cancel()
        self._held.clear()
        self._slots.clear()
        self._shares.clear()
        for conn in self._conns.values():
            conn.close()
        for conn in self._conns.values():
            await conn.wait_closed()
        self._conns.clear()


def _not_connected(n: SSHNodeConfig, ssh: SSHConfig, exc: BaseException) -> UpstreamError:
    """Why the connection to node `n` was not made. In the gateway's own words: the node's (a DisconnectError's
    reason is the peer's text) and an exception's are never quoted."""
    name = type(exc).__name__
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return UpstreamError(
            f"SSH host key of node {n.name} does not match the pinned key; refusing (nothing was sent)", "host_key"
        )
    if isinstance(exc, asyncssh.PermissionDenied):
        return UpstreamError(
            f"SSH to node {n.name} failed ({name}): the node refused the gateway's SSH key for user {ssh.user}; "
            "nothing was sent",
            "auth",
        )
    if isinstance(exc, TimeoutError):
        why = f"no SSH connection within {ssh.command_timeout:g}s"
    elif isinstance(exc, OSError) and isinstance(exc.errno, int) and exc.errno > 0:
        why = f"{os.strerror(exc.errno).lower()} at {n.host}:{n.port}"  # "connection refused at 10.0.0.1:22"
    else:  # a name that does not resolve, a handshake the node broke off or could not agree on
        why = f"no SSH connection to {n.host}:{n.port}"
    return UpstreamError(f"SSH to node {n.name} failed ({name}): {why}; nothing was sent", "unreachable")


STDERR_KEPT = 65536  # of a command's stderr: only its first line is ever shown


async def _read_capped(stream: asyncssh.SSHReader[bytes], cap: int) -> bytes:
    out = bytearray()
    while chunk := await stream.read(65536):
        out += chunk
        if len(out) > cap:
            raise ToolError(f"command output exceeded the {cap}-byte cap")
    return bytes(out)


async def _read_head(stream: asyncssh.SSHReader[bytes], keep: int) -> bytes:
    """The first `keep` bytes of a stream, the rest read and dropped: stderr is for the error message,
    so a noisy one (a warning per container) neither fails a command that succeeded nor hides the
    message of one that failed. Reading on to its end stays bounded by the command's deadline."""
    out = bytearray()
    while chunk := await stream.read(65536):
        if len(out) < keep:
            out += chunk[: keep - len(out)]
    return bytes(out)


class _Session(asyncssh.SSHClientProcess[bytes]):
    """A command's session, whose caller may give up on it (its timeout, a cancelled call) while the
    node has yet to confirm the channel open. asyncssh opens such a channel when the confirmation
    comes and leaves it open, with no command: sshd counts it against MaxSessions for as long as the
    pooled connection lives, so a few stalls would leave the node refusing every call. Given up on,
    the session is closed as it opens, before its command is sent."""

    def __init__(self, given_up: asyncio.Event) -> None:
        super().__init__()
        self._given_up = given_up
        # the node confirmed the channel open and asyncssh sends the exec request next: from here on a
        # failure (its ChannelOpenError "Session request failed" included) may follow a command that ran
        self.opened = False

    def connection_made(self, chan: asyncssh.SSHClientChannel[bytes]) -> None:  # type: ignore[override]
        super().connection_made(chan)
        if self._given_up.is_set():
            chan.close()
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, "the call gave up on this session")
        self.opened = True


async def _open_session(
    conn: asyncssh.SSHClientConnection, command: str, session: _Session
) -> asyncssh.SSHClientProcess[bytes]:
    """conn.create_process(command, encoding=None, stdin=DEVNULL), with a session that can be given up on."""
    await conn.create_session(lambda: session, command, encoding=None)
    await session.redirect(asyncssh.DEVNULL, asyncssh.PIPE, asyncssh.PIPE)
    return session


def _discard(opening: asyncio.Future[asyncssh.SSHClientProcess[bytes]]) -> None:
    """A session opened for a call that gave up on it (its command sent before it did): closed."""
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


class SshRuntime:
    def __init__(self, clusters: dict[str, ClusterConfig], resolver: GuestLocator, allow: AllowList) -> None:
        self.pool = SshPool(clusters)
        self.resolver = resolver
        self.allow = allow

    async def node_for(self, tool: Tool, args: dict[str, Any], cluster: str) -> str:
        param = tool.spec["node"]
        locate = tool.spec.get("locate")
        if locate and locate in args:
            row = await self.resolver.guest(cluster, int(args[locate]))
            if row is None:
                raise ToolError(f"guest {args[locate]} not found in cluster {cluster}")
            allowed = tool.spec.get("types")
            if allowed and row.get("type") not in allowed:  # e.g. `pct exec` on a VM: refused, no connection
                what = "a container (lxc)" if row.get("type") == "lxc" else "a VM (qemu)"
                raise Refused(f"guest {args[locate]} is {what}; {tool.name} works on {'/'.join(allowed)} guests only")
            if args.get(param) not in (None, row.get("node")):
                raise ToolError(f"guest {args[locate]} is on node {row.get('node')}, not {args[param]}")
            return str(row["node"])
        if param not in args:
            raise ToolError(f"{param} is required")
        return str(args[param])

    def check(self, tool: Tool, arguments: dict[str, Any]) -> None:
        return None  # the command's arguments are checked against its allow-list as it is built (call)

    async def call(self, tool: Tool, arguments: dict[str, Any], ctx: CallContext) -> ToolOutput:
        argv = render_argv(tool, arguments)
        if self.allow.match(argv) != tool.name:  # the whole argv, before any connection
            raise Refused("refused: the command is not on the SSH allow-list")
        node = await self.node_for(tool, arguments, ctx.cluster)
        conn, ssh = await self.pool.get(ctx.cluster, node)
        slots = self.pool.slots(ctx.cluster, node, conn, ssh.max_sessions)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ssh.command_timeout  # waiting for a session counts against the timeout
        caller = CALLER.get()
        size = max(1, ssh.max_sessions // CALLER_SHARE)
        share = None if caller is None else self.pool.share(ctx.cluster, node, caller, size)
        mine = False  # this command holds one of its caller's slots
        try:
            async with asyncio.timeout_at(deadline):
                if share is not None:  # the caller's part first: its other commands queue there, not ahead of others
                    await share.slots.acquire()
                    mine = True
                await slots.acquire()  # cancelled or timed out while waiting: nothing acquired, nothing to free
        except BaseException as exc:
            if share is not None and caller is not None:
                self.pool.unshare(ctx.cluster, node, caller, share, mine, None)
            if not isinstance(exc, TimeoutError):
                raise
            if share is not None and not mine:  # no session, so no command: nothing was sent
                raise UpstreamError(
                    f"command on node {node} not started: this principal's other commands held its share ({size} of "
                    f"{ssh.max_sessions}) of the node's SSH sessions for {ssh.command_timeout:g}s; retry when one "
                    "has finished",
                    "busy",
                ) from exc
            raise UpstreamError(
                f"command on node {node} not started: all {ssh.max_sessions} SSH sessions to the node stayed busy "
                f"for {ssh.command_timeout:g}s (ssh.max_sessions)",
                "busy",
            ) from exc
        free_at: float | None = None  # when the node has surely ended the command; None: it has (or never began)
        try:
            if tool.effect != "read" and ctx.before_send is not None:  # still this replica's call to make
                await ctx.before_send()
            retry = REOPEN_DELAY
            try:
                while True:
                    wrapper = node_timeout(deadline - loop.time())
                    command = shlex.join([*wrapper, *argv])  # after the allow-list check: the node's limit
                    limit = float(wrapper[3])
                    sent = loop.time()
                    # the node stops it by then (TERM, KILL 2 s later); its verdict is awaited a moment longer
                    free_at = sent + limit + KILL_AFTER_SECONDS + ANSWER_GRACE_SECONDS
                    given_up = asyncio.Event()
                    session = _Session(given_up)
                    opening = asyncio.ensure_future(_open_session(conn, command, session))
                    try:
                        try:
                            async with asyncio.timeout_at(free_at):
                                # shielded: cancelled while awaiting the node's "open", asyncssh would leave
                                # the channel open for ever once it came (see _Session)
                                proc = await asyncio.shield(opening)
                        except (TimeoutError, asyncio.CancelledError):
                            given_up.set()
                            opening.add_done_callback(_discard)
                            raise
                        break
                    except asyncssh.ChannelOpenError as exc:
                        if session.opened:  # the exec request went out (refused, or unanswered): it may have run
                            raise
                        free_at = None  # no session, nothing ran: safe to ask again
                        if conn.is_closed():  # the connection is gone (sshd restarted, node rebooted): not "busy"
                            self.pool.drop(ctx.cluster, node, conn)
                            raise UpstreamError(
                                f"SSH connection to node {node} was lost before the command started; nothing ran",
                                "unreachable",
                            ) from exc
                        # sshd frees a session a moment after its channel closed, so a session opened just
                        # after another's end may be refused: asked again until the deadline
                        if loop.time() + retry >= deadline:
                            raise UpstreamError(
                                f"node {node} refused a new SSH session ({_CONTROL.sub('?', exc.reason)[:80]}) "
                                f"for {ssh.command_timeout:g}s: is ssh.max_sessions ({ssh.max_sessions}) above "
                                "the node's sshd MaxSessions?",
                                "busy",
                            ) from exc
                        await asyncio.sleep(retry)
                        retry = min(2 * retry, REOPEN_MAX_DELAY)
                async with asyncio.timeout_at(free_at):
                    try:
                        if ctx.on_dispatch is not None:  # the command runs on the node: durable before we wait
                            await ctx.on_dispatch({"node": node, "argv": argv, "wrapper": wrapper})
                        stdout, stderr = await asyncio.gather(
                            _read_capped(proc.stdout, ssh.max_output_bytes), _read_head(proc.stderr, STDERR_KEPT)
                        )
                        await proc.wait()
                        free_at = None  # its exit reported: the node has ended it
                    finally:
                        proc.close()
            except TimeoutError as exc:
                # not dropped: other calls' commands share the connection (a dead one: the keepalive ends it)
                raise ToolError(
                    f"command on node {node} timed out after {ssh.command_timeout:g}s and the node did not answer"
                ) from exc
            except (OSError, asyncssh.Error) as exc:
                if isinstance(exc, OSError | asyncssh.ConnectionLost | asyncssh.DisconnectError) or conn.is_closed():
                    self.pool.drop(ctx.cluster, node, conn)  # the connection is gone: the next call connects afresh
                raise ToolError(f"SSH exec on node {node} failed ({type(exc).__name__})") from exc
        finally:
            self.pool.release_at(slots, free_at)
            if share is not None and caller is not None:
                self.pool.unshare(ctx.cluster, node, caller, share, True, free_at)
        signal = proc.exit_signal[0] if proc.exit_signal else None
        status = proc.exit_status if proc.exit_status is not None else -1
        # `timeout` stopped it: 124 after TERM; KILL (signal, or 137 from a shell) when TERM was ignored. Only
        # once the limit had passed: a command ending sooner with 124 or 137 said so itself
        if loop.time() - sent >= limit and (status in (TIMED_OUT, 128 + 9) or signal == "KILL"):
            how = "stopped" if status == TIMED_OUT else "killed (it ignored TERM)"
            raise CommandFailed(
                f"command on node {node} timed out after {ssh.command_timeout:g}s and was {how} on the node", status
            )
        if signal is not None:
            raise CommandFailed(f"command on node {node} was ended by signal {_CONTROL.sub('?', signal)[:32]}", status)
        ok = tool.spec.get("ok_exit") or [0]
        if status not in ok:
            # the node's (a guest's) words: no terminal escapes or control bytes into the reply or audit
            first = _CONTROL.sub("?", stderr.decode(errors="replace")).strip().splitlines()[:1]
            raise CommandFailed(f"command exited {status} on node {node}: {(first[0] if first else '')[:300]}", status)
        return ToolOutput(data=parse_output(tool.spec["parse"], stdout.decode(errors="replace"), status))

    async def close(self) -> None:
        await self.pool.close()
