"""The authenticated head (issue #14, finding 5): edits made with plain SQL, without the key,
are found by `verify`, always as a sentence; checkpoints; the key's life; older databases."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from gateway.cli import main as cli
from gateway.store import audit as auditlib
from gateway.store.audit import AuditIntegrityError, AuditLog, AuditRecord
from gateway.store.audit_seal import AuditKeyError, HeadKey
from tests.support import sqlite_exec


async def _fill(path: Path, n: int, prefix: str = "req", outcome: str = "allow") -> None:
    """n calls of two records each; allowed ones stay open (no result), which archive never cuts past."""
    log = AuditLog(path)
    await log.open()
    try:
        for i in range(n):
            await log.append(
                AuditRecord(f"{prefix}-{i}", "received", "agent", "list_nodes", "default", None, {"i": i}),
                AuditRecord(f"{prefix}-{i}", "decision", "agent", "list_nodes", "default", outcome, {"i": i}),
            )
    finally:
        await log.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "audit.db"
    asyncio.run(_fill(path, 30))  # records 1..60
    return path


def _fails_with_a_sentence(db: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    res = auditlib.verify(db)
    assert not res.ok and res.problem
    assert cli(["audit", "verify", "--db", str(db), *extra]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("FAILED") and "Traceback" not in captured.err + captured.out
    return res.problem


def test_a_healthy_database_verifies(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = auditlib.verify(db)
    assert res.ok and res.checked == 60 and (res.first_seq, res.last_seq) == (1, 60)
    assert res.sealed_at is None
    assert cli(["audit", "verify", "--db", str(db)]) == 0
    assert "OK: 60 records verified, records 1..60; authenticated head" in capsys.readouterr().out
    key = (db.parent / "audit-head.key").stat()
    assert key.st_mode & 0o777 == 0o600


TAMPERING = {
    "delete the last rows and the head": (
        ["DELETE FROM audit WHERE seq >= 55", "DELETE FROM audit_meta WHERE key = 'head'"],
        "head (audit_meta 'head') is missing",
    ),
    "delete everything": (["DELETE FROM audit", "DELETE FROM audit_meta"], "no creation marker"),
    "delete every record": (["DELETE FROM audit"], "record 1..60 is missing"),
    "drop audit_meta and delete the last row": (
        ["DROP TABLE audit_meta", "DELETE FROM audit WHERE seq = 60"],
        "no creation marker",
    ),
    "point the head at an earlier row and cut the rest": (
        [
            "DELETE FROM audit WHERE seq > 40",
            "UPDATE audit_meta SET value = json_set(value, '$.seq', 40, '$.hash', "
            "(SELECT hash FROM audit WHERE seq = 40)) WHERE key = 'head'",
        ],
        "not authenticated by the audit head key",
    ),
    "copy the head's MAC onto a forged head": (
        [
            "DELETE FROM audit WHERE seq > 40",
            "UPDATE audit_meta SET value = json_object('seq', 40, 'hash', (SELECT hash FROM audit WHERE seq = 40), "
            "'mac', json_extract(value, '$.mac')) WHERE key = 'head'",
        ],
        "not authenticated",
    ),
    "forge an anchor at row 10 and delete rows 1-10": (
        [
            "INSERT INTO audit_meta VALUES ('anchor', json_object('seq', 10, 'hash', "
            "(SELECT hash FROM audit WHERE seq = 10)))",
            "DELETE FROM audit WHERE seq <= 10",
        ],
        "archive anchor (audit_meta 'anchor') is not authenticated",
    ),
    "garbled head": (["UPDATE audit_meta SET value = '{not json' WHERE key = 'head'"], "garbled"),
    "head of the wrong shape": (["UPDATE audit_meta SET value = '[60]' WHERE key = 'head'"], "garbled"),
    "head without a number": (
        ["UPDATE audit_meta SET value = json_set(value, '$.seq', 'sixty') WHERE key = 'head'"],
        "garbled",
    ),
    "garbled creation marker": (["UPDATE audit_meta SET value = 'x' WHERE key = 'created'"], "garbled"),
    "replace the creation marker": (
        ["UPDATE audit_meta SET value = json_set(value, '$.ts', 0) WHERE key = 'created'"],
        "creation marker (audit_meta 'created') is not authenticated",
    ),
}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_tampering_without_the_key_fails_verify_with_a_sentence(
    db: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stmts, words = TAMPERING[case]
    assert auditlib.verify(db).ok
    sqlite_exec(db, *stmts)
    problem = _fails_with_a_sentence(db, capsys)
    assert words in problem, problem


@pytest.mark.parametrize("case", ["delete the last rows and the head", "delete every record", "garbled head"])
def test_the_writer_never_extends_a_tampered_chain(db: Path, case: str) -> None:
    sqlite_exec(db, *TAMPERING[case][0])

    async def reopen() -> None:
        log = AuditLog(db)
        await log.open()
        await log.close()

    with pytest.raises(AuditIntegrityError):
        asyncio.run(reopen())
    assert not auditlib.verify(db).ok  # and nothing re-authenticated the cut chain


async def test_a_running_writer_never_reseals_a_cut_chain(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    log = AuditLog(path)
    await log.open()
    try:
        await log.append(*[AuditRecord(f"r{i}", "decision", outcome="allow") for i in range(10)])
        sqlite_exec(path, "DELETE FROM audit WHERE seq >= 8")  # another hand cuts the end while the gateway runs
        await log.append(AuditRecord("after", "decision", outcome="allow"))  # continues from the head: 11
        sqlite_exec(path, "DELETE FROM audit_meta WHERE key = 'head'")  # no authenticated head: nowhere to continue
        with pytest.raises(AuditIntegrityError, match=r"head .* is missing"):
            await log.append(AuditRecord("lost", "decision", outcome="allow"))
    finally:
        await log.close()
    seqs = [r["seq"] for r in auditlib.search(path, auditlib.Query())]
    assert seqs == [1, 2, 3, 4, 5, 6, 7, 11]
    res = auditlib.verify(path)
    assert not res.ok and res.problem and "missing" in res.problem


def test_a_checkpoint_catches_records_removed_after_it(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cp = tmp_path / "cp.json"
    assert cli(["audit", "checkpoint", "--db", str(db), "--out", str(cp)]) == 0
    doc = json.loads(cp.read_text())
    assert doc["type"] == "pvegate-audit-checkpoint" and doc["seq"] == 60 and len(doc["mac"]) == 64
    assert doc["hash"] == auditlib.search(db, auditlib.Query(newest_first=True, limit=1))[0]["hash"]
    assert cli(["audit", "verify", "--db", str(db), "--checkpoint", str(cp)]) == 0
    assert "checkpoint's record 60 is present and unchanged" in capsys.readouterr().out
    sqlite_exec(db, "DELETE FROM audit WHERE seq >= 59")
    problem = _fails_with_a_sentence(db, capsys, "--checkpoint", str(cp))
    assert "missing" in problem


def test_a_checkpoint_catches_an_older_copy_put_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "audit.db"
    asyncio.run(_fill(db, 5))
    old = tmp_path / "old-copy.db"
    shutil.copy(db, old)  # a copy taken now (no WAL left after close): records 1..10
    asyncio.run(_fill(db, 5, "later"))
    cp = tmp_path / "cp.json"
    assert cli(["audit", "checkpoint", "--db", str(db)]) == 0
    cp.write_text(capsys.readouterr().out)
    shutil.copy(old, db)  # the later records vanish, the old head is authentic on its own
    res = auditlib.verify(db)  # below the high-water mark kept next to the key
    assert not res.ok and res.bad_seq == 11 and "records at the end are missing" in (res.problem or "")
    (db.parent / "audit-head.key.hwm").unlink()  # whoever holds the key's directory too: only a checkpoint sees it
    assert auditlib.verify(db).ok
    res = auditlib.verify(db, checkpoint=cp)
    assert not res.ok and res.bad_seq == 11 and "older copy" in (res.problem or "")
    # a checkpoint edited by hand, or of another database, is refused too
    forged = json.loads(cp.read_text()) | {"seq": 10}
    cp.write_text(json.dumps(forged))
    assert "not authenticated" in (auditlib.verify(db, checkpoint=cp).problem or "")
    other = tmp_path / "other" / "audit.db"
    asyncio.run(_fill(other, 1))
    shutil.copy(db.parent / "audit-head.key", other.parent / "audit-head.key")  # same key, other database
    assert cli(["audit", "checkpoint", "--db", str(db), "--out", str(cp)]) == 0
    res = auditlib.verify(other, checkpoint=cp)
    assert (
        not res.ok and res.problem and ("another audit database" in res.problem or "sealed with another" in res.problem)
    )


def test_key_missing_wrong_or_loose_is_a_clear_error(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = db.parent / "audit-head.key"
    moved = tmp_path / "elsewhere.key"
    key.rename(moved)
    res = auditlib.verify(db)
    assert not res.ok and f"the audit head key file {key} is missing" in (res.problem or "")
    _fails_with_a_sentence(db, capsys)
    assert cli(["audit", "verify", "--db", str(db), "--key", str(moved)]) == 0  # a key kept elsewhere
    capsys.readouterr()
    with pytest.raises(AuditKeyError, match="is missing"):  # the gateway does not start without it
        asyncio.run(_fill(db, 1))
    HeadKey.create(key)  # a different key
    res = auditlib.verify(db)
    assert not res.ok and "sealed with another audit head key" in (res.problem or "")
    key.unlink()
    moved.rename(key)
    key.chmod(0o644)
    assert "chmod 600" in (auditlib.verify(db).problem or "")
    key.chmod(0o600)
    key.write_text("not hex\n")
    assert "not a hex-encoded key" in (auditlib.verify(db).problem or "")


def test_unreadable_inputs_are_sentences(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    HeadKey.create(tmp_path / "audit-head.key")
    assert "cannot be read as an audit database" in (auditlib.verify(junk).problem or "")
    _fails_with_a_sentence(junk, capsys)
    assert "no audit database" in (auditlib.verify(tmp_path / "none.db").problem or "")
    cp = tmp_path / "cp.json"
    cp.write_text("{")
    db = tmp_path / "audit.db"
    asyncio.run(_fill(db, 1))
    assert "is not JSON" in (auditlib.verify(db, checkpoint=cp).problem or "")
    arch = tmp_path / "a.jsonl"
    arch.write_text("garbage\n")
    assert "never archived" in (auditlib.verify(db, [arch]).problem or "")
    sqlite_exec(db, "INSERT INTO audit_meta VALUES ('anchor', 'x')")
    assert "garbled" in (auditlib.verify(db).problem or "")


def test_archives_are_needed_for_the_anchor_and_carry_their_own_mac(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "audit.db"
    asyncio.run(_fill(db, 30, outcome="deny"))  # records 1..60, no call left open
    out = tmp_path / "arch"
    res = auditlib.archive(db, time.time() + 1, out)
    assert res.file is not None and res.count == 60
    asyncio.run(_fill(db, 2, "after"))
    ok = auditlib.verify(db)  # the archive the database lists is found where it was written
    assert ok.ok and ok.checked == 64 and ok.archives == [str(res.file)]
    header = json.loads(res.file.read_text().splitlines()[0])
    assert header["format"] == 2 and len(header["mac"]) == 64
    # the anchor without its archive is not accepted
    moved = tmp_path / "moved.jsonl"
    res.file.rename(moved)
    problem = _fails_with_a_sentence(db, capsys)
    assert "needs the archive the anchor points to" in problem
    assert cli(["audit", "verify", "--db", str(db), "--archive", str(moved)]) == 0
    capsys.readouterr()
    # an archive header edited by hand is refused
    lines = moved.read_text().splitlines()
    lines[0] = json.dumps(header | {"count": 59})
    moved.write_text("\n".join(lines) + "\n")
    bad = auditlib.verify(db, [moved])
    assert not bad.ok and "header is not authenticated" in (bad.problem or "")


def _legacy_db(path: Path, n: int) -> None:
    """A database as the release before keyed heads wrote it: chained rows and an unsigned head."""
    con = sqlite3.connect(path)
    con.executescript(auditlib.SCHEMA)
    prev = auditlib.GENESIS
    for seq in range(1, n + 1):
        row = (seq, time.time(), f"r{seq}", "decision", "agent", "list_nodes", None, "allow", "{}")
        digest = auditlib.record_hash(prev, *row)
        con.execute("INSERT INTO audit VALUES (?,?,?,?,?,?,?,?,?,?,?)", (*row, prev, digest))
        prev = digest
    con.execute("INSERT INTO audit_meta VALUES ('head', ?)", (json.dumps({"seq": n, "hash": prev}),))
    con.commit()
    con.close()


async def test_an_older_database_is_sealed_once_after_its_chain_verifies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "old.db"
    _legacy_db(db, 12)
    res = auditlib.verify(db)
    assert not res.ok and "no creation marker" in (res.problem or "")
    caplog.set_level(logging.WARNING, "pvegate.audit")
    log = AuditLog(db)
    await log.open()
    await log.append(AuditRecord("new", "decision", outcome="allow"))
    await log.close()
    assert "generated a new audit head key" in caplog.text
    assert "sealed the existing audit chain (records up to 12, verified)" in caplog.text
    res = auditlib.verify(db)
    assert res.ok and res.checked == 13 and res.sealed_at == 12


@pytest.mark.parametrize(
    ("tamper", "words"),
    [
        ("DELETE FROM audit WHERE seq = 12", "not at the head its writer recorded"),
        ("UPDATE audit SET outcome = 'deny' WHERE seq = 5", "record 5 was changed"),
    ],
)
def test_an_older_database_with_a_broken_chain_is_not_sealed(tmp_path: Path, tamper: str, words: str) -> None:
    db = tmp_path / "old.db"
    _legacy_db(db, 12)
    sqlite_exec(db, tamper)
    with pytest.raises(AuditIntegrityError, match=words):
        asyncio.run(_fill(db, 1))
    con = sqlite3.connect(db)
    assert con.execute("SELECT COUNT(*) FROM audit_meta WHERE key = 'created'").fetchone() == (0,)
    con.close()


def test_an_existing_key_never_seals_records_without_a_marker(db: Path) -> None:
    # dropping audit_meta must not get a cut chain re-sealed on the next start
    sqlite_exec(db, "DROP TABLE audit_meta", "DELETE FROM audit WHERE seq >= 50")
    with pytest.raises(AuditIntegrityError, match="already exists"):
        asyncio.run(_fill(db, 1))
    assert not auditlib.verify(db).ok


async def test_an_older_archived_database_is_sealed_and_verifies_with_its_unkeyed_archive(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    _legacy_db(db, 12)
    # archive records 1..8 as the older release did: a format-1 header without a MAC, an unsigned anchor
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    rows = [dict(r) for r in con.execute("SELECT * FROM audit WHERE seq <= 8 ORDER BY seq")]
    last = {"seq": 8, "hash": rows[-1]["hash"]}
    header = {
        "type": "pvegate-audit-archive",
        "format": 1,
        "anchor": {"seq": 0, "hash": auditlib.GENESIS},
        "first": {"seq": 1, "hash": rows[0]["hash"]},
        "last": last,
        "count": 8,
    }
    arch = tmp_path / "audit-000000000001-000000000008.jsonl"
    arch.write_text("\n".join([json.dumps(header)] + [json.dumps(r) for r in rows]) + "\n")
    con.execute("DELETE FROM audit WHERE seq <= 8")
    con.execute(
        "INSERT INTO audit_meta VALUES ('anchor', ?), ('archives', ?)",
        (json.dumps(last), json.dumps([{"file": str(arch)}])),
    )
    con.commit()
    con.close()
    await _fill(db, 1)  # seals: chain 9..12 from the (then trusted) anchor, head 12; appends 13, 14
    res = auditlib.verify(db)
    assert res.ok and res.checked == 14 and res.sealed_at == 12 and res.archives == [str(arch)]
    # the sealed anchor now needs that archive, and the unkeyed archive must start at the beginning
    arch.write_text("\n".join(arch.read_text().splitlines()[:1] + arch.read_text().splitlines()[2:]) + "\n")
    bad = auditlib.verify(db)
    assert not bad.ok and "record 1 is missing" in (bad.problem or "")


def test_verify_reads_the_head_and_the_records_from_one_snapshot(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`GET /admin/audit/verify` runs against a live database: a commit landing just after verify
    read the head must not be reported as records added outside the gateway."""
    read_meta = auditlib._meta_all
    landed: list[bool] = []

    def meta_then_a_commit(con: sqlite3.Connection) -> dict[str, str]:
        meta = read_meta(con)
        if not landed:  # the gateway commits right after verify read the head (once)
            landed.append(True)
            asyncio.run(_fill(db, 1, "live"))
        return meta

    monkeypatch.setattr(auditlib, "_meta_all", meta_then_a_commit)
    res = auditlib.verify(db)
    assert landed and res.ok, res.problem
    assert res.last_seq == 60  # what the snapshot held
    monkeypatch.undo()
    res = auditlib.verify(db)
    assert res.ok and res.last_seq == 62, res.problem


