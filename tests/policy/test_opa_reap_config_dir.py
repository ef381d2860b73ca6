"""A gateway killed without clean-up leaves OPA's private config directory behind (it can hold service
credentials and the bundle file server's bearer token): the pid file records it, and the next sidecar
on the same state dir removes it, with the care taken for the socket directory."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.policy.opa_sidecar import OPASidecar

ROOT = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped): a gateway that is gone."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.fixture
def living_pid() -> Iterator[int]:
    """Another gateway that still runs."""
    p = subprocess.Popen(["sleep", "60"])
    try:
        yield p.pid
    finally:
        p.kill()
        p.wait()


def _leftover_dir(parent: Path, *, config: bool = True) -> Path:
    """A private directory as the sidecar makes them (mkdtemp, pvegate-opa-*), with a config holding a secret."""
    d = Path(tempfile.mkdtemp(prefix="pvegate-opa-", dir=parent))
    if config:
        path = d / "opa-config.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"services": {"s": {"credentials": {"bearer": {"token": "s3cret"}}}}}, f)
    return d


def test_start_removes_the_config_directory_a_killed_gateway_left(tmp_path: Path) -> None:
    pid_file = tmp_path / "opa.pid"
    socket_dir = _leftover_dir(tmp_path, config=False)
    config_dir = _leftover_dir(tmp_path)
    pid_file.write_text(f"{_dead_pid()} {_dead_pid()} {socket_dir} {config_dir}\n")
    fresh = OPASidecar(policies=(ROOT / "policies",), pid_file=pid_file, decision_logs=False)
    try:
        fresh.start()
        assert fresh.alive()
        assert not config_dir.exists(), "the killed gateway's OPA config directory is left behind"
        assert not socket_dir.exists()
        # the new record names this sidecar's config directory, made before the pid file is written
        assert fresh.process is not None and fresh._config_dir is not None
        assert pid_file.read_text().split() == [
            str(fresh.process.pid),
            str(os.getpid()),
            str(fresh.socket_dir),
            fresh._config_dir,
        ]
        assert (Path(fresh._config_dir) / "opa-config.json").is_file()
        own_config = Path(fresh._config_dir)
    finally:
        fresh.stop()
    assert not own_config.exists()


def test_reap_stale_removes_the_config_directory_of_a_dead_gateway(tmp_path: Path) -> None:
    pid_file = tmp_path / "opa.pid"
    socket_dir = _leftover_dir(tmp_path, config=False)
    config_dir = _leftover_dir(tmp_path)
    pid_file.write_text(f"{_dead_pid()} {_dead_pid()} {socket_dir} {config_dir}\n")
    OPASidecar(pid_file=pid_file).reap_stale()
    assert not config_dir.exists()
    assert not socket_dir.exists()


def _not_ours(kind: str, tmp_path: Path) -> tuple[Path, Path]:
    """(the path to record as the config directory, what must still be there afterwards)."""
    if kind == "symlink":  # a link named like ours, to a directory with a config in it
        target = _leftover_dir(tmp_path)
        link = tmp_path / "pvegate-opa-link"
        link.symlink_to(target, target_is_directory=True)
        return link, target / "opa-config.json"
    if kind == "unprefixed":  # a directory of ours, but not one the sidecar makes
        d = tmp_path / "someone-elses-config"
        d.mkdir()
        (d / "opa-config.json").write_text("{}")
        return d, d / "opa-config.json"
    if kind == "file":
        f = tmp_path / "pvegate-opa-file"
        f.write_text("{}")
        return f, f
    if kind == "other_user":
        if os.geteuid() != 0:
            pytest.skip("making a directory of another user needs root")
        d = _leftover_dir(tmp_path)
        os.chown(d, 65534, 65534)
        return d, d / "opa-config.json"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["symlink", "unprefixed", "file", "other_user"])
def test_a_recorded_path_that_is_not_our_config_directory_is_left_alone(tmp_path: Path, kind: str) -> None:
    pid_file = tmp_path / "opa.pid"
    recorded, kept = _not_ours(kind, tmp_path)
    socket_dir = _leftover_dir(tmp_path, config=False)
    pid_file.write_text(f"{_dead_pid()} {_dead_pid()} {socket_dir} {recorded}\n")
    OPASidecar(pid_file=pid_file).reap_stale()
    assert kept.exists(), f"{kind}: removed"
    assert recorded.exists() or recorded.is_symlink()
    assert not socket_dir.exists()  # the record's own socket directory is still cleared up


def test_a_relative_recorded_path_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sidecar records absolute paths: a relative one would be resolved against whatever the cwd is."""
    monkeypatch.chdir(tmp_path)
    d = _leftover_dir(tmp_path)
    pid_file = tmp_path / "opa.pid"
    pid_file.write_text(f"{_dead_pid()} {_dead_pid()} {_leftover_dir(tmp_path, config=False)} {d.name}\n")
    OPASidecar(pid_file=pid_file).reap_stale()
    assert (d / "opa-config.json").is_file()


