"""An audit store that keeps failing is logged when it starts failing, not on every probe round.

`probe_audit` logged `readiness: ...` at error level on each round the store failed (the probe's refused
write, the free space that cannot be checked): every 5 s by default, some 17,000 lines a day for one
outage, burying what else the log says and costing a log pipeline for nothing. Like the OPA probe, it
now logs a failure once when it starts, again when its reason changes, and the recovery once.

A real gateway and its real SQLite store, made to fail: a row written past the authenticated head by
another hand (every commit refused), the store's directory renamed away (its free space cannot be
checked, its file is gone from audit.path), a full file system.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.health.conftest import base_url, health_env, http_client, wait_for
from tests.health.test_readiness import _fill, _mount_tmpfs
from tests.resilience.helpers import call
from tests.support import GatewayThread

ROUNDS = 8  # probe rounds the store keeps failing for (audit_probe_interval 0.5 s)


def _readiness_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "pvegate.health" and r.levelno == level and r.getMessage().startswith("readiness: ")
    ]


def _each_once(lines: list[str]) -> None:
    repeated = {line: n for line, n in Counter(lines).items() if n > 1}
    assert not repeated, f"logged on every probe round: {repeated}"


async def _failing_rounds(http: Any, base: str, gw: GatewayThread) -> None:
    """Until the probe has failed ROUNDS times more (each failing round stamps audit_probe_failed_at): a test
    that saw one slow round only would prove nothing about repeated lines."""
    await wait_for(http, base + "/readyz", lambda r: r.status_code == 503, timeout=10)
    health = gw.components.health
    assert health is not None
    stamps: set[float] = set()
    deadline = time.monotonic() + ROUNDS * 0.5 + 30
    while len(stamps) < ROUNDS:
        assert time.monotonic() < deadline, f"only {len(stamps)} failing probe rounds"
        if (at := health.audit_probe_failed_at) is not None:
            stamps.add(at)
        await asyncio.sleep(0.05)


async def test_a_store_refusing_every_commit_is_logged_once_and_its_recovery_once(
    hsim: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pvegate.health")
    env = health_env(tmp_path / "gw", hsim)
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    try:
        async with http_client(env) as http:
            await wait_for(http, base + "/readyz", lambda r: r.status_code == 200)
            tok = env.token("agent", ["operator"])
            assert (await call(http, base + "/mcp", tok, "list_nodes", {})).status_code == 200  # a chain to extend
            # a row past the authenticated head, beyond a gap: every commit, the probe's too, is refused
            con = sqlite3.connect(env.config.audit_path, timeout=5)
            (top,) = con.execute("SELECT max(seq) FROM audit").fetchone()
            con.execute(
                "INSERT INTO audit VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (top + 5, time.time(), "x", "decision", "p", "t", None, "allow", "{}", "00", "00"),
            )
            con.commit()
            await _failing_rounds(http, base, gw)
            errors = _readiness_lines(caplog, logging.ERROR)
            assert errors and all("audit store refuses writes" in e for e in errors), errors
            _each_once(errors)
            assert len(errors) == 1, errors  # one failure, one reason: one line
            # the row gone again: the store takes writes, which is logged once
            con.execute("DELETE FROM audit WHERE seq = ?", (top + 5,))
            con.commit()
            con.close()
            await wait_for(http, base + "/readyz", lambda r: r.status_code == 200, timeout=10)
            await asyncio.sleep(ROUNDS * 0.5)
            again = [w for w in _readiness_lines(caplog, logging.WARNING) if "takes writes again" in w]
            assert len(again) == 1, again
            assert _readiness_lines(caplog, logging.ERROR) == errors  # nothing more while it works
    finally:
        gw.stop()


async def test_a_store_directory_renamed_away_is_logged_once_per_reason(
    hsim: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pvegate.health")
    store = tmp_path / "store"
    env = health_env(tmp_path / "gw", hsim, audit={"path": str(store / "audit.db")})
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    try:
        async with http_client(env) as http:
            await wait_for(http, base + "/readyz", lambda r: r.status_code == 200)
            store.rename(tmp_path / "moved")
            try:
                await _failing_rounds(http, base, gw)
            finally:
                (tmp_path / "moved").rename(store)
            errors = _readiness_lines(caplog, logging.ERROR)
            assert any("cannot check the audit store's free space" in e for e in errors), errors
            _each_once(errors)
            await wait_for(http, base + "/readyz", lambda r: r.status_code == 200, timeout=10)
            await asyncio.sleep(2)
            warnings = _readiness_lines(caplog, logging.WARNING)
            assert Counter(warnings)["readiness: the audit store's free space can be checked again"] == 1, warnings
            _each_once(warnings)
    finally:
        gw.stop()


async def test_a_full_disk_is_logged_once_with_its_reason(
    hsim: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pvegate.health")
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "2m")
    try:
        env = health_env(tmp_path / "gw", hsim, audit={"path": str(disk / "audit.db"), "min_free_mb": 0})
        gw = GatewayThread(env.config).start()
        base = base_url(env.config)
        try:
            async with http_client(env) as http:
                await wait_for(http, base + "/readyz", lambda r: r.status_code == 200)
                ballast = _fill(disk)
                await _failing_rounds(http, base, gw)
                errors = _readiness_lines(caplog, logging.ERROR)
                assert errors == ["readiness: audit store refuses writes (OperationalError: database or disk is full)"]
                ballast.unlink()
                await wait_for(http, base + "/readyz", lambda r: r.status_code == 200, timeout=10)
                await asyncio.sleep(2)
                again = [w for w in _readiness_lines(caplog, logging.WARNING) if "takes writes again" in w]
                assert len(again) == 1, again
        finally:
            gw.stop()
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=10)