def test_an_emptied_database_is_never_resealed_under_the_existing_key(db: Path) -> None:
    """Deleting every record and audit_meta (or truncating the file) needs no key; a restart must not
    then seal the empty file as a new chain, which would make verify pass on the laundered log."""
    sqlite_exec(db, *TAMPERING["delete everything"][0])
    with pytest.raises(AuditIntegrityError, match="no records and no creation marker"):
        asyncio.run(_fill(db, 1))
    assert not auditlib.verify(db).ok
    with db.open("r+b") as fh:  # the file cut to nothing: SQLite takes it for a new, empty database
        fh.truncate(0)
    with pytest.raises(AuditIntegrityError, match="no records and no creation marker"):
        asyncio.run(_fill(db, 1))
    res = auditlib.verify(db)
    assert not res.ok and res.problem and "no creation marker" in res.problem


def test_a_database_moved_aside_starts_a_new_chain_under_the_same_key(
    db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key_id = HeadKey.load(db.parent / "audit-head.key").key_id
    db.rename(db.parent / "evidence.db")
    with caplog.at_level(logging.WARNING, logger="pvegate.audit"):
        asyncio.run(_fill(db, 2))
    assert f"started a new audit chain with the existing audit head key (key id {key_id})" in caplog.text
    res = auditlib.verify(db)
    assert res.ok and res.last_seq == 4, res.problem


def test_a_first_start_refused_for_a_loose_key_leaves_nothing_to_trip_over(tmp_path: Path) -> None:
    """A key made by hand before the first start, too widely readable: refused without creating the
    database, so once it is chmod 600 the next start seals a new chain."""
    db, key = tmp_path / "audit.db", tmp_path / "audit-head.key"
    key.write_text(HeadKey.create(tmp_path / "made.key").path.read_text())
    key.chmod(0o644)
    with pytest.raises(AuditKeyError, match="chmod 600"):
        asyncio.run(_fill(db, 1))
    assert not db.exists()
    key.chmod(0o600)
    asyncio.run(_fill(db, 1))
    res = auditlib.verify(db)
    assert res.ok and res.last_seq == 2, res.problem


async def test_a_running_writer_never_continues_from_an_older_head_put_back(tmp_path: Path) -> None:
    """An old head is authentic (the key signed it); put back over a cut end while the gateway runs,
    continuing from it would authenticate a chain with the cut records simply gone."""
    path = tmp_path / "w.db"
    log = AuditLog(path)
    await log.open()
    try:
        await log.append(*[AuditRecord(f"r{i}", "decision", outcome="allow") for i in range(10)])
        old_head = auditlib.connect(path).execute("SELECT value FROM audit_meta WHERE key = 'head'").fetchone()[0]
        await log.append(*[AuditRecord(f"s{i}", "decision", outcome="allow") for i in range(10)])
        con = sqlite3.connect(path)
        con.execute("DELETE FROM audit WHERE seq > 10")
        con.execute("UPDATE audit_meta SET value = ? WHERE key = 'head'", (old_head,))
        con.commit()
        con.close()
        with pytest.raises(AuditIntegrityError, match="went back from record 20 to record 10"):
            await log.append(AuditRecord("after", "decision", outcome="allow"))
    finally:
        await log.close()
    assert [r["seq"] for r in auditlib.search(path, auditlib.Query())] == list(range(1, 11))
