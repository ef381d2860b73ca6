"""The managed OPA sidecar: a real `opa run --server` subprocess on a private Unix socket.

The gateway never decides anything itself; this module only starts, watches and
stops the process that does. If OPA dies, calls fail closed until the supervisor
has restarted it (with backoff).

OPA's REST API can read the policy and its data and rewrite policies and data loaded
from files (`PUT /v1/data/data/bindings` would rewrite who may do what). The managed OPA
therefore listens on no TCP port at all: its only listener is a Unix socket (mode 0600)
in a directory of mode 0700 owned by the gateway's user, so only that user (and root)
can connect. That also keeps out what a loopback port cannot: other containers in the
same network namespace, a browser's DNS rebinding, and server-side request forgery
through any local HTTP client. It replaces the bearer token and `system.authz` policy a
managed OPA used to run with, which cost OPA ~0.23 ms per decision (its authorizer
compiles a query and converts the whole request per call; docs/performance.md) and
protected nothing more: a process of the same user could read the token from OPA's
environment. An external OPA keeps the token guard (docs/opa.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import yaml

from gateway.core import processes, yamlread
from gateway.core.config import ConfigError, SecretRef
from gateway.core.keys import opa_keys_problems
from gateway.policy import optimized
from gateway.policy.bundle_status import (
    LOG_MASK_PATH,
    BundleFileServer,
    activations_seen,
    log_mask_answer,
    require_log_mask,
)
from gateway.policy.bundle_status import MASKED_PATH as MASKED_PATH  # re-exported: bundle build reads it here
from gateway.policy.bundle_status import masks_arguments as masks_arguments  # re-exported likewise
from gateway.policy.errors import OPAUnavailable as OPAUnavailable  # re-exported: its callers import it here
from gateway.policy.opa_address import httpx_client, unix_address
from gateway.policy.revision import files_revision, policy_files

log = logging.getLogger("pvegate.opa")

OPA_VERSION = "1.22.3"
REPO_ROOT = Path(__file__).resolve().parents[2]


def find_opa(explicit: Path | None = None) -> Path:
    """The pinned opa binary: explicit path, $PVEGATE_OPA, the repo's .tools/bin, then PATH. An
    explicit one (opa.binary, or $PVEGATE_OPA when set) that is not there is an error, never a quiet
    fall back to another opa."""
    if explicit is not None:
        if explicit.is_file() and os.access(explicit, os.X_OK):
            return explicit
        raise OPAUnavailable(f"opa.binary {explicit} is not an executable file")
    if os.environ.get("PVEGATE_OPA"):  # set but empty: as if unset
        named = Path(os.environ["PVEGATE_OPA"])
        if named.is_file() and os.access(named, os.X_OK):
            return named
        raise OPAUnavailable(f"PVEGATE_OPA {named} is not an executable file")
    candidates = [
        REPO_ROOT / ".tools" / "bin" / "opa",
        Path(p) if (p := shutil.which("opa")) else None,
    ]
    for c in candidates:
        if c is not None and c.is_file() and os.access(c, os.X_OK):
            return c
    raise OPAUnavailable(
        f"no opa binary found: run `make tools` (builds OPA v{OPA_VERSION} with go install) or set PVEGATE_OPA"
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running(pid: int) -> bool:
    """Whether pid is a process that has not exited (a zombie has: its parent has yet to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# the environment variable holding an external OPA's API token: read by opa_authz/authz.rego in
# that OPA's environment (docker/compose.yaml), and by CLI commands pointed at a running OPA
TOKEN_ENV = "PVEGATE_OPA_TOKEN"  # noqa: S105 - the name of a variable, not a secret

AUTHZ_POLICY = Path(__file__).resolve().parent / "opa_authz" / "system" / "authz" / "authz.rego"

# all OPA may see of the gateway's environment: the system basics and the Go runtime's knobs
# (named one by one: a GO prefix would also pass e.g. GOOGLE_APPLICATION_CREDENTIALS)
_PASSED_ENV = frozenset(
    {"PATH", "HOME", "TMPDIR", "TZ", "LANG", "LC_ALL", "SSL_CERT_FILE", "SSL_CERT_DIR"}
    | {"GOGC", "GOMAXPROCS", "GOMEMLIMIT", "GODEBUG", "GOTRACEBACK"}
)


def client_token(sidecar: OPASidecar | None) -> str | None:
    """The API token to send: none to the sidecar (its socket is the guard), $PVEGATE_OPA_TOKEN to an
    OPA started elsewhere."""
    return None if sidecar is not None else os.environ.get(TOKEN_ENV)


def free_port() -> int:
    """A free loopback TCP port (the watched bundle's file server, tests and benchmarks)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _socket_dir_name() -> Path:
    # unguessable, and short: a socket's path must fit in sun_path (108 bytes), so a long $TMPDIR
    # gives way to /tmp
    base = Path(tempfile.gettempdir())
    if len(str(base)) > 60:
        base = Path("/tmp")  # noqa: S108 - a private, unguessable directory is made in it
    return base / f"pvegate-opa-{secrets.token_hex(8)}"


def _with_secrets(doc: Any) -> Any:
    """`doc` with each SecretRef (a service credential given as {file:} or {env:}) read: for OPA's
    private config file alone. OPAUnavailable when one cannot be read."""
    if isinstance(doc, SecretRef):
        try:
            return doc.read()
        except ConfigError as exc:
            raise OPAUnavailable(str(exc)) from None
    if isinstance(doc, dict):
        return {k: _with_secrets(v) for k, v in doc.items()}
    return doc


def check_yaml_data(directories: tuple[Path, ...]) -> None:
    """Refuse (OPAUnavailable) policy data that OPA would read otherwise than written: it keeps
    the last of a key given twice without a word, so a second `bindings:` in data.yaml would
    quietly replace the first (core/yamlread.py). A file that is not YAML at all OPA reports; one
    nested too deeply to read here is refused."""
    for d in directories:
        for path in sorted(policy_files(d) if d.is_dir() else [d] if d.is_file() else []):
            if path.suffix not in (".yaml", ".yml", ".json"):
                continue
            try:
                text = path.read_text()
                yamlread.load_json(text) if path.suffix == ".json" else yamlread.load(text)
            except yamlread.YamlProblems as exc:
                raise OPAUnavailable(f"policy data {path}: {'; '.join(exc.problems)}") from None
            except RecursionError:
                # a structure nested deeper than Python's stack: unreadable here, so unchecked
                raise OPAUnavailable(
                    f"policy data {path}: nested too deeply to read (no policy data needs that depth)"
                ) from None
            except (OSError, UnicodeDecodeError, yaml.YAMLError, json.JSONDecodeError):
                continue  # OPA's own start reports it, as for any unreadable policy file


def check_keys(keys: dict[str, Any]) -> None:
    """Refuse (OPAUnavailable) an `opa.keys` entry OPA would verify bundles with unsafely: an HMAC
    algorithm (OPA takes the key's text as the shared secret: anyone who can read the public key
    could sign a bundle it activates), a private key, or no PEM public key of its algorithm's kind
    (core/keys.py). The configuration's load refuses them first; this guards every other caller."""
    if problems := opa_keys_problems(keys):
        raise OPAUnavailable(problems[0])


class PidRecord(NamedTuple):
    """What the pid file records about a managed OPA: `<OPA pid> <gateway pid> <socket dir> <config dir>`.

    A file written before OPA had a socket has no directories, one from before the config
    directory was recorded has no config directory: those are None."""

    pid: int
    owner: int  # the gateway that started it
    socket_dir: Path | None
    config_dir: Path | None


def _recorded_dir(fields: list[str], index: int) -> Path | None:
    # only an absolute path is a directory we wrote (a relative one would be taken from the cwd)
    return Path(fields[index]) if len(fields) > index and os.path.isabs(fields[index]) else None


def _recorded_opa(cmdline: list[bytes], socket_dir: Path | None) -> bool:
    """Whether `cmdline` is the managed OPA a pid record names: an `opa --server` listening on the
    record's socket. A pid outlives its process in the file (a gateway killed, the host rebooted)
    and may since name another gateway's OPA: its socket, in a directory of random name, is not
    the one recorded. (A record from before the socket has no directory to compare.)"""
    if not cmdline or Path(cmdline[0].decode(errors="replace")).name != "opa" or b"--server" not in cmdline:
        return False
    if socket_dir is None:
        return True
    return os.fsencode(unix_address(str(socket_dir / "opa.sock"))) in cmdline


def private_dir(path: Path) -> None:
    """Create `path` with mode 0700, or accept it only if it is already ours and private.

    The name is chosen once per sidecar and reused across restarts (clients keep the address),
    so after a stop another user could have created it in a shared /tmp: refuse that."""
    try:
        path.mkdir(mode=0o700)
        return
    except FileExistsError:
        pass
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise OPAUnavailable(
            f"{path} exists and is not a private directory of this user: refusing to put OPA's socket in it"
        )


@dataclass
class OPASidecar:
    """One managed OPA server process."""

    policies: tuple[Path, ...] = ()
    bundle: Path | None = None
    verification_key: Path | None = None
    binary: Path | None = None
    log_file: Path | None = None
    pid_file: Path | None = None  # lets a restarted gateway reap the OPA a killed one left behind
    decision_logs: bool = False
    # OPA's own configuration sections, passed through (docs/opa.md): `services` and `bundles`
    # make OPA follow a bundle service; `keys` verify its signatures; `decision_logs_upload`
    # is OPA's `decision_logs` section (e.g. {service: siem}), masked by system.log.mask
    services: dict[str, Any] = field(default_factory=dict)
    bundles: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, Any] = field(default_factory=dict)
    decision_logs_upload: dict[str, Any] | None = None
    # serve `bundle` to OPA's bundle plugin from loopback (to it alone: a bearer token and a Host
    # check, BundleFileServer), so a new file activates without a restart
    watch_bundle: bool = False
    bundle_poll_seconds: int = 5
    # Go's collector at its default (100) costs OPA ~15 % of its CPU and most of its
    # eval-time p99 under load here; 400 trades ~25 MB of heap for that (docs/performance.md).
    # A GOGC already in the environment wins.
    gogc: int = 400
    # OPA's only listener is the socket `opa.sock` in this private directory (module docstring)
    socket_dir: Path = field(default_factory=_socket_dir_name)
    process: subprocess.Popen[bytes] | None = None
    # a policy directory is loaded partially evaluated with its data (policy/optimized.py)
    optimize: bool = True
    restarts: int = 0
    generation: int = 0  # starts so far, counted as each begins
    # with a policy directory: what "revision" means is the content digest of the policy files
    # this OPA loaded at its last (re)start (with a bundle, OPA reports the bundle's revision)
    policy_revision: str | None = None
    _log_handle: object | None = field(default=None, repr=False)
    _log_start: int = field(default=0, repr=False)  # where this run's output begins in log_file
    _file_server: BundleFileServer | None = field(default=None, repr=False)
    _config_dir: str | None = field(default=None, repr=False)
    _optimized: Path | None = field(default=None, repr=False)  # this start's optimised policy directory
    _owns_socket_dir: bool = field(default=False, repr=False)  # made or verified by start(): ours to remove

    @property
    def bundle_mode(self) -> bool:
        """OPA serves bundles (a file or a bundle service): their roots are write-protected."""
        return self.bundle is not None or bool(self.bundles)

    @property
    def source(self) -> str:
        """Where the policy comes from, as PolicyStatus names it."""
        if self.bundles:
            return "bundle_service"
        if self.bundle is not None:
            return "bundle_file_watch" if self.watch_bundle else "bundle"
        return "policies"

    def opa_config(self) -> dict[str, Any]:
        """OPA's configuration file: the passed-through sections, and the watched bundle file's service.

        With a watched bundle it holds that service's bearer token: written only by `_write_config`
        (each call issues a new token, the previous one stops working), never logged."""
        services = _with_secrets(self.services)
        bundles = dict(self.bundles)
        keys = dict(self.keys)
        if self.bundle is not None and self.watch_bundle:
            if self._file_server is None:
                self._file_server = BundleFileServer(self.bundle).start()
            # the file server answers only this OPA: a fresh bearer token for each start, given to
            # OPA in this (0600) file alone; without it, or with another Host, the server refuses
            self._file_server.new_token()
            services["pvegate-bundle-file"] = {
                "url": self._file_server.url,
                "credentials": self._file_server.credentials(),
            }
            delay = max(1, self.bundle_poll_seconds)
            bundle: dict[str, Any] = {
                "service": "pvegate-bundle-file",
                "resource": BundleFileServer.resource,
                "polling": {"min_delay_seconds": delay, "max_delay_seconds": delay},
            }
            if self.verification_key is not None:
                keys["pvegate-bundle-file"] = {"key": self.verification_key.read_text(), "algorithm": "RS256"}
                bundle["signing"] = {"keyid": "pvegate-bundle-file"}
            bundles["pvegate"] = bundle
        cfg: dict[str, Any] = {"services": services, "bundles": bundles, "keys": keys}
        if self.decision_logs_upload is not None:
            cfg["decision_logs"] = dict(self.decision_logs_upload)
        # the status plugin feeds GET /v1/status: active revision, activation time, last bundle error
        cfg["status"] = {"prometheus": True}
        return {k: v for k, v in cfg.items() if v}

    def _write_config(self) -> Path:
        # it may hold service credentials: a private directory, removed in stop()
        if self._config_dir is None:
            self._config_dir = tempfile.mkdtemp(prefix="pvegate-opa-")
        path = Path(self._config_dir) / "opa-config.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.opa_config(), f)
        return path

    @property
    def socket_path(self) -> Path:
        return self.socket_dir / "opa.sock"

    @property
    def url(self) -> str:
        """The address clients ask (`unix://...`; gateway/policy/opa_address.py reaches it)."""
        return unix_address(str(self.socket_path))

    def client(self, **kwargs: Any) -> httpx.Client:
        """An httpx client for this OPA's API (paths relative to it)."""
        return httpx_client(self.url, **kwargs)

    def command(self) -> list[str]:
        cmd = [
            str(find_opa(self.binary)),
            "run",
            "--server",
            "--addr",
            self.url,
            "--unix-socket-perm",
            "600",
            "--log-level",
            "error",
            "--skip-version-check",
            # policies and data only change with a restart or bundle: trade store writes for reads
            "--optimize-store-for-read-speed",
        ]
        if self.decision_logs:
            # Console decision logs give every answer a decision_id (the audit keeps it);
            # system.log.mask in policies/ keeps tool arguments out of them.
            cmd += ["--set", "decision_logs.console=true"]
        if self._config_dir is not None:
            cmd += ["--config-file", str(Path(self._config_dir) / "opa-config.json")]
        if self.bundle_mode:
            # with --verification-key every path given is verified as a bundle; a bundle's own
            # system.authz (`pvegate bundle build` adds it for an external OPA) is inert here
            if self.bundle is not None and not self.watch_bundle:  # loaded once: a bad one stops the start
                cmd += ["--bundle", str(self.bundle)]
                if self.verification_key is not None:
                    cmd += ["--verification-key", str(self.verification_key)]
        else:
            # a policy directory also holds tests, golden cases and lint config: not policy
            cmd += ["--ignore", "*_test.rego", "--ignore", "golden", "--ignore", ".*"]
            cmd += [str(self._optimized)] if self._optimized is not None else [str(p) for p in self.policies]
        return cmd

    def environment(self) -> dict[str, str]:
        """OPA's environment: the Go runtime's settings and little else.

        The gateway's own environment may hold secrets (`{env: NAME}` references for the
        Proxmox token and others), and a policy can read its process environment through
        `opa.runtime().env`: none of it is passed on.
        """
        env = {k: v for k, v in os.environ.items() if k in _PASSED_ENV}
        env.setdefault("GOGC", str(self.gogc))
        return env

    def _pid_record(self) -> PidRecord | None:
        """The pid file's record (PidRecord), or None if absent or unreadable.

        Files of 2 fields (from before the socket) and 3 (before the config directory) are read
        too. More than 4 fields means a path held whitespace: which field is which is unknown, so
        neither directory is taken from it (its OPA is still reaped)."""
        if self.pid_file is None:
            return None
        try:
            fields = self.pid_file.read_text().split()
            pid, owner = int(fields[0]), int(fields[1])
        except (OSError, ValueError, IndexError):
            return None
        if len(fields) > 4:
            return PidRecord(pid, owner, None, None)
        return PidRecord(pid, owner, _recorded_dir(fields, 2), _recorded_dir(fields, 3))

    def reap_stale(self) -> None:
        """Clear up after a previous gateway killed without clean-up: stop the OPA server it left
        running, and remove that OPA's socket directory (left behind when OPA was killed too) and its
        config directory (which can hold service credentials and the bundle file server's token)."""
        record = self._pid_record()
        if record is None:
            return
        pid, owner, old_socket_dir, old_config_dir = record
        if _alive(owner):
            return  # its gateway still runs (another instance on this state dir): not ours to stop
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            cmdline = []  # gone, or not readable: nothing to stop
        if _recorded_opa(cmdline, old_socket_dir):
            log.warning("stopping OPA pid %d left behind by a previous gateway", pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):  # gone, or another user's
                os.kill(pid, signal.SIGTERM)
            # let it finish shutting down (it unlinks its socket) before its directory goes
            deadline = time.monotonic() + 5
            while _running(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
        self._remove_stale_dir(old_socket_dir)
        self._remove_stale_dir(old_config_dir)

    def _remove_stale_dir(self, path: Path | None) -> None:
        """Remove a directory a previous gateway's OPA left behind, only if it is one this module makes
        (a pvegate-opa-* name), a directory and not a link, owned by us, and not this sidecar's own."""
        if path is None or not path.name.startswith("pvegate-opa-"):
            return
        own = [self.socket_dir] + ([Path(self._config_dir)] if self._config_dir is not None else [])
        if path in own:
            return
        with contextlib.suppress(OSError):
            st = path.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():  # a link, a file, not ours
                return
            for mine in own:  # the same directory under another name
                with contextlib.suppress(OSError):
                    if os.path.samestat(st, mine.lstat()):
                        return
            shutil.rmtree(path, ignore_errors=True)

    def _claim_pid_file(self) -> None:
        """Record our OPA, unless a living process other than us already owns the file: a second
        process on the same state dir must not make the first one's OPA unreapable."""
        if self.pid_file is None or self.process is None:
            return
        record = self._pid_record()
        if record is not None and record.owner != os.getpid() and _alive(record.owner):
            return
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        # the config directory is made (_write_config) before OPA is started and this is written
        config_dir = f" {self._config_dir}" if self._config_dir is not None else ""
        self.pid_file.write_text(f"{self.process.pid} {os.getpid()} {self.socket_dir}{config_dir}\n")

    def _release_pid_file(self) -> None:
        """Remove the pid file only if it records our own OPA."""
        record = self._pid_record()
        if record is not None and self.process is not None and record[:2] == (self.process.pid, os.getpid()):
            self.pid_file.unlink(missing_ok=True)  # type: ignore[union-attr]

    def revision_key(self) -> str:
        """Identifies what this OPA loaded: the policy files' revision and which start loaded them."""
        return f"{self.policy_revision}#{self.generation}"

    def start(self, timeout: float = 20.0) -> None:
        self.generation += 1  # before OPA answers: a decision of the new process never passes for the old
        self.reap_stale()
        private_dir(self.socket_dir)
        self._owns_socket_dir = True
        try:
            self._launch(timeout)
        except BaseException:  # no opa binary, a bad policy, a start timeout, an interrupt: nothing left behind
            self.stop()  # its log handle, config and socket directory too, not just the process
            raise

    def _launch(self, timeout: float) -> None:
        # a socket left by an OPA that was killed would make the new one's bind fail
        self.socket_path.unlink(missing_ok=True)
        check_keys(self.keys)
        self._write_config()
        if self.bundle is None:
            check_yaml_data(self.policies)
            self.policy_revision = files_revision(self.policies)
            self._build_optimized()
        cmd = self.command()
        out: int | object = subprocess.DEVNULL
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log_handle = open(self.log_file, "ab")
            self._log_start = self._log_handle.tell()  # type: ignore[attr-defined]
            out = self._log_handle
        log.info("starting OPA sidecar: %s", " ".join(cmd))
        self.process = subprocess.Popen(cmd, stdout=out, stderr=out, env=self.environment(), start_new_session=True)  # type: ignore[arg-type]
        self._claim_pid_file()
        self.wait_healthy(timeout)
        if self.decision_logs or self.decision_logs_upload is not None:
            self.check_log_mask()

    def check_log_mask(self) -> None:
        """With decision logs on (console or upload), refuse (OPAUnavailable; start() then stops OPA) a
        loaded policy whose `data.system.log.mask` does not remove the tool arguments: OPA would log
        every call's arguments, passwords included. Asked of the running OPA, so a bundle's policy
        counts as much as a directory's."""
        activation = activations_seen(self.url)  # before the query: an activation during it is asked again
        try:
            with self.client(timeout=10.0) as client:
                masked = log_mask_answer(client.get(LOG_MASK_PATH))
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise OPAUnavailable(f"cannot read data.system.log.mask from OPA: {type(exc).__name__}") from None
        if not masked:
            setting = "opa.decision_logs" if self.decision_logs else "opa.decision_logs_upload"
            raise OPAUnavailable(
                f"{setting} is on but the policy's data.system.log.mask (package system.log, rule mask; "
                f'policies/system/log/log.rego) does not hold "{MASKED_PATH}": OPA would log every '
                "call's tool arguments, passwords included; not starting"
            )
        # a bundle OPA activates later has its mask asked again (bundle_status.LogMaskGuard)
        require_log_mask(self.url, activation)

    def _build_optimized(self) -> None:
        """The policy directory partially evaluated with its data, from the files as they are now."""
        self._optimized = None
        if not self.optimize or self.bundle_mode:
            return
        started = time.monotonic()
        try:
            self._optimized = optimized.build_cached(find_opa(self.binary), self.policies)
        except optimized.OptimizeError as exc:
            # the plain directory decides the same, only slower
            log.warning("loading the policy directory without partial evaluation: %s", exc)
            return
        log.info("policy partially evaluated with its data in %.2f s", time.monotonic() - started)

    def wait_healthy(self, timeout: float) -> None:
        """Return once OPA answers its health check; OPAUnavailable otherwise (start() then stops it)."""
        deadline = time.monotonic() + timeout
        last = "not started"
        with self.client(timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    status = self.process.returncode
                    raise OPAUnavailable(f"OPA exited with status {status} during start-up{self._logged_reason()}")
                try:
                    r = client.get("/health?bundles")
                    if r.status_code == 200:
                        return
                    last = f"health {r.status_code}"
                except httpx.HTTPError as exc:
                    last = type(exc).__name__
                time.sleep(0.05)
        raise OPAUnavailable(f"OPA did not become healthy within {timeout}s ({last}){self._logged_reason()}")

    def _logged_reason(self) -> str:
        """': <OPA's last error line>' from this run's part of the log file, or ''.

        OPA says why it refuses to start (e.g. `load error: bundle ...: digest mismatch`)
        on stderr, which goes to the log file; without it the operator sees only a status.
        """
        if self.log_file is None:
            return ""
        try:
            with open(self.log_file, "rb") as f:
                f.seek(max(self._log_start, f.seek(0, os.SEEK_END) - 65536))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if not lines:
            return ""
        reason = lines[-1].removeprefix("error: ")
        return f": {reason[:500]} (log: {self.log_file})"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        self._release_pid_file()
        p, self.process = self.process, None
        processes.stop(p, grace=5)
        if self._log_handle is not None:
            with contextlib.suppress(Exception):
                self._log_handle.close()  # type: ignore[attr-defined]
            self._log_handle = None
        if self._file_server is not None:
            self._file_server.stop()
            self._file_server = None
        if self._config_dir is not None:
            shutil.rmtree(self._config_dir, ignore_errors=True)
            self._config_dir = None
        # the next start() makes it again under the same name: the address stays the same
        if self._owns_socket_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            self._owns_socket_dir = False

    async def supervise(self, max_backoff: float = 5.0) -> None:
        """Restart OPA with exponential backoff whenever it dies; calls deny meanwhile."""
        backoff = 0.1
        while True:
            await asyncio.sleep(0.1)
            if self.alive():
                backoff = 0.1
                continue
            log.error("OPA sidecar is down; calls are denied until it is back (retry in %.1fs)", backoff)
            await asyncio.sleep(backoff)
            try:
                await asyncio.to_thread(self.start)
                self.restarts += 1
                log.warning("OPA sidecar restarted (restart #%d)", self.restarts)
            except Exception as exc:  # any failure (an OSError too) is retried: it never ends supervision
                reason = exc if isinstance(exc, OPAUnavailable) else f"{type(exc).__name__}: {exc}"
                log.error("OPA restart failed: %s", reason)
                backoff = min(backoff * 2, max_backoff)
