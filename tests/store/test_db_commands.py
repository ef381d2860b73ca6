"""The operator's database commands (`pvegate db upgrade | status | migrate-from-sqlite`) on what goes
wrong: a cut SQLite chain, a head key that must not be made, state beyond the audit, a database that
cannot be reached or used, a new SQLite file, and a gateway still writing during a move."""

from __future__ import annotations

import asyncio
import os
import resource
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway.core.config import load
from gateway.store import audit as auditlib
from gateway.store import migrate
from gateway.store.audit import AuditIntegrityError, AuditLog, AuditRecord
from gateway.store.audit_seal import HeadKey, mark_path, read_mark
from gateway.store.db import PostgresDatabase, SqliteDatabase, refusal
from gateway.store.handoffs import MIGRATIONS as HANDOFFS
from gateway.store.handoffs import SharedStates
from gateway.store.migrations import check
from gateway.store.pgsync import PgLocation
from gateway.store.shared_keys import MIGRATIONS as KEYS
from gateway.store.shared_keys import shared_key
from tests.config.conftest import PVEGATE, REPO_ROOT, minimal, run_pvegate, write
from tests.pgserver import PostgresServer
from tests.store.auditstore import off


async def sqlite_install(root: Path, n: int = 3) -> tuple[Path, Path]:
    """A single-host installation's audit (n records) and its head key, as a gateway leaves them."""
    db, key = root / "state" / "audit.db", root / "state" / "audit-head.key"
    log = AuditLog(db, head_key=key)
    await log.open()
    await log.append(*(AuditRecord(f"r{i}", "decision", outcome="allow") for i in range(n)))
    await log.close()
    return db, key


def _backup(src: Path, dst: Path) -> None:
    a, b = sqlite3.connect(src), sqlite3.connect(dst)
    try:
        a.backup(b)
    finally:
        b.close()
        a.close()


async def cut_install(root: Path) -> tuple[Path, Path]:
    """An installation whose newest records were cut by putting an older copy (an authentic head) back."""
    db, key = await sqlite_install(root, 5)
    await asyncio.to_thread(_backup, db, root / "old.db")
    log = AuditLog(db, head_key=key)
    await log.open()
    await log.append(*(AuditRecord(f"late{i}", "decision", outcome="allow") for i in range(5)))
    await log.close()  # the high-water mark next to the key: record 10
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    (root / "old.db").replace(db)
    return db, key


def pg_config(root: Path, url: str, key: Path | None = None) -> Path:
    """A configuration naming PostgreSQL; its head key elsewhere (`key`), by default in state_dir."""
    raw = minimal(root)
    raw["storage"] = {"url": url}
    if key is not None:
        raw["audit"] = {"head_key_file": str(key)}
    return write(root, raw)


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: "), r.stderr
    return r.stderr.strip()


# --- migrate-from-sqlite -----------------------------------------------------------------------------


async def test_a_cut_sqlite_audit_is_refused_by_its_own_high_water_mark(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """The mark next to the source's key is read even when the configuration's key is elsewhere (and not
    there yet, the documented copy path): nothing is moved, and no key is left at the configuration's place."""
    db, key = await cut_install(tmp_path / "single")
    assert not off(auditlib.verify, db, key=key).ok  # control: verify with its own key sees the cut
    url = await postgres.create_database("d_")
    dst_key = tmp_path / "pg" / "keys" / "audit-head.key"
    cfg = pg_config(tmp_path / "pg", url, dst_key)
    r = await asyncio.to_thread(run_pvegate, "db", "migrate-from-sqlite", "--from", str(db), "--config", str(cfg))
    err = one_line_error(r)
    assert "records at the end are missing" in err and str(mark_path(key)) in err, err
    assert not dst_key.exists() and not mark_path(dst_key).exists()
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval("SELECT to_regclass('audit')") is None  # nothing written there at all
    finally:
        await conn.close()

    # another copy of the same key at the configuration's place, with its own mark: the cut is seen too
    dst_key.parent.mkdir(parents=True)
    dst_key.write_bytes(key.read_bytes())
    dst_key.chmod(0o600)
    mark_path(dst_key).write_bytes(mark_path(key).read_bytes())
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "audit-head.key").write_bytes(key.read_bytes())
    (other / "audit-head.key").chmod(0o600)
    r = await asyncio.to_thread(
        run_pvegate,
        "db",
        "migrate-from-sqlite",
        "--from",
        str(db),
        "--key",
        str(other / "audit-head.key"),
        "--config",
        str(cfg),
    )
    assert "records at the end are missing" in one_line_error(r)


