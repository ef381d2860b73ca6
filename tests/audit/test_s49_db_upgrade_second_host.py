"""`pvegate db upgrade` on a PostgreSQL database another host already upgraded (its new chain's mark signed
with that host's key, no replica started yet): the second host, without that key, generated a key of its
own, found the mark already signed (sign_fresh returned False, unread), and said "generated ...: copy it to
every replica", exit 0. Every replica given that key then refuses to start ("marked new, but not with this
audit head key"). Found on a second run, and on two hosts upgrading at once: one of them is told wrongly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.store.audit import AuditIntegrityError, AuditLog, AuditRecord
from gateway.store.audit_seal import HeadKey
from gateway.store.pgsync import PgLocation
from tests.config.conftest import run_pvegate
from tests.pgserver import PostgresServer
from tests.store.test_db_commands import one_line_error, pg_config


async def test_a_second_host_is_refused_not_given_a_key_that_opens_nothing(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = await postgres.create_database("d_")
    first = pg_config(tmp_path / "first", url)
    r = await asyncio.to_thread(run_pvegate, "db", "upgrade", "--config", str(first))
    assert r.returncode == 0 and "audit head key: generated" in r.stdout, r.stdout + r.stderr
    key = tmp_path / "first" / "state" / "audit-head.key"

    # another host, before any replica has started: the chain is marked new under the first host's key
    other_key = tmp_path / "other" / "state" / "audit-head.key"
    other = pg_config(tmp_path / "other", url)
    r = await asyncio.to_thread(run_pvegate, "db", "upgrade", "--config", str(other))
    err = one_line_error(r)
    assert HeadKey.load(key).key_id in err and str(other_key) in err, err
    assert not other_key.exists()  # no key that would open nothing is left behind

    # another key already there: refused as well
    HeadKey.create(other_key)
    r = await asyncio.to_thread(run_pvegate, "db", "upgrade", "--config", str(other))
    assert HeadKey.load(key).key_id in one_line_error(r)
    with pytest.raises(AuditIntegrityError):  # control: that key opens nothing
        log = AuditLog(PgLocation(url), head_key=other_key)
        await log.open()

    # the first host's key copied there: the upgrade goes on, and a replica with it starts
    other_key.unlink()
    other_key.write_bytes(key.read_bytes())
    other_key.chmod(0o600)
    r = await asyncio.to_thread(run_pvegate, "db", "upgrade", "--config", str(other))
    assert r.returncode == 0 and "generated" not in r.stdout, r.stdout + r.stderr
    log = AuditLog(PgLocation(url), head_key=other_key)
    await log.open()
    await log.append(AuditRecord("r1", "decision", outcome="allow"))
    await log.close()