def test_a_living_gateways_config_directory_is_left_alone(tmp_path: Path, living_pid: int) -> None:
    pid_file = tmp_path / "opa.pid"
    socket_dir = _leftover_dir(tmp_path, config=False)
    config_dir = _leftover_dir(tmp_path)
    pid_file.write_text(f"{_dead_pid()} {living_pid} {socket_dir} {config_dir}\n")
    OPASidecar(pid_file=pid_file).reap_stale()
    assert (config_dir / "opa-config.json").is_file()
    assert socket_dir.is_dir()


def test_the_sidecars_own_directories_are_never_reaped(tmp_path: Path) -> None:
    """A record naming this sidecar's own config or socket directory (by name or by another spelling
    of it) leaves them alone, whoever wrote it."""
    own_socket = _leftover_dir(tmp_path, config=False)
    own_config = _leftover_dir(tmp_path)
    (tmp_path / "sub").mkdir()
    sidecar = OPASidecar(pid_file=tmp_path / "opa.pid", socket_dir=own_socket)
    sidecar._config_dir = str(own_config)
    assert sidecar.pid_file is not None
    for socket_dir, config_dir in [
        (own_socket, own_config),
        (own_config, own_socket),
        (tmp_path / "sub" / ".." / own_socket.name, tmp_path / "sub" / ".." / own_config.name),
    ]:
        sidecar.pid_file.write_text(f"{_dead_pid()} {_dead_pid()} {socket_dir} {config_dir}\n")
        sidecar.reap_stale()
        assert (own_config / "opa-config.json").is_file()
        assert own_socket.is_dir()


def test_an_old_three_field_pid_file_still_works(tmp_path: Path) -> None:
    """A pid file from before the config directory was recorded: `<OPA pid> <gateway pid> <socket dir>`."""
    pid_file = tmp_path / "opa.pid"
    socket_dir = _leftover_dir(tmp_path, config=False)
    opa, owner = _dead_pid(), _dead_pid()
    pid_file.write_text(f"{opa} {owner} {socket_dir}\n")
    sidecar = OPASidecar(pid_file=pid_file)
    record = sidecar._pid_record()
    assert record is not None
    assert (record.pid, record.owner, record.socket_dir, record.config_dir) == (opa, owner, socket_dir, None)
    sidecar.reap_stale()
    assert not socket_dir.exists()


def test_an_old_two_field_pid_file_still_works(tmp_path: Path) -> None:
    pid_file = tmp_path / "opa.pid"
    opa, owner = _dead_pid(), _dead_pid()
    pid_file.write_text(f"{opa} {owner}\n")
    sidecar = OPASidecar(pid_file=pid_file)
    assert sidecar._pid_record() == (opa, owner, None, None)
    sidecar.reap_stale()  # nothing to remove, and no error


def test_a_record_with_a_path_split_by_whitespace_names_no_directory(tmp_path: Path) -> None:
    """More than 4 fields: a path held whitespace and which field is which is unknown, so nothing is
    removed on its word (its OPA would still be stopped)."""
    pid_file = tmp_path / "opa.pid"
    config_dir = _leftover_dir(tmp_path)
    pid_file.write_text(f"{_dead_pid()} {_dead_pid()} {tmp_path}/a b/pvegate-opa-0123 {config_dir}\n")
    sidecar = OPASidecar(pid_file=pid_file)
    record = sidecar._pid_record()
    assert record is not None and record.socket_dir is None and record.config_dir is None
    sidecar.reap_stale()
    assert (config_dir / "opa-config.json").is_file()
