"""`audit archive` on each backend: it never archives a call still open (an allowed decision without a settling
record), so reconciliation can still settle it; it refuses a database whose audit schema is newer than this
pvegate knows, writing nothing; it lists each archive by its absolute path, so verify finds it from anywhere."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.store import audit as auditlib
from gateway.store import reconcile
from gateway.store.audit import AuditRecord, Query
from tests.store.auditstore import AuditClock, Store, off


async def _calls(store: Store, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Three calls: r0 settled two hours before the others (more than the task claims' margin the archive
    keeps before an open call: test_s48_archive_keeps_task_claims.py), r1 allowed and still open, r2 settled;
    the seq of each decision."""
    clock = AuditClock.install(monkeypatch)
    now = clock.now
    log = store.log()
    await log.open()
    try:
        for rid in ("r0", "r1", "r2"):
            clock.now = now - 7200 if rid == "r0" else now
            await log.append(AuditRecord(rid, "received", "alice", "start_vm", "default/qemu/100", None, {}))
            await log.append(AuditRecord(rid, "decision", "alice", "start_vm", "default/qemu/100", "allow", {}))
            if rid != "r1":
                await log.append(AuditRecord(rid, "result", "alice", "start_vm", "default/qemu/100", "ok", {}))
    finally:
        await log.close()
        monkeypatch.undo()
    rows = off(auditlib.search, store.where, Query(kind="decision"))
    return {str(r["request_id"]): int(r["seq"]) for r in rows}


def _open(store: Store) -> list[str]:
    con = auditlib.connect(store.where, readonly=True)
    try:
        rows = con.execute(reconcile.OPEN_CALLS_SQL, (-float("inf"), float("inf"))).fetchall()
        return [str(r["request_id"]) for r in rows]
    finally:
        con.close()


async def test_archive_stops_before_the_oldest_open_call(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    decided = await _calls(store, monkeypatch)
    assert off(_open, store) == ["r1"]
    res = off(auditlib.archive, store.where, time.time() + 1, store.root / "arch", key=store.key)
    assert res.last_seq == decided["r1"] - 2, res  # before r1's `received` record: its target stays readable
    assert off(_open, store) == ["r1"]  # still there for reconciliation to settle
    archived = [Path(a["file"]) for a in off(auditlib.archives, store.where)]
    assert off(auditlib.verify, store.where, archived, key=store.key).ok


async def test_archive_refuses_a_newer_schema_and_writes_nothing(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    await _calls(store, monkeypatch)
    store.sql("UPDATE pvegate_schema SET version = 99 WHERE component = 'audit'")
    out = store.root / "arch"
    with pytest.raises(ValueError, match="newer than this pvegate knows"):
        off(auditlib.archive, store.where, time.time() + 1, out, key=store.key)
    assert not out.exists() or not any(out.iterdir())
    assert len(off(auditlib.search, store.where, Query())) == 8


async def test_the_archive_list_holds_an_absolute_path(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _calls(store, monkeypatch)
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    res = off(auditlib.archive, store.where, time.time() + 1, Path("arch"), key=store.key)
    assert res.file is not None
    listed = [a["file"] for a in off(auditlib.archives, store.where)]
    assert listed == [str((tmp_path / "here" / "arch" / res.file.name).resolve())]
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    res2 = off(auditlib.verify, store.where, key=store.key)  # finds the listed archive itself
    assert res2.ok, res2.problem
