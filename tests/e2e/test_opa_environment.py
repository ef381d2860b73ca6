"""The managed OPA's process: a less eager Go collector, none of the gateway's environment, and an API
only the gateway's user can reach."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

import pytest

from gateway.policy.bundles import build, keygen
from gateway.policy.opa_sidecar import OPASidecar, OPAUnavailable

ROOT = Path(__file__).resolve().parents[2]


def _gogc_of(sidecar: OPASidecar) -> float:
    """What the running OPA's Go runtime reports as its GOGC (Prometheus metrics)."""
    with sidecar.client(timeout=5) as c:
        text = c.get("/metrics").text
    for line in text.splitlines():
        if line.startswith("go_gc_gogc_percent "):
            return float(line.split()[1])
    raise AssertionError("OPA's /metrics has no go_gc_gogc_percent")


@pytest.mark.parametrize(("environ", "expected"), [(None, 400.0), ("150", 150.0)])
def test_sidecar_gogc(monkeypatch: pytest.MonkeyPatch, environ: str | None, expected: float) -> None:
    if environ is None:
        monkeypatch.delenv("GOGC", raising=False)
    else:
        monkeypatch.setenv("GOGC", environ)
    sidecar = OPASidecar(policies=(ROOT / "policies",), decision_logs=False)
    sidecar.start()
    try:
        assert _gogc_of(sidecar) == expected
    finally:
        sidecar.stop()


def test_sidecar_does_not_inherit_the_gateways_secrets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A policy sees its process environment (opa.runtime().env): it must hold no gateway secret."""
    monkeypatch.setenv("PVEGATE_TEST_PVE_TOKEN", "root@pam!gw=5ecret-5ecret")
    monkeypatch.setenv("GOMAXPROCS", "2")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/secrets/5ecret-sa.json")
    (tmp_path / "env.rego").write_text("package probe\n\nenv := opa.runtime().env\n")
    sidecar = OPASidecar(policies=(tmp_path,), decision_logs=False)
    sidecar.start()
    try:
        with sidecar.client(timeout=5) as c:
            r = c.post("/v1/data/probe/env", json={})
        env = r.json()["result"]
    finally:
        sidecar.stop()
    assert "PATH" in env and env["GOGC"] == "400" and env["GOMAXPROCS"] == "2"
    assert "PVEGATE_TEST_PVE_TOKEN" not in env and "GOOGLE_APPLICATION_CREDENTIALS" not in env
    assert not any("5ecret" in v for v in env.values())


def _tcp_listeners(pid: int) -> list[str]:
    """The TCP sockets process `pid` listens on (from its descriptors and /proc/net/tcp{,6})."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    listening = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # state LISTEN
                listening.append(fields[1])
    return listening


def _connect_as_nobody(path: Path) -> int:
    """Try OPA's socket as another local user (uid 65534, in a forked child): 0 connected, 13 EACCES."""
    pid = os.fork()
    if pid == 0:  # the child only drops to nobody, connects and exits
        code = 99
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(path))
            code = 0
        except PermissionError:
            code = 13
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _assert_private(sidecar: OPASidecar) -> None:
    """OPA listens on no TCP port, and its socket admits this user only."""
    assert sidecar.process is not None
    assert _tcp_listeners(sidecar.process.pid) == []
    d, sock = sidecar.socket_dir.lstat(), sidecar.socket_path.lstat()
    assert stat.S_ISDIR(d.st_mode) and stat.S_IMODE(d.st_mode) == 0o700 and d.st_uid == os.geteuid()
    assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o600
    if os.geteuid() == 0:  # only root can act as another user here
        assert _connect_as_nobody(sidecar.socket_path) == 13  # EACCES


def test_only_the_gateway_may_use_the_managed_opas_api() -> None:
    """Policies loaded from a directory are writable through OPA's REST API: only the gateway's user
    may reach it, through a private socket, and nothing reaches it over TCP."""
    sidecar = OPASidecar(policies=(ROOT / "policies",), decision_logs=False)
    sidecar.start()
    try:
        assert sidecar.url.startswith("unix://") and "--authentication=token" not in sidecar.command()
        _assert_private(sidecar)
        with sidecar.client(timeout=5) as c:  # control: the gateway's user is served
            assert c.get("/health").status_code == 200
            r = c.post("/v1/data/pvegate/decision", json={"input": {}})
            assert r.status_code == 200 and r.json()["result"]["allow"] is False
    finally:
        sidecar.stop()
    assert not sidecar.socket_dir.exists()


def test_a_managed_opa_loading_a_signed_bundle_serves_only_the_gateway(tmp_path: Path) -> None:
    """A bundle write-protects its roots only: reads, and writes elsewhere, are kept to the gateway's
    user by the socket, and the bundle's roots stay read-only even for it."""
    priv, pub = keygen(tmp_path / "keys")
    bundle = tmp_path / "pvegate.tar.gz"
    build(ROOT / "policies", bundle, priv, checks=False)  # policies/ is checked by its own tests
    sidecar = OPASidecar(bundle=bundle, verification_key=pub, decision_logs=False)
    sidecar.start()
    try:
        _assert_private(sidecar)
        with sidecar.client(timeout=5) as c:
            assert c.get("/health?bundles").status_code == 200
            r = c.get("/v1/data/data/bindings")
            assert r.status_code == 200 and r.json()["result"]
            w = c.put("/v1/data/data/bindings", json=[])
            assert w.status_code == 400 and "bundle" in w.text
    finally:
        sidecar.stop()


def test_the_socket_keeps_its_address_across_restarts_and_refuses_a_foreign_directory() -> None:
    """Clients keep the address they were given: a restart (the supervisor's, after a crash) binds the
    same path. A directory at that path that is not private to this user is never used."""
    sidecar = OPASidecar(policies=(ROOT / "policies",), decision_logs=False)
    sidecar.start()
    url = sidecar.url
    try:
        assert sidecar.process is not None
        sidecar.process.kill()  # a crash leaves the socket file behind
        sidecar.process.wait()
        assert sidecar.socket_path.exists()
        sidecar.start()
        assert sidecar.url == url
        with sidecar.client(timeout=5) as c:
            assert c.get("/health").status_code == 200
    finally:
        sidecar.stop()
    for mode in (0o755, 0o770):
        sidecar.socket_dir.mkdir(mode=mode)
        sidecar.socket_dir.chmod(mode)  # whatever the umask
        try:
            with pytest.raises(OPAUnavailable, match="not a private directory"):
                sidecar.start()
        finally:
            sidecar.stop()
            assert sidecar.socket_dir.is_dir()  # not ours: left alone
            sidecar.socket_dir.rmdir()
    target = sidecar.socket_dir.with_name(sidecar.socket_dir.name + "-target")
    target.mkdir(mode=0o700)
    sidecar.socket_dir.symlink_to(target)
    try:
        with pytest.raises(OPAUnavailable, match="not a private directory"):
            sidecar.start()
    finally:
        sidecar.stop()
        sidecar.socket_dir.unlink()
        target.rmdir()
