"""Two `audit archive` runs at once (a daily timer and an operator, or two hosts sharing an archive
directory) must never leave the chain's committed archive deleted or overwritten: the run that loses
the race removes only its own file, and verify still finds every listed archive intact."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.store import audit as auditlib
from gateway.store.audit import AuditRecord
from tests.store.auditstore import Store, off


async def _settled_calls(store: Store, n: int = 3) -> None:
    log = store.log()
    await log.open()
    try:
        for i in range(n):
            rid = f"r{i}"
            await log.append(AuditRecord(rid, "received", "alice", "start_vm", "default/qemu/100", None, {}))
            await log.append(AuditRecord(rid, "decision", "alice", "start_vm", "default/qemu/100", "allow", {}))
            await log.append(AuditRecord(rid, "result", "alice", "start_vm", "default/qemu/100", "ok", {}))
    finally:
        await log.close()


async def test_a_concurrent_archive_never_removes_the_committed_archive(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _settled_calls(store)
    out = store.root / "arch"
    before = time.time() + 1
    real_fsync_dir = auditlib._fsync_dir
    second: dict[str, Any] = {}

    def interleave(d: Path) -> None:
        # the first run has put its file in place and not yet committed: the second runs whole now, from the
        # same snapshot of the chain (what two runs started together see)
        real_fsync_dir(d)
        if "done" in second:
            return
        second["done"] = True
        try:
            second["result"] = auditlib.archive(store.where, before, out, key=store.key)
        except ValueError as exc:
            second["error"] = str(exc)

    monkeypatch.setattr(auditlib, "_fsync_dir", interleave)
    try:
        first: Any = off(auditlib.archive, store.where, before, out, key=store.key)
    except ValueError as exc:
        first = str(exc)
    monkeypatch.setattr(auditlib, "_fsync_dir", real_fsync_dir)
    assert "done" in second
    committed = isinstance(first, auditlib.ArchiveResult) or isinstance(second.get("result"), auditlib.ArchiveResult)
    assert committed, (first, second)
    listed = off(auditlib.archives, store.where)
    assert len(listed) == 1, listed
    f = Path(listed[0]["file"])
    assert f.is_file(), f"the committed archive {f} was deleted by the run that lost the race ({first}, {second})"
    assert hashlib.sha256(f.read_bytes()).hexdigest() == listed[0]["sha256"], "the committed archive was overwritten"
    res = off(auditlib.verify, store.where, key=store.key)
    assert res.ok, res.problem
