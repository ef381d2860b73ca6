"""A record damaged below SQL (text that is not UTF-8, a BLOB, a time that is no time, a body nested past
the parser) is named by `verify` ("record N was changed"), and stops `export` and `search --jsonl` with a
sentence naming it (exit 1), while `tail` and `search` list it as damaged: never a traceback."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gateway.admin.api import _record
from gateway.cli import main as cli
from gateway.store import audit as auditlib
from gateway.store.audit import AuditLog, AuditRecord

DAMAGE = {
    "body_non_utf8": (
        "UPDATE audit SET body = CAST(x'7b2261223a22ff227d' AS TEXT) WHERE seq = 5",
        5,
        "body is not UTF-8",
    ),
    "hash_non_utf8": ("UPDATE audit SET hash = CAST(x'ff00ff' AS TEXT) WHERE seq = 7", 7, "hash is not UTF-8"),
    "request_id_non_utf8": ("UPDATE audit SET request_id = CAST(x'c3' AS TEXT) WHERE seq = 9", 9, "request_id is not"),
    "body_blob": ("UPDATE audit SET body = x'7b7d' WHERE seq = 5", 5, "body is a BLOB"),
    "ts_text": ("UPDATE audit SET ts = 'yesterday' WHERE seq = 6", 6, "time is not a number"),
    "ts_huge": ("UPDATE audit SET ts = 1e308 WHERE seq = 6", 6, "time is out of range"),
    "ts_inf": ("UPDATE audit SET ts = 9e999 WHERE seq = 6", 6, "time is out of range"),
    "body_deep": ("UPDATE audit SET body = '" + "[" * 100000 + "]" * 100000 + "' WHERE seq = 4", 4, "body"),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import asyncio

    db = tmp_path_factory.mktemp("damaged-base") / "audit.db"

    async def fill() -> None:
        log = AuditLog(db)
        await log.open()
        try:
            for i in range(12):
                await log.append(AuditRecord(f"req-{i}", "received", "agent", "list_nodes", "default", None, {"i": i}))
        finally:
            await log.close()

    asyncio.run(fill())
    return db


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_record_is_named_and_never_a_traceback(
    base: Path, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    stmt, seq, words = DAMAGE[case]
    for f in base.parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    db = tmp_path / "audit.db"
    con = sqlite3.connect(db)
    con.execute(stmt)
    con.commit()
    con.close()
    res = auditlib.verify(db)
    assert not res.ok and res.bad_seq == seq and f"record {seq} was changed" in (res.problem or ""), res.problem
    capsys.readouterr()
    for args in (["export", "--jsonl"], ["search", "--jsonl"], ["tail", "--jsonl", "-n", "20"]):
        assert cli(["audit", *args, "--db", str(db)]) == 1, args
        err = capsys.readouterr().err
        assert f"error: record {seq} (request " in err and words in err and "Traceback" not in err, err
    out_file = tmp_path / "out.jsonl"
    assert cli(["audit", "export", "--jsonl", "--db", str(db), "--out", str(out_file)]) == 1
    assert not out_file.exists()
    for args in (["tail", "-n", "20"], ["search"]):
        assert cli(["audit", *args, "--db", str(db)]) == 0, args
        lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.split("  ", 1)[0] == str(seq)]
        assert len(lines) == 1 and ("damaged" in lines[0] or "not a JSON object" in lines[0]), lines
    # the admin API's records page shows the record as an error instead of failing
    rows = auditlib.search(db, auditlib.Query(newest_first=True, limit=50))
    shown = [_record(r) for r in rows]
    bad = [r for r in shown if r.get("seq") == seq]
    assert len(bad) == 1 and "error" in bad[0] and words in bad[0]["error"], bad