async def test_the_key_and_its_high_water_mark_are_carried_after_the_move(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    db, key = await sqlite_install(tmp_path / "single", 4)
    url = await postgres.create_database("d_")
    dst_key = tmp_path / "pg" / "keys" / "audit-head.key"
    cfg = pg_config(tmp_path / "pg", url, dst_key)
    r = await asyncio.to_thread(run_pvegate, "db", "migrate-from-sqlite", "--from", str(db), "--config", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    assert dst_key.read_bytes() == key.read_bytes() and dst_key.stat().st_mode & 0o077 == 0
    mark = read_mark(mark_path(dst_key), HeadKey.load(dst_key))
    assert mark is not None and mark["seq"] == 4, mark
    res = off(auditlib.verify, PgLocation(url), key=dst_key)
    assert res.ok and res.high_water == 4, res


async def test_console_sign_outs_nonces_handoffs_and_the_state_key_move_too(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """A signed-out session stays signed out and a used requestState nonce stays used on PostgreSQL."""
    db, _key = await sqlite_install(tmp_path / "single", 2)
    sdb = SqliteDatabase(db)
    await sdb.open()
    try:
        await check(sdb, "handoffs", HANDOFFS)
        await check(sdb, "keys", KEYS)
        states = SharedStates(sdb)
        await states.sign_out("stolen-sid", 2e9)
        await states.sign_out_person("alice", 28800)
        assert await states.use_once("nonce-1", 2e9)
        await states.remember("agent", "sha256:x", "apr-1", 600)
        state_key = await shared_key(sdb)
    finally:
        await sdb.close()
    url = await postgres.create_database("d_")
    cfg = pg_config(tmp_path / "pg", url, tmp_path / "pg" / "keys" / "audit-head.key")
    r = await asyncio.to_thread(run_pvegate, "db", "migrate-from-sqlite", "--from", str(db), "--config", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    pg = PostgresDatabase(url)
    await pg.open()
    try:
        states = SharedStates(pg)
        assert await states.signed_out("stolen-sid", "bob", 0)
        assert await states.signed_out("another-sid", "alice", 0)
        assert not await states.use_once("nonce-1", 2e9)  # used on the single host: used here too
        assert await states.recall("agent", "sha256:x") == "apr-1"
        assert await shared_key(pg) == state_key
    finally:
        await pg.close()
    assert "1 console session sign-outs, 1 person sign-outs, 1 used requestState nonces" in r.stdout, r.stdout
    # the target now holds them: a second move is refused, or replaces them
    r = await asyncio.to_thread(run_pvegate, "db", "migrate-from-sqlite", "--from", str(db), "--config", str(cfg))
    assert "already holds" in one_line_error(r)


async def test_the_sqlite_file_is_write_locked_until_the_move_is_committed(
    postgres: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway still running cannot add records between the check and the PostgreSQL commit."""
    db, _key = await sqlite_install(tmp_path / "single", 2)
    url = await postgres.create_database("d_")
    cfg = load(pg_config(tmp_path / "pg", url))
    tried: list[str] = []
    copy = migrate._copy

    async def copy_while_a_gateway_writes(conn: Any, src: dict[str, Any]) -> None:
        def write() -> None:
            con = sqlite3.connect(db, timeout=0.1)
            try:
                con.execute("INSERT INTO audit_meta (key, value) VALUES ('probe', '1')")
                con.commit()
                tried.append("written")
            except sqlite3.OperationalError as exc:
                tried.append(str(exc))
            finally:
                con.close()

        await asyncio.to_thread(write)
        await copy(conn, src)

    monkeypatch.setattr(migrate, "_copy", copy_while_a_gateway_writes)
    result = await migrate.migrate_from_sqlite(db, cfg)
    assert tried == ["database is locked"] and result.records == 2


async def test_an_error_after_the_commit_does_not_say_nothing_was_kept(
    postgres: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, _key = await sqlite_install(tmp_path / "single", 2)
    url = await postgres.create_database("d_")
    cfg = load(pg_config(tmp_path / "pg", url, tmp_path / "pg" / "keys" / "audit-head.key"))

    def no_space(*_: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(migrate, "_copy_key", no_space)
    with pytest.raises(migrate.MigrateError, match=r"committed to PostgreSQL \(2 audit records\), but then: No space"):
        await migrate.migrate_from_sqlite(db, cfg)


async def test_migrate_says_in_one_line_why_postgresql_cannot_be_used(postgres: PostgresServer, tmp_path: Path) -> None:
    db, _key = await sqlite_install(tmp_path / "single", 1)
    base = postgres.dsn.rsplit("/", 1)[0]
    for name, url, expected in (
        ("unreachable", "postgresql://pvegate@127.0.0.1:9/nowhere", "PostgreSQL cannot be reached"),
        ("missing", f"{base}/no_such_database", "does not exist"),
        ("sslmode", f"{await postgres.create_database('d_')}?sslmode=bogus", "connection settings are invalid"),
    ):
        dst_key = tmp_path / name / "keys" / "audit-head.key"
        cfg = pg_config(tmp_path / name, url, dst_key)
        r = await asyncio.to_thread(run_pvegate, "db", "migrate-from-sqlite", "--from", str(db), "--config", str(cfg))
        assert expected in one_line_error(r), (name, r.stderr)
        assert not dst_key.exists(), name  # the key is copied only after a move that held


# --- db upgrade / status -----------------------------------------------------------------------------


async def test_db_upgrade_makes_no_key_for_a_server_it_cannot_use(postgres: PostgresServer, tmp_path: Path) -> None:
    base = postgres.dsn.rsplit("/", 1)[0]
    for name, url, expected in (
        ("unreachable", "postgresql://pvegate@127.0.0.1:9/nowhere", "cannot open the database: PostgreSQL cannot"),
        ("missing", f"{base}/no_such_database", "does not exist on the PostgreSQL server"),
        ("sslmode", f"{postgres.dsn}?sslmode=bogus", "connection settings are invalid (storage.url)"),
    ):
        cfg = pg_config(tmp_path / name, url)
        for command in ("upgrade", "status"):
            r = await asyncio.to_thread(run_pvegate, "db", command, "--config", str(cfg))
            assert expected in one_line_error(r), (name, command, r.stderr)
        assert not (tmp_path / name / "state" / "audit-head.key").exists(), name


async def test_db_upgrade_never_makes_a_key_for_a_chain_already_sealed(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = await postgres.create_database("d_")
    cfg = pg_config(tmp_path / "first", url)
    r = await asyncio.to_thread(run_pvegate, "db", "upgrade", "--config", str(cfg))
    assert r.returncode == 0 and "audit head key: generated" in r.stdout, r.stdout + r.stderr
    key = tmp_path / "first" / "state" / "audit-head.key"
    log = AuditLog(PgLocation(url), head_key=key)  # the first replica seals the chain
    await log.open()
    await log.append(AuditRecord("r1", "decision", outcome="allow"))
    await log.close()

    # another host, without the key: refused, no key made (one would not open the chain)
    other = pg_config(tmp_path / "other", url)
    r = await asyncio.to_thread(run_pvegate, "db", "upgrade", "--config", str(other))
    err = one_line_error(r)
    assert "already sealed" in err and HeadKey.load(key).key_id in err, err
    assert not (tmp_path / "other" / "state" / "audit-head.key").exists()
    # with another key: refused too
    HeadKey.create(tmp_path / "other" / "state" / "audit-head.key")
    r = await asyncio.to_thread(run_pvegate, "db", "upgrade", "--config", str(other))
    assert "sealed with another audit head key" in one_line_error(r)
    # with the key copied: the upgrade goes on
    (tmp_path / "other" / "state" / "audit-head.key").unlink()
    (tmp_path / "other" / "state" / "audit-head.key").write_bytes(key.read_bytes())
    (tmp_path / "other" / "state" / "audit-head.key").chmod(0o600)
    r = await asyncio.to_thread(run_pvegate, "db", "upgrade", "--config", str(other))
    assert r.returncode == 0 and "generated" not in r.stdout, r.stdout + r.stderr


async def test_db_upgrade_into_a_database_with_an_unrelated_audit_table(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = await postgres.create_database("d_")
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE TABLE audit (x INTEGER)")
    finally:
        await conn.close()
    cfg = pg_config(tmp_path, url)
    r = await asyncio.to_thread(run_pvegate, "db", "upgrade", "--config", str(cfg))
    err = one_line_error(r)
    assert "the upgrade failed" in err and "a database of its own" in err, err
    assert not (tmp_path / "state" / "audit-head.key").exists()


def test_refusal_names_a_wrong_login_and_a_missing_database() -> None:
    assert "refuses the login" in str(refusal(asyncpg.exceptions.InvalidPasswordError("password authentication")))
    assert "does not exist" in str(refusal(asyncpg.exceptions.InvalidCatalogNameError('database "x"')))


def _sqlite_config(root: Path) -> Path:
    return write(root, minimal(root))


async def test_db_upgrade_on_a_new_sqlite_file_leaves_one_the_gateway_starts_on(tmp_path: Path) -> None:
    cfg = load(_sqlite_config(tmp_path))
    HeadKey.create(cfg.audit_key_path)  # the key already in place (restored from a backup, say)
    r = await asyncio.to_thread(run_pvegate, "db", "upgrade", "--config", str(tmp_path / "pvegate.yaml"))
    assert r.returncode == 0, r.stdout + r.stderr
    log = AuditLog(cfg.audit_path, head_key=cfg.audit_key_path)  # what `pvegate serve` opens first
    await log.open()
    await log.append(AuditRecord("r1", "decision", outcome="allow"))
    await log.close()
    assert "audit: sealed the new audit chain" in r.stdout, r.stdout
    assert off(auditlib.verify, cfg.audit_path, key=cfg.audit_key_path).ok
    # and without a key: made as the gateway's first start makes it
    cfg2 = load(_sqlite_config(tmp_path / "nokey"))
    r = await asyncio.to_thread(run_pvegate, "db", "upgrade", "--config", str(tmp_path / "nokey" / "pvegate.yaml"))
    assert r.returncode == 0 and cfg2.audit_key_path.exists(), r.stdout + r.stderr
    log = AuditLog(cfg2.audit_path, head_key=cfg2.audit_key_path)
    await log.open()
    await log.close()


def _limited(max_bytes: int) -> Any:
    def limit() -> None:  # Python ignores SIGXFSZ: a write past the limit fails with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))

    return limit


def test_a_failed_sqlite_upgrade_leaves_no_new_file(tmp_path: Path) -> None:
    cfg = load(_sqlite_config(tmp_path))
    HeadKey.create(cfg.audit_key_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PVEGATE_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    r = subprocess.run(
        [*PVEGATE, "db", "upgrade", "--config", str(tmp_path / "pvegate.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
        env=env,
        preexec_fn=_limited(8192),  # a resource limit in the child only
        check=False,
    )
    err = one_line_error(r)
    assert "the SQLite file: " in err, err  # "database or disk is full" or "disk I/O error", as the limit is hit
    assert sorted(p.name for p in cfg.audit_path.parent.iterdir()) == ["audit-head.key"]
    cfg.audit_path.touch()  # control: the 0-byte file a failed upgrade left would stop the first start
    with pytest.raises(AuditIntegrityError, match="no records and no creation marker"):
        off(auditlib.open_seal, cfg.audit_path, cfg.audit_key_path)


def test_sqlite_errors_are_one_line(tmp_path: Path) -> None:
    cfg = load(_sqlite_config(tmp_path))
    cfg.audit_path.parent.mkdir(parents=True)
    cfg.audit_path.write_bytes(b"this is not a database" * 100)
    cfg.audit_path.chmod(0o600)  # as the gateway makes it (a world-readable one is warned about: one more line)
    for command in ("upgrade", "status"):
        r = run_pvegate("db", command, "--config", str(tmp_path / "pvegate.yaml"))
        assert "not a database" in one_line_error(r), (command, r.stderr)
    assert cfg.audit_path.read_bytes() == b"this is not a database" * 100  # an existing file is never removed


async def test_db_status_exit_status_says_what_is_needed(postgres: PostgresServer, tmp_path: Path) -> None:
    url = await postgres.create_database("d_")
    cfg = pg_config(tmp_path, url)
    r = await asyncio.to_thread(run_pvegate, "db", "status", "--config", str(cfg))
    assert r.returncode == 3 and "upgrade needed" in r.stdout, r.stdout + r.stderr
    assert (await asyncio.to_thread(run_pvegate, "db", "upgrade", "--config", str(cfg))).returncode == 0
    r = await asyncio.to_thread(run_pvegate, "db", "status", "--config", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("UPDATE pvegate_schema SET version = 99 WHERE component = 'keys'")
    finally:
        await conn.close()
    r = await asyncio.to_thread(run_pvegate, "db", "status", "--config", str(cfg))
    assert r.returncode == 4 and "NEWER than this pvegate" in r.stdout, r.stdout + r.stderr
