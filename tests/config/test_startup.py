"""A gateway that cannot start says why in one line: `pvegate serve` run as a subprocess, real OPA.

The state-directory case: these tests run as root, and root ignores permission bits, so a
chmod'ed directory would be writable all the same; no read-only filesystem can be mounted
without privileges either. The honest way used here is a path that cannot be created at all,
under a regular file (ENOTDIR). The gateway's check is a real write probe (create a file in
the directory), so a read-only mount or a non-root gateway fails it in the same way.
"""

from __future__ import annotations

import asyncio
import io
import re
import signal
import socket
import sqlite3
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.config.conftest import PVEGATE, run_pvegate, write
from tests.support import free_port

PREFIX = "pvegate: cannot start: "


def _refusal(r: subprocess.CompletedProcess[str]) -> str:
    """The one line that says why (the last on stderr), after checking the exit and no traceback."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(PREFIX), r.stderr
    return last.removeprefix(PREFIX)


def _opa_gone(stderr: str) -> None:
    """The OPA this run started (logged with -v) is no longer running, and its socket's directory is gone."""
    sockets = re.findall(r"starting OPA sidecar: .* --addr unix://(\S+)", stderr)
    assert sockets, stderr
    for pid in (p.name for p in Path("/proc").iterdir() if p.name.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert sockets[0].encode() not in cmdline, f"OPA pid {pid} outlived its gateway"
    assert not Path(sockets[0]).parent.exists(), "the socket's directory outlived its gateway"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A bundle signed by `pvegate bundle build`, one with a file replaced, and a foreign key."""
    d = tmp_path_factory.mktemp("bundles")
    for args in (
        ("bundle", "keygen", "--out", str(d / "keys")),
        ("bundle", "keygen", "--out", str(d / "other")),
        ("bundle", "build", "--signing-key", str(d / "keys" / "bundle-signing.pem"), "-o", str(d / "good.tar.gz")),
    ):
        r = run_pvegate(*args)
        assert r.returncode == 0, r.stderr
    with tarfile.open(d / "good.tar.gz") as tin, tarfile.open(d / "tampered.tar.gz", "w:gz") as tout:
        for m in tin.getmembers():
            data = tin.extractfile(m).read() if m.isfile() else None  # type: ignore[union-attr]
            if m.name.lstrip("/") == "pvegate/decision.rego":
                data = (data or b"") + b"\ndefault allow := true  # the attacker's line\n"
                m.size = len(data)
            tout.addfile(m, io.BytesIO(data) if data is not None else None)
    return {
        "good": d / "good.tar.gz",
        "tampered": d / "tampered.tar.gz",
        "key": d / "keys" / "bundle-verify.pem",
        "other_key": d / "other" / "bundle-verify.pem",
    }


def test_a_config_error_is_reported_before_anything_starts(base: dict[str, Any], tmp_path: Path) -> None:
    base["auth"]["role_claim"] = "roles"
    path = write(tmp_path, base)
    reason = _refusal(run_pvegate("serve", "--config", str(path)))
    assert reason == f"{path}: auth.role_claim: unknown setting; did you mean auth.roles_claim?"
    assert not (tmp_path / "state").exists()


def test_several_config_errors_are_all_listed(base: dict[str, Any], tmp_path: Path) -> None:
    base["auth"]["role_claim"] = "roles"
    base["clusters"][0]["timeout"] = "ten"
    path = write(tmp_path, base)
    r = run_pvegate("serve", "--config", str(path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [
        f"{PREFIX}2 problems in the configuration:",
        f"{path}: auth.role_claim: unknown setting; did you mean auth.roles_claim?",
        f"{path}: clusters.default.timeout: expected a number, got 'ten'",
    ]


def test_missing_secret_file(base: dict[str, Any], tmp_path: Path) -> None:
    base["clusters"][0]["token"] = {"file": "secrets/pve-token-typo"}
    reason = _refusal(run_pvegate("serve", "--config", str(write(tmp_path, base))))
    missing = tmp_path / "secrets" / "pve-token-typo"
    assert reason == f"clusters.default.token: cannot read secret file {missing}: No such file or directory"


def test_unset_secret_variable(base: dict[str, Any], tmp_path: Path) -> None:
    base["auth"]["hs256_secret"] = {"env": "PVEGATE_TEST_UNSET_SECRET"}
    reason = _refusal(run_pvegate("serve", "--config", str(write(tmp_path, base))))
    assert reason == "auth.hs256_secret: environment variable PVEGATE_TEST_UNSET_SECRET is not set"


def test_missing_or_empty_metrics_token(base: dict[str, Any], tmp_path: Path) -> None:
    """It was first read at the first scrape: a mistyped path started a gateway whose every scrape got 401."""
    base["metrics"] = {"token": {"file": "secrets/metrics-tokn"}}
    reason = _refusal(run_pvegate("serve", "--config", str(write(tmp_path, base))))
    missing = tmp_path / "secrets" / "metrics-tokn"
    assert reason == f"metrics.token: cannot read secret file {missing}: No such file or directory"
    (tmp_path / "secrets" / "metrics-tokn").write_text("\n")
    reason = _refusal(run_pvegate("serve", "--config", str(write(tmp_path, base))))
    assert reason == "metrics.token: the secret is empty"


def test_state_dir_that_cannot_be_written(base: dict[str, Any], tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a regular file\n")
    base["state_dir"] = str(blocker / "state")
    reason = _refusal(run_pvegate("serve", "--config", str(write(tmp_path, base))))
    assert reason == f"state_dir {blocker / 'state'} is not a writable directory: Not a directory"


def test_port_in_use_is_reported_before_opa_starts(base: dict[str, Any], tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        base["listen"]["port"] = port
        reason = _refusal(run_pvegate("serve", "--config", str(write(tmp_path, base))))
    assert reason == f"listen: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert not (tmp_path / "state" / "opa.log").exists()


def test_tampered_bundle_quotes_opas_reason(base: dict[str, Any], tmp_path: Path, bundles: dict[str, Path]) -> None:
    base["opa"] = {"bundle": str(bundles["tampered"]), "verification_key": str(bundles["key"])}
    r = run_pvegate("-v", "serve", "--config", str(write(tmp_path, base)))
    reason = r.stderr.strip().splitlines()[-1].removeprefix(PREFIX)
    assert r.returncode == 2
    assert reason.startswith("OPA exited with status 1 during start-up: load error: bundle "), r.stderr
    assert "pvegate/decision.rego: digest mismatch (want: " in reason
    assert reason.endswith(f"(log: {tmp_path / 'state' / 'opa.log'})")
    assert "Traceback" in r.stderr  # -v: the traceback is in the debug log, before the one line
    _opa_gone(r.stderr)


def test_bundle_signed_by_another_key(base: dict[str, Any], tmp_path: Path, bundles: dict[str, Path]) -> None:
    base["opa"] = {"bundle": str(bundles["good"]), "verification_key": str(bundles["other_key"])}
    reason = _refusal(run_pvegate("serve", "--config", str(write(tmp_path, base))))
    assert "failed to verify JWT signature" in reason, reason


def test_failure_after_opa_started_stops_that_opa(base: dict[str, Any], tmp_path: Path) -> None:
    """The audit database cannot be opened (its path is a directory): OPA was already running."""
    (tmp_path / "state" / "audit.db").mkdir(parents=True)
    r = run_pvegate("-v", "serve", "--config", str(write(tmp_path, base)))
    reason = r.stderr.strip().splitlines()[-1].removeprefix(PREFIX)
    assert r.returncode == 2 and reason == "audit database: unable to open database file", r.stderr
    _opa_gone(r.stderr)


def test_an_audit_file_that_is_not_a_database_exits(base: dict[str, Any], tmp_path: Path) -> None:
    """The connection opens and its first statement fails: the gateway said why, then hung at exit
    (aiosqlite's thread was never closed), so a supervisor saw neither the exit status nor a restart."""
    db = tmp_path / "state" / "audit.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"not a database " * 100)
    r = run_pvegate("-v", "serve", "--config", str(write(tmp_path, base)), timeout=90)
    assert _refusal_after_traceback(r) == "audit database: file is not a database"
    _opa_gone(r.stderr)


def test_a_failure_after_the_audit_opened_exits(base: dict[str, Any], tmp_path: Path) -> None:
    """The audit opens, the approvals store in the same file does not (a table of another shape):
    the opened audit log is closed again, so the process exits."""
    db = tmp_path / "state" / "audit.db"
    _sealed_audit(db)
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE approval_requests (id TEXT PRIMARY KEY)")
    con.commit()
    con.close()
    r = run_pvegate("-v", "serve", "--config", str(write(tmp_path, base)), timeout=90)
    assert _refusal_after_traceback(r) == "audit database: no such column: requester"
    _opa_gone(r.stderr)


def _refusal_after_traceback(r: subprocess.CompletedProcess[str]) -> str:
    """With -v the traceback is logged before the one line; the exit status is still 2."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(PREFIX), r.stderr
    return last.removeprefix(PREFIX)


def _sealed_audit(path: Path) -> None:
    """An audit database written by a gateway (sealed with audit-head.key next to it)."""
    from gateway.store.audit import AuditLog, AuditRecord

    async def go() -> None:
        log = AuditLog(path)
        await log.open()
        await log.append(AuditRecord("r1", "decision", outcome="allow"))
        await log.close()

    asyncio.run(go())


def test_audit_head_key_missing(base: dict[str, Any], tmp_path: Path) -> None:
    db = tmp_path / "state" / "audit.db"
    _sealed_audit(db)
    (db.parent / "audit-head.key").unlink()
    reason = _refusal(run_pvegate("serve", "--config", str(write(tmp_path, base))))
    assert reason == f"audit.head_key_file: the audit head key file {db.parent / 'audit-head.key'} is missing"


def test_audit_head_deleted(base: dict[str, Any], tmp_path: Path) -> None:
    db = tmp_path / "state" / "audit.db"
    _sealed_audit(db)
    con = sqlite3.connect(db)
    con.execute("DELETE FROM audit_meta WHERE key = 'head'")
    con.commit()
    con.close()
    reason = _refusal(run_pvegate("serve", "--config", str(write(tmp_path, base))))
    assert reason == "audit database: the chain head (audit_meta 'head') is missing: it was deleted"


def test_control_the_same_config_with_the_good_bundle_starts_and_stops(
    base: dict[str, Any], tmp_path: Path, bundles: dict[str, Path]
) -> None:
    """Without this, the refusals above could be a gateway that never starts at all."""
    port = free_port()
    base["listen"]["port"] = port
    base["opa"] = {"bundle": str(bundles["good"]), "verification_key": str(bundles["key"])}
    path = write(tmp_path, base)
    proc = subprocess.Popen([*PVEGATE, "serve", "--config", str(path)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "gateway did not become healthy"
            time.sleep(0.1)
        assert r.json()["status"] == "ready" and r.json()["checks"]["policy"]["source"] == "bundle"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    # uvicorn re-raises the SIGTERM it handled once shut down: killed by it, after a clean stop
    assert proc.returncode in (0, -signal.SIGTERM), stderr
    assert PREFIX not in stderr and "Traceback" not in stderr
    assert not (tmp_path / "state" / "opa.pid").exists()  # the sidecar was stopped with the gateway


@pytest.mark.parametrize("problem", ["passphrase", "public_key_as_private", "bad_host_key"])
def test_an_unusable_ssh_key_is_refused_at_start(base: dict[str, Any], tmp_path: Path, problem: str) -> None:
    """Before, the gateway started and every SSH call then failed with an internal error
    (KeyImportError escaped the runtime): a key needing a passphrase, a .pub given as the
    private key, a pinned host key that is no key. No key material is shown."""
    import asyncssh

    key = asyncssh.generate_private_key("ssh-ed25519")
    key_file = tmp_path / "ssh-key"
    host_key = key.export_public_key().decode().strip()
    if problem == "passphrase":
        key_file.write_bytes(key.export_private_key("pkcs8-pem", passphrase="only-a-human-knows"))
    elif problem == "public_key_as_private":
        key_file.write_bytes(key.export_public_key())
    else:
        key_file.write_bytes(key.export_private_key())
        host_key = "ssh-ed25519 AAAAnotbase64"
    key_file.chmod(0o600)  # private, as a key must be: what is wrong with it is the problem under test
    base["clusters"][0]["ssh"] = {
        "key_file": str(key_file),
        "nodes": {"pve1": {"host": "127.0.0.1", "host_key": host_key}},
    }
    reason = _refusal(run_pvegate("serve", "--config", str(write(tmp_path, base))))
    if problem == "bad_host_key":
        assert reason.startswith("clusters.default.ssh.nodes.pve1.host_key: not an OpenSSH public key"), reason
    else:
        assert reason.startswith(f"clusters.default.ssh.key_file: {key_file} is no usable private key"), reason
    assert "PRIVATE KEY" not in reason and "only-a-human-knows" not in reason


def test_a_short_hs256_secret_is_refused(base: dict[str, Any], tmp_path: Path) -> None:
    """A short HMAC key is found offline from any one token it signed: RFC 7518 wants at least 256 bits."""
    short = tmp_path / "secrets" / "short-jwt"
    short.parent.mkdir(parents=True, exist_ok=True)
    short.write_text("x" * 31 + "\n")  # the newline is not part of it
    base["auth"]["hs256_secret"] = {"file": str(short)}
    reason = _refusal(run_pvegate("serve", "--config", str(write(tmp_path, base))))
    assert reason.startswith("auth.hs256_secret: the secret is 31 bytes; an HS256 secret needs at least 32"), reason
    assert "x" * 31 not in reason
