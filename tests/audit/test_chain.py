"""The hash chain, group commits, tamper detection, archive and the `pvegate audit` commands."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import sqlite3
import time
import zlib
from pathlib import Path

import pytest

from gateway.cli import main as cli
from gateway.store import audit as auditlib
from gateway.store.audit import AuditLog, AuditRecord
from tests.support import sqlite_exec


async def _filled(path: Path, n: int = 30, outcome: str = "allow") -> None:
    """n calls of two records each; allowed ones stay open (no result), which archive never cuts past."""
    log = AuditLog(path)
    await log.open()
    try:
        await asyncio.gather(
            *[
                log.append(
                    AuditRecord(f"req-{i}", "received", "agent", "list_nodes", "default", None, {"i": i}),
                    AuditRecord(f"req-{i}", "decision", "agent", "list_nodes", "default", outcome, {"i": i}),
                )
                for i in range(n)
            ]
        )
    finally:
        await log.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "audit.db"
    asyncio.run(_filled(path))
    return path


def test_intact_chain_verifies_and_cli_exits_zero(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = auditlib.verify(db)
    assert res.ok and res.checked == 60 and res.last_seq == 60
    assert cli(["audit", "verify", "--db", str(db)]) == 0
    assert "OK: 60 records verified" in capsys.readouterr().out


def test_records_of_one_append_stay_together_in_order(db: Path) -> None:
    rows = auditlib.search(db, auditlib.Query())
    for a, b in zip(rows[::2], rows[1::2], strict=True):
        assert (a["request_id"], a["kind"]) == (b["request_id"], "received") or (
            a["request_id"] == b["request_id"] and [a["kind"], b["kind"]] == ["received", "decision"]
        )


async def test_concurrent_appends_share_commits(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "a.db")
    await log.open()
    try:
        await asyncio.gather(*[log.append(AuditRecord(f"r{i}", "received")) for i in range(400)])
        assert log.records == 400
        assert log.commits < 400  # group commit: waiters queued behind a commit share the next one
    finally:
        await log.close()
    assert auditlib.verify(tmp_path / "a.db").ok


async def test_append_returns_only_when_durable(tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    log = AuditLog(path)
    await log.open()
    try:
        await log.append(AuditRecord("r1", "decision", outcome="allow"))
        # another connection (another process, after a crash) sees it at once
        con = sqlite3.connect(path)
        assert con.execute("SELECT kind, outcome FROM audit").fetchall() == [("decision", "allow")]
        con.close()
    finally:
        await log.close()


@pytest.mark.parametrize(
    ("tamper", "bad_seq", "words"),
    [
        ("UPDATE audit SET outcome = 'deny' WHERE seq = 17", 17, "was changed"),
        ("UPDATE audit SET body = '{\"i\":99}' WHERE seq = 5", 5, "was changed"),
        ("UPDATE audit SET principal = 'someone-else' WHERE seq = 40", 40, "was changed"),
        ("DELETE FROM audit WHERE seq = 23", 23, "missing (deleted)"),
        ("DELETE FROM audit WHERE seq IN (30, 31, 32)", 30, "missing (deleted)"),
        ("DELETE FROM audit WHERE seq >= 58", 58, "missing (deleted)"),
    ],
)
def test_tampering_is_found_at_the_right_record(
    db: Path, tamper: str, bad_seq: int, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sqlite_exec(db, tamper)
    res = auditlib.verify(db)
    assert not res.ok
    assert res.bad_seq == bad_seq, res.problem
    assert words in (res.problem or "")
    assert cli(["audit", "verify", "--db", str(db)]) == 1
    assert f"FAILED at record {bad_seq}" in capsys.readouterr().err


def test_reordered_rows_are_found(db: Path) -> None:
    # swap the contents of records 10 and 11, keeping seq in order
    con = sqlite3.connect(db)
    r10 = con.execute("SELECT * FROM audit WHERE seq = 10").fetchone()
    r11 = con.execute("SELECT * FROM audit WHERE seq = 11").fetchone()
    con.execute("DELETE FROM audit WHERE seq IN (10, 11)")
    con.execute("INSERT INTO audit VALUES (?,?,?,?,?,?,?,?,?,?,?)", (10, *r11[1:]))
    con.execute("INSERT INTO audit VALUES (?,?,?,?,?,?,?,?,?,?,?)", (11, *r10[1:]))
    con.commit()
    con.close()
    res = auditlib.verify(db)
    assert not res.ok and res.bad_seq == 10 and "does not link" in (res.problem or "")


def test_inserted_row_is_found(db: Path) -> None:
    con = sqlite3.connect(db)
    rows = con.execute("SELECT * FROM audit WHERE seq >= 20 ORDER BY seq DESC").fetchall()
    for r in rows:  # shift everything from 20 up by one and forge a record 20 in the gap
        con.execute("UPDATE audit SET seq = seq + 1 WHERE seq = ?", (r[0],))
    prev = con.execute("SELECT hash FROM audit WHERE seq = 19").fetchone()[0]
    body = json.dumps({"forged": True})
    ts = time.time()
    h = auditlib.record_hash(prev, 20, ts, "evil", "decision", "agent", "vm_stop", None, "allow", body)
    con.execute(
        "INSERT INTO audit VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        (20, ts, "evil", "decision", "agent", "vm_stop", None, "allow", body, prev, h),
    )
    con.commit()
    con.close()
    res = auditlib.verify(db)
    # the forged record itself links correctly (the attacker recomputed it); the next one does not
    assert not res.ok and res.bad_seq == 21 and "does not link" in (res.problem or "")


async def test_archive_keeps_chain_verifiable_across_the_cut(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cutoff = auditlib.search(db, auditlib.Query(after_seq=40, limit=1))[0]["ts"]
    log = AuditLog(db)
    await log.open()  # every call settled: an open one (and what follows it) is never archived
    await log.append(
        *[AuditRecord(f"req-{i}", "result", "agent", "list_nodes", "default", "ok", {}) for i in range(30)]
    )
    await log.close()
    assert cli(["audit", "archive", "--db", str(db), "--older-than", "0s", "--out-dir", str(tmp_path / "a")]) == 0
    # records this young may hold the task claims a call decided next is reconciled against: said (stop 48)
    assert "warning: archiving records less than two hours old" in capsys.readouterr().err
    # everything was older than now: all 90 archived; new records continue the chain from the anchor
    log = AuditLog(db)
    await log.open()
    await log.append(AuditRecord("after", "decision", outcome="deny"))
    await log.close()
    res = auditlib.verify(db)
    assert res.ok and res.first_seq == 91 and res.anchor and res.anchor["seq"] == 90
    files = sorted((tmp_path / "a").glob("*.jsonl"))
    assert len(files) == 1
    assert auditlib.verify(db, files).ok and auditlib.verify(db, files).checked == 91
    # a tampered archive is caught
    lines = files[0].read_text().splitlines()
    doc = json.loads(lines[5])
    doc["outcome"] = "deny"
    lines[5] = json.dumps(doc)
    files[0].write_text("\n".join(lines) + "\n")
    bad = auditlib.verify(db, files)
    assert not bad.ok and bad.bad_seq == 5
    assert cutoff > 0


def test_archive_refuses_a_broken_chain(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    asyncio.run(_filled(db, 10, "deny"))  # settled calls: an open one keeps all its records (and what follows)
    first = auditlib.search(db, auditlib.Query(limit=1))[0]
    sqlite_exec(db, "UPDATE audit SET ts = ts - 1000 WHERE seq <= 8")  # hashes break: archive must refuse
    with pytest.raises(ValueError, match="refusing to archive"):
        auditlib.archive(db, time.time() - 500, tmp_path / "x")
    assert first["seq"] == 1


def test_two_archives_chain(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    asyncio.run(_filled(db, 5, "deny"))
    a1 = auditlib.archive(db, time.time() + 1, tmp_path / "arch")
    asyncio.run(_filled(db, 5, "deny"))
    a2 = auditlib.archive(db, time.time() + 1, tmp_path / "arch")
    asyncio.run(_filled(db, 5))
    assert a1.file and a2.file and a2.first_seq == 11
    assert auditlib.verify(db, [a1.file, a2.file]).ok
    missing_middle = auditlib.verify(db, [a1.file])
    assert not missing_middle.ok and "archive is missing" in (missing_middle.problem or "")


def test_search_tail_export(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["audit", "search", "--db", str(db), "--request-id", "req-7"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all("req-7" in line for line in out)
    assert cli(["audit", "search", "--db", str(db), "--outcome", "allow", "--since", "1h", "--jsonl"]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(docs) == 30 and all(d["outcome"] == "allow" and d["kind"] == "decision" for d in docs)
    assert cli(["audit", "search", "--db", str(db), "--until", "1h"]) == 0
    assert capsys.readouterr().out == ""
    assert cli(["audit", "tail", "--db", str(db), "-n", "3"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["58", "59", "60"]
    out_file = tmp_path / "export.jsonl"
    assert cli(["audit", "export", "--db", str(db), "--jsonl", "--out", str(out_file), "--tool", "list_*"]) == 0
    exported = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert len(exported) == 60 and exported[0]["seq"] == 1 and "hash" in exported[0] and exported[0]["time"]


def test_scrubber_removes_known_secrets(tmp_path: Path) -> None:
    secret = "pvegate@pve!ops=1b2c3d4e-aaaa-bbbb-cccc-0123456789ab"

    async def go() -> None:
        log = AuditLog(tmp_path / "s.db", secrets=[secret, "x"])  # too-short values are ignored
        await log.open()
        await log.append(
            AuditRecord("r", "result", "agent", "t", None, "failed", {"error": f"token {secret} rejected"}),
            AuditRecord("r", "result", "agent", "t", None, "failed", {"e": 'quote"d hunter22'}, scrub=('quote"d',)),
        )
        await log.close()

    asyncio.run(go())
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*"))
    assert secret.encode() not in raw and b"quote" not in raw
    assert b"[redacted]" in raw
    assert auditlib.verify(tmp_path / "s.db").ok


POISON = "\ud800"  # a lone surrogate: what a client's JSON escape "\ud800" decodes to; not encodable as UTF-8


async def test_lone_surrogates_are_stored_escaped_and_chained(tmp_path: Path) -> None:
    db = tmp_path / "u.db"
    log = AuditLog(db)
    await log.open()
    try:
        await log.append(
            AuditRecord(
                f"r{POISON}", "received", f"sub{POISON}", f"tool{POISON}", f"t{POISON}", None, {POISON: POISON}
            ),
            AuditRecord("ok", "decision", "agent", "vm_start", None, "allow", {"ünïcode": "kept as is"}),
        )
    finally:
        await log.close()
    rows = auditlib.search(db, auditlib.Query())
    assert [r["principal"] for r in rows] == ["sub\\ud800", "agent"]
    assert rows[0]["request_id"] == "r\\ud800" and rows[0]["tool"] == "tool\\ud800" and rows[0]["target"] == "t\\ud800"
    assert json.loads(rows[0]["body"]) == {POISON: POISON}  # the body's JSON escape round-trips
    assert json.loads(rows[1]["body"]) == {"ünïcode": "kept as is"}
    assert auditlib.verify(db).ok


class _UnescapedLog(AuditLog):
    """A writer whose encoding step lets a lone surrogate through, as the old one did: the
    record then fails inside the group's transaction, which must not take the others with it."""

    def _prepare(self, rec: AuditRecord, extra: tuple[str, ...], replica: str | None) -> auditlib._Row:
        row = super()._prepare(rec, extra, replica)
        return (row[0], row[1], rec.principal, *row[3:])


