"""A real, throw-away PostgreSQL server for the tests: initdb in a temp folder, loopback only.

`start_postgres()` runs the machine's `initdb` and `postgres` (PostgreSQL 15 from Debian's
package; `scripts/provision-postgres.sh` installs it when missing), listening on 127.0.0.1 on a
free port, with its socket in the same temp folder. initdb refuses to run as root, so as root
the cluster belongs to an unprivileged account (`postgres`, which Debian's package creates, or
else `nobody`).

No orphans: the postmaster gets PR_SET_PDEATHSIG(SIGINT), so if the test process dies (even by
SIGKILL) the kernel asks it for a fast shutdown, and its backends die with it. `stop()` does the
same on purpose and removes the folder; only a killed run leaves its temp folder behind
(/tmp/pvegate-pg-*, a few tens of MB).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from gateway.core import processes
from gateway.dev.procs import StartFailed, spawn_logged, start_on_free_port

USER = "pvegate"  # the database superuser initdb creates (trust auth on loopback only)
DATABASE = "postgres"


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL binaries are not installed (run `make tools`)."""


def bin_dir() -> Path:
    """Where initdb and postgres are: on PATH, else Debian's /usr/lib/postgresql/<newest>/bin."""
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if versions:
        return Path(versions[-1]).parent
    raise PostgresUnavailable(
        "PostgreSQL is not installed (no initdb on PATH or in /usr/lib/postgresql/*/bin): run `make tools`"
    )


def _owner() -> pwd.struct_passwd | None:
    """The account to run the server as: None when we are not root (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise PostgresUnavailable("running as root and neither a 'postgres' nor a 'nobody' account exists")


@dataclass
class PostgresServer:
    root: Path
    port: int
    proc: subprocess.Popen[bytes]
    started_in: float  # seconds from initdb to accepting connections
    durable: bool = False  # fsync and synchronous commit on, as in production (benchmarks)

    @property
    def dsn(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    async def create_database(self, prefix: str = "t_") -> str:
        """A new, empty database on this server (a fresh name each call): its URL."""
        import asyncpg

        name = prefix + uuid.uuid4().hex[:16]
        admin = await asyncpg.connect(self.dsn)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        return self.dsn.rsplit("/", 1)[0] + "/" + name

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.root, ignore_errors=True)

    def halt(self) -> None:
        """Fast shutdown (clients are disconnected), keeping the cluster for `resume()`."""
        processes.stop(self.proc, grace=20, sig=signal.SIGINT)

    def resume(self, timeout: float = 60.0) -> None:
        """Start the halted cluster again on the same port (a database restart, as clients see it)."""
        if self.proc.poll() is None:
            return
        self.proc = _spawn(self.root, self.port, self.durable)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None and not _ready(self.root / "data"):
            time.sleep(0.02)
        if self.proc.poll() is not None or not _ready(self.root / "data"):
            raise PostgresUnavailable(f"postgres did not start again within {timeout:.0f}s:\n{self.log()[-2000:]}")

    def log(self) -> str:
        return _read(self.root / "server.log")


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")
    return ""


def _ready(data: Path) -> bool:
    """postmaster.pid's 8th line says `ready` once the server accepts connections (PG >= 10)."""
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
    except OSError:
        return False
    return len(lines) >= 8 and lines[7].strip() == "ready"


def _spawn(root: Path, port: int, durable: bool = False) -> subprocess.Popen[bytes]:
    """The postmaster of the cluster in root/data, on 127.0.0.1:port, as the cluster's owner."""
    owner = _owner()
    uid = gid = None
    groups: list[int] | None = None
    if owner is not None:
        uid, gid, groups = owner.pw_uid, owner.pw_gid, []
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}
    argv = [str(bin_dir() / "postgres"), "-D", str(root / "data"), "-h", "127.0.0.1", "-p", str(port)]
    argv += ["-k", str(root)]  # the Unix socket stays in the temp folder
    # fsync off for tests: a throw-away cluster, durability is not what is tested there;
    # a benchmark (durable) measures what production pays: fsync and synchronous_commit on
    settings = ["max_connections=200"]
    if not durable:
        settings += ["fsync=off", "synchronous_commit=off", "full_page_writes=off"]
    for setting in settings:
        argv += ["-c", setting]
    return spawn_logged(
        argv,
        log=root / "server.log",
        cwd=root,
        env=env,
        death_signal=signal.SIGINT,  # set after the switch to the owner's uid
        user=uid,
        group=gid,
        extra_groups=groups,
    )


def start_postgres(timeout: float = 60.0, durable: bool = False) -> PostgresServer:
    """initdb a new cluster in a temp folder and start it on 127.0.0.1:<free port>."""
    t0 = time.monotonic()
    bindir = bin_dir()
    owner = _owner()
    root = Path(tempfile.mkdtemp(prefix="pvegate-pg-"))
    data = root / "data"
    uid = gid = None
    groups: list[int] | None = None
    if owner is not None:
        os.chown(root, owner.pw_uid, owner.pw_gid)
        uid, gid, groups = owner.pw_uid, owner.pw_gid, []
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}
    try:
        subprocess.run(
            [str(bindir / "initdb"), "-D", str(data), "-U", USER, "-A", "trust", "-E", "UTF8", "--no-sync"],
            cwd=root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            check=True,
            timeout=timeout,
            user=uid,
            group=gid,
            extra_groups=groups,
        )
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(root, ignore_errors=True)
        raise PostgresUnavailable(f"initdb failed: {exc.stderr.decode(errors='replace').strip()}") from exc
    try:
        port, proc = start_on_free_port(
            "postgres",
            lambda port: _spawn(root, port, durable),
            lambda _port: _ready(data),
            lambda: _read(root / "server.log"),
            attempts=5,
            timeout=timeout,
            poll=0.02,
            bind_errors=("could not bind", "Address already in use"),
        )
    except StartFailed as exc:
        shutil.rmtree(root, ignore_errors=True)
        raise PostgresUnavailable(str(exc)) from None
    return PostgresServer(root, port, proc, time.monotonic() - t0, durable)
