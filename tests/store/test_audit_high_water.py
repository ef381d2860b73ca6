"""The high-water mark: the furthest head a writer on this host reached, kept next to the head key
(outside the database), so the end of the chain cut and an older authenticated head put back (from
the WAL, or an older copy of the file) is seen by `verify` and refused at start, on both backends."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from gateway.cli import main as cli
from gateway.store import audit as auditlib
from gateway.store.audit import AuditIntegrityError
from gateway.store.audit_seal import HeadKey, read_mark
from tests.store.auditstore import Store, off
from tests.store.test_audit_backends import filled, rec


def _mark(store: Store) -> Path:
    return store.key.with_name(store.key.name + ".hwm")


def _put_back(store: Store, head: str, seq: int) -> None:
    """The tamperer: the records after `seq` deleted, the authentic head of that time put back."""
    store.sql(
        f"DELETE FROM audit WHERE seq > {seq}",
        "UPDATE audit_meta SET value = '" + head.replace("'", "''") + "' WHERE key = 'head'",
    )


async def test_a_cut_end_with_an_older_head_put_back_is_seen_by_verify_and_refused_at_start(
    store: Store, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    await filled(store, 5)  # records 1..10
    old_head = str(store.value("SELECT value FROM audit_meta WHERE key = 'head'"))
    await filled(store, 5)  # records 11..20; a clean stop leaves the mark at the head
    mark = read_mark(_mark(store), HeadKey.load(store.key))
    assert mark is not None and mark["seq"] == 20
    assert off(auditlib.verify, store.where, key=store.key).high_water == 20
    _put_back(store, old_head, 10)
    res = off(auditlib.verify, store.where, key=store.key)
    assert not res.ok and res.bad_seq == 11, res.problem
    assert f"the head is at seq 10 but seq 20 was reached (high-water mark at {_mark(store)})" in (res.problem or "")
    assert await asyncio.to_thread(cli, ["audit", "verify", "--config", str(store.config())]) == 1
    assert "records at the end are missing" in capsys.readouterr().err
    log = store.log()
    with pytest.raises(AuditIntegrityError, match=r"records at the end are missing.*move .* aside") as err:
        await log.open()
    await log.close()
    assert err.value.seq == 11
    assert store.value("SELECT max(seq) FROM audit") == 10  # nothing written, no seq reused
    # the operator who knows why moves the mark aside: the next start begins a new mark at the head
    _mark(store).rename(_mark(store).with_name("evidence.hwm"))
    caplog.set_level(logging.INFO, "pvegate.audit")
    log = store.log()
    await log.open()
    await log.close()
    assert "there was no high-water mark" in caplog.text
    assert "the chain head is record 10" in caplog.text
    mark = read_mark(_mark(store), HeadKey.load(store.key))
    assert mark is not None and mark["seq"] == 10


async def test_every_start_logs_the_head(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    await filled(store, 2)
    caplog.set_level(logging.INFO, "pvegate.audit")
    log = store.log()
    await log.open()
    await log.close()
    assert "the chain head is record 4, written 20" in caplog.text
    assert f"high-water mark record 4 at {_mark(store)}" in caplog.text


async def test_the_mark_is_not_written_per_call_but_every_interval_and_at_close(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auditlib, "MARK_SECONDS", 3600.0)
    log = store.log()
    await log.open()
    key = HeadKey.load(store.key)
    try:
        for i in range(5):
            await log.append(rec(i))
        mark = read_mark(_mark(store), key)
        assert mark is not None and mark["seq"] == 0  # written at open only: not with each commit
    finally:
        await log.close()
    mark = read_mark(_mark(store), key)
    assert mark is not None and mark["seq"] == 5  # a clean stop
    monkeypatch.setattr(auditlib, "MARK_SECONDS", 0.05)
    log = store.log()
    await log.open()
    try:
        await log.append(rec(9))
        for _ in range(100):
            mark = read_mark(_mark(store), key)
            if mark is not None and mark["seq"] == 6:
                break
            await asyncio.sleep(0.05)
        assert mark is not None and mark["seq"] == 6  # while running, after the interval
    finally:
        await log.close()


async def test_a_mark_changed_by_hand_fails_verify_and_start(store: Store) -> None:
    await filled(store, 2)
    doc = json.loads(_mark(store).read_text())
    _mark(store).write_text(json.dumps(doc | {"seq": 2}))
    res = off(auditlib.verify, store.where, key=store.key)
    assert not res.ok and "is not authenticated by the audit head key" in (res.problem or ""), res.problem
    log = store.log()
    with pytest.raises(AuditIntegrityError, match="not authenticated"):
        await log.open()
    await log.close()
    _mark(store).write_text("garbage")
    assert "garbled" in (off(auditlib.verify, store.where, key=store.key).problem or "")


async def test_a_mark_never_goes_down_and_a_new_chain_takes_it_over(store: Store, tmp_path: Path) -> None:
    await filled(store, 3)  # 6
    key = HeadKey.load(store.key)
    mark = read_mark(_mark(store), key)
    assert mark is not None
    from gateway.store.audit_seal import write_mark

    assert not write_mark(_mark(store), key, mark["db"], 2)  # another process that saw less keeps the higher mark
    got = read_mark(_mark(store), key)
    assert got is not None and got["seq"] == 6
    if store.backend != "sqlite":
        return
    assert isinstance(store.where, Path)
    store.where.rename(tmp_path / "moved-aside.db")  # the documented way to start a new chain
    for suffix in ("-wal", "-shm"):
        Path(str(store.where) + suffix).unlink(missing_ok=True)
    await filled(store, 1)
    got = read_mark(_mark(store), key)
    assert got is not None and got["db"] != mark["db"] and got["seq"] == 2
    # the moved-aside database verifies; the mark (of the new chain) is not checked against it
    res = off(auditlib.verify, tmp_path / "moved-aside.db", key=store.key)
    assert res.ok and res.high_water is None, res.problem


async def test_two_databases_beside_one_key_both_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One mark per key: a second audit database sealed with the same key (a copy given with --db, a
    sample beside the real one) wrote it last, and the real database was then refused at every start
    as 'replaced'. It starts, says so, and the mark follows it again."""
    state = tmp_path / "state"
    first, second = state / "audit.db", state / "other.db"
    key = state / "audit-head.key"

    async def write(db: Path, n: int) -> None:
        log = auditlib.AuditLog(db)
        await log.open()
        try:
            for i in range(n):
                await log.append(rec(i))
        finally:
            await log.close()

    await write(first, 5)
    await write(second, 2)  # the same key (the default: next to the database), another chain
    caplog.set_level(logging.ERROR, "pvegate.audit")
    await write(first, 1)  # refused before: "the high-water mark ... is for another audit database"
    assert any("was written for another audit database" in r.getMessage() for r in caplog.records)
    mark = read_mark(key.with_name(key.name + ".hwm"), HeadKey.load(key))
    assert mark is not None and mark["seq"] == 6
    res = off(auditlib.verify, first)
    assert res.ok, res.problem