async def test_a_record_that_cannot_be_written_fails_only_its_own_caller(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    log = _UnescapedLog(db)
    await log.open()
    try:

        async def call(i: int) -> str:
            who = f"bad{POISON}" if i % 7 == 3 else f"agent-{i}"
            try:
                await log.append(
                    AuditRecord(f"req-{i}", "received", who, "snapshot_create"),
                    AuditRecord(f"req-{i}", "decision", who, "snapshot_create", None, "allow"),
                )
            except UnicodeEncodeError:
                return "refused"
            return "written"

        outcomes = await asyncio.gather(*[call(i) for i in range(40)])  # all queued before the writer wakes
    finally:
        await log.close()
    assert outcomes == ["refused" if i % 7 == 3 else "written" for i in range(40)]
    rows = auditlib.search(db, auditlib.Query())
    written = {r["request_id"] for r in rows}
    assert written == {f"req-{i}" for i in range(40) if i % 7 != 3}
    assert len(rows) == 2 * len(written)
    assert auditlib.verify(db).ok


async def test_kept_policy_input_is_scrubbed_packed_and_chained(tmp_path: Path) -> None:
    """The compressed input is scrubbed before packing (the scrubber cannot see into it) and hashed."""
    path = tmp_path / "audit.db"
    secret = "KeptInputSecret-" + "9f3e1a7c"
    audit = AuditLog(path, secrets=["GatewayOwnSecret-12345"])
    await audit.open()
    doc = {"arguments": {"note": f"x {secret} y", "other": "GatewayOwnSecret-12345"}, "tool": {"name": "t"}}
    await audit.append(
        AuditRecord("r1", "decision", "p", "t", None, "allow", {"allow": True}, scrub=(secret,), policy_input=doc)
    )
    await audit.close()
    con = sqlite3.connect(path)
    body = json.loads(con.execute("SELECT body FROM audit WHERE kind='decision'").fetchone()[0])
    con.close()
    kept = auditlib.unpack_input(body)
    assert kept == {"arguments": {"note": "x [redacted] y", "other": "[redacted]"}, "tool": {"name": "t"}}
    assert body["allow"] is True and secret not in json.dumps(body)
    assert auditlib.verify(path).ok
    # the packed text is inside the chain: changing it breaks verification at that record
    body[auditlib.INPUT_FIELD] = auditlib.pack_input(json.dumps({"arguments": {}}))
    packed = json.dumps(body, sort_keys=True, separators=(",", ":"))
    sqlite_exec(path, f"UPDATE audit SET body = '{packed}' WHERE seq = 1")
    bad = auditlib.verify(path)
    assert not bad.ok and bad.bad_seq == 1


def test_redacted_paths_name_what_the_audit_cannot_show() -> None:
    orig = {"vmid": 1, "cipassword": "pw", "nested": {"sshkeys": ["a", "b"], "ok": 1}}
    red = {"vmid": 1, "cipassword": "[redacted]", "nested": {"sshkeys": "[redacted]", "ok": 1}}
    assert auditlib.redacted_paths(orig, red) == ["arguments.cipassword", "arguments.nested.sshkeys"]
    assert auditlib.redacted_paths(orig, orig) == []


def test_archive_lets_gateways_append_while_it_reads_and_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Archiving a large live database: only the delete takes the writer's lock. While the file
    is written, another writer gets the lock at once and a gateway's appends land; they stay in
    the database after the cut, and the chain verifies across it."""
    db = tmp_path / "live.db"
    asyncio.run(_filled(db, 10, "deny"))
    cut = time.time() + 1
    line = auditlib._archive_line
    seen: list[int] = []

    def writing(row: dict[str, object]) -> str:
        if not seen:
            seen.append(1)
            con = sqlite3.connect(db, timeout=0.3, isolation_level=None)
            con.execute("BEGIN IMMEDIATE")  # "database is locked" if the archive held the lock
            con.execute("ROLLBACK")
            con.close()
            asyncio.run(_filled(db, 3))  # a gateway's commits, during the archive
        return line(row)

    monkeypatch.setattr(auditlib, "_archive_line", writing)
    done = auditlib.archive(db, cut, tmp_path / "arch")
    assert seen and done.file and (done.first_seq, done.last_seq) == (1, 20)  # 10 calls x 2 records
    res = auditlib.verify(db, [done.file])
    assert res.ok and res.checked == 26 and res.first_seq == 21, res.problem  # + 6 written meanwhile


def test_archive_refuses_when_another_moved_the_anchor_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "race.db"
    asyncio.run(_filled(db, 5, "deny"))
    line = auditlib._archive_line
    inner: list[auditlib.ArchiveResult] = []
    started: list[int] = []

    def racing(row: dict[str, object]) -> str:
        if not started:  # the first archive, mid-write: a second one runs to completion
            started.append(1)
            inner.append(auditlib.archive(db, time.time() + 1, tmp_path / "other"))
        return line(row)

    monkeypatch.setattr(auditlib, "_archive_line", racing)
    with pytest.raises(ValueError, match="another archive moved the chain's anchor"):
        auditlib.archive(db, time.time() + 1, tmp_path / "mine")
    assert list((tmp_path / "mine").glob("*.jsonl")) == []  # its file is gone; nothing was deleted for it
    assert inner[0].file and auditlib.verify(db, [inner[0].file]).ok


def test_packed_inputs_round_trip_and_read_with_zlib_defaults() -> None:
    """The packed input uses a small window for speed: any size still round-trips, an operator's plain
    zlib.decompress reads it, and records packed with zlib's defaults (earlier releases) still unpack."""
    rng = random.Random(7)
    for size in (0, 10, 900, 4_000, 70_000):
        doc = {"args": "".join(rng.choice("abcdef0123456789é\u2603") for _ in range(size)), "n": size}
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        packed = auditlib.pack_input(text)
        assert auditlib.unpack_input({auditlib.INPUT_FIELD: packed}) == doc
        assert zlib.decompress(base64.b64decode(packed)).decode("utf-8") == text
        older = base64.b64encode(zlib.compress(text.encode("utf-8"), 6)).decode("ascii")
        assert auditlib.unpack_input({auditlib.INPUT_FIELD: older}) == doc


# --- what verify checks beyond the chain: the file's soundness and schema; export of unreadable records ---


def _lying_index(db: Path) -> None:
    """A partial index (missing record 8) rewritten below SQL to look complete: filtered readers use it."""
    con = sqlite3.connect(db)
    try:
        con.execute("CREATE INDEX audit_kind ON audit(kind) WHERE seq <> 8")
        con.execute("ANALYZE")
        con.execute("PRAGMA writable_schema=ON")
        con.execute("UPDATE sqlite_master SET sql='CREATE INDEX audit_kind ON audit(kind)' WHERE name='audit_kind'")
        con.commit()
    finally:
        con.close()


def test_verify_fails_on_an_index_that_lies_to_filtered_readers(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _lying_index(db)
    decisions = [r["seq"] for r in auditlib.search(db, auditlib.Query(kind="decision"))]
    assert 8 not in decisions  # what a filtered reader (search, export, replay) sees through it
    res = auditlib.verify(db)
    assert not res.ok and "PRAGMA integrity_check" in str(res.problem) and "audit_kind" in str(res.problem)
    assert cli(["audit", "verify", "--db", str(db)]) == 1
    assert "integrity_check" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("stmt", "said"),
    [
        ("CREATE INDEX audit_kind ON audit(kind)", "index 'audit_kind' (on audit) that pvegate does not make"),
        ("CREATE TRIGGER t AFTER INSERT ON audit BEGIN SELECT 1; END", "trigger 't' (on audit)"),
        ("CREATE VIEW v AS SELECT * FROM audit", "view 'v'"),
        ("CREATE TABLE audit_extra (x)", "table 'audit_extra'"),
        (
            "ALTER TABLE audit ADD COLUMN reviewed_by TEXT",
            "the audit table has columns pvegate does not make (reviewed_by)",
        ),
        ("DROP INDEX audit_ts", None),  # missing: slower reads, never a wrong one
    ],
)
def test_verify_fails_on_objects_and_columns_pvegate_does_not_make(db: Path, stmt: str, said: str | None) -> None:
    sqlite_exec(db, stmt)
    res = auditlib.verify(db)
    if said is None:
        assert res.ok, res.problem
    else:
        assert not res.ok and said in str(res.problem), res.problem


def test_verify_fails_on_an_index_redefined_under_a_known_name(db: Path) -> None:
    sqlite_exec(db, "DROP INDEX audit_ts", "CREATE INDEX audit_ts ON audit(kind)")
    res = auditlib.verify(db)
    assert not res.ok and "index 'audit_ts' is not the one pvegate makes" in str(res.problem)


def test_verify_allows_sqlite_statistics_and_a_gateways_whole_file(db: Path, tmp_path: Path) -> None:
    sqlite_exec(db, "ANALYZE")
    assert auditlib.verify(db).ok


def test_verify_fails_on_a_newer_audit_schema(db: Path) -> None:
    sqlite_exec(db, "UPDATE pvegate_schema SET version = 99 WHERE component = 'audit'")
    res = auditlib.verify(db)
    assert not res.ok and "version 99, newer than this pvegate knows" in str(res.problem)


def test_export_keeps_only_the_records_columns(db: Path, tmp_path: Path) -> None:
    sqlite_exec(db, "ALTER TABLE audit ADD COLUMN reviewed_by TEXT", "UPDATE audit SET reviewed_by = 'leak'")
    out = tmp_path / "x.jsonl"
    assert cli(["audit", "export", "--db", str(db), "--jsonl", "--out", str(out), "--kind", "decision"]) == 0
    docs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(docs) == 30 and all("reviewed_by" not in d for d in docs)
    assert set(docs[0]) == {*auditlib.COLUMNS, "time"}


def test_a_body_that_is_not_json_is_a_sentence_naming_the_record_and_no_partial_export(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record written by a release whose text-level scrub broke its JSON: readers say which, never crash."""
    sqlite_exec(db, "UPDATE audit SET body = '[redacted]\"i\":7}' WHERE seq = 14")
    out = tmp_path / "x.jsonl"
    assert cli(["audit", "export", "--db", str(db), "--jsonl", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "record 14 (request req-6, decision)" in err and "not a JSON object" in err and "Traceback" not in err
    assert not out.exists() and list(tmp_path.glob("*.jsonl*")) == []  # nothing partial left behind
    assert cli(["audit", "export", "--db", str(db), "--jsonl"]) == 1
    assert "record 14" in capsys.readouterr().err
    assert cli(["audit", "search", "--db", str(db), "--jsonl"]) == 1
    assert "record 14" in capsys.readouterr().err
    assert cli(["audit", "search", "--db", str(db)]) == 0  # a listing shows it, and says so
    assert "body is not a JSON object" in capsys.readouterr().out
    assert cli(["audit", "tail", "--db", str(db), "-n", "100"]) == 0


async def test_rows_and_console_sign_ins_read_past_a_body_that_is_not_json(db: Path) -> None:
    sqlite_exec(
        db,
        "UPDATE audit SET body = 'x' WHERE seq = 3",
        "UPDATE audit SET kind = 'console', outcome = 'ok', ts = 1e12 WHERE seq = 3",
    )
    log = AuditLog(db)
    await log.open()
    try:
        assert await log.console_sign_ins(0) == set()
        with pytest.raises(auditlib.AuditDataError, match="record 3"):
            await log.rows()
    finally:
        await log.close()
