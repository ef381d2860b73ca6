"""A call is settled once, whoever reconciles: the replicas' passes, `pvegate audit reconcile`, a pass
whose lock was lost on the way; and a gone replica whose clock ran ahead has its last calls settled
before it is forgotten. Each case is bounded (a few seconds) and runs on a fresh database."""

from __future__ import annotations

import asyncio
import time
import types
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from gateway.cli import main
from gateway.dev.devenv import DevEnv
from gateway.store import audit as auditlib
from gateway.store.audit import AuditLog, AuditRecord
from gateway.store.outcomes import Outcomes
from gateway.store.pgsync import PgLocation
from gateway.store.reconcile import Reconciler, Settled, open_calls
from gateway.tools.catalog import Catalog
from tests.pgserver import PostgresServer
from tests.store.auditstore import Store, off
from tests.store.test_audit_backends import rec, two_replicas


def reconciler(log: AuditLog, cls: type[Reconciler] = Reconciler) -> Reconciler:
    return cls(None, None, Outcomes(log, grace_seconds=1, min_free_bytes=0), {})  # type: ignore[arg-type]


def results(where: Path | PgLocation) -> dict[str, int]:
    """Result records per call."""
    per: dict[str, int] = {}
    for r in off(auditlib.search, where, auditlib.Query(kind="result")):
        per[r["request_id"]] = per.get(r["request_id"], 0) + 1
    return per


async def reads(log: AuditLog, n: int) -> None:
    """n allowed reads, decided and never finished (the process that ran them is gone)."""
    for i in range(n):
        await log.append(rec(i, "received", None, effect="read"), rec(i))


# --- on both backends ----------------------------------------------------------------------------


class _SettledByItsReplica(Reconciler):
    """The call's own result lands (its replica finished it late) after the pass read it as open."""

    async def settle(self, call: Any, *args: Any) -> Settled:
        body = {"i": 0, "late": True}
        await self.outcomes.audit.append(
            AuditRecord(call.request_id, "result", "agent", "list_nodes", None, "ok", body)
        )
        return await super().settle(call, *args)


async def test_a_call_settled_meanwhile_gets_no_second_settling_result(store: Store) -> None:
    gone = store.log()  # the process that decided them is gone (PostgreSQL: stopped, so its calls are not in flight)
    await gone.open()
    try:
        await reads(gone, 2)
    finally:
        await gone.close()
    log = store.log()
    await log.open()
    try:
        settled = await reconciler(log, _SettledByItsReplica).run_once(time.time() + 1)
        assert [(s.request_id, s.action) for s in settled] == [
            ("req-0", "already_settled"),
            ("req-1", "already_settled"),
        ]
        assert await reconciler(log).run_once(time.time() + 1) == []
    finally:
        await log.close()
    assert results(store.where) == {"req-0": 1, "req-1": 1}
    assert off(auditlib.verify, store.where, key=store.key).ok


# --- PostgreSQL: replicas and the operator's command --------------------------------------------------


async def test_two_passes_at_once_settle_each_call_once(postgres: PostgresServer, tmp_path: Path) -> None:
    """A replica's pass over gone replicas and a pass run by hand (Reconciler.run_once, what the command
    runs) at the same moment: one of them settles, once."""
    url, _key, (a, b) = await two_replicas(postgres, tmp_path)
    by_hand = AuditLog(PgLocation(url), head_key=_key)
    await by_hand.open()
    try:
        await reads(a, 5)
        await a.close()  # gone
        s1, s2 = await asyncio.gather(reconciler(b).settle_stale_replicas(), reconciler(by_hand).run_once(time.time()))
        assert sorted(s.action for s in s1 + s2 if s.action != "open") == ["interrupted"] * 5
    finally:
        await by_hand.close()
        await b.close()
    assert results(PgLocation(url)) == {f"req-{i}": 1 for i in range(5)}


def _cli_config(env: DevEnv, url: str, key: Path, path: Path) -> Path:
    raw = yaml.safe_load(env.config_path.read_text())
    raw["storage"] = {"url": url}
    raw["audit"] = {"head_key_file": str(key)}
    raw["state_dir"] = str(path.parent / "state")
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _reconcile_cli(config: Path, *extra: str) -> int:
    """`pvegate audit reconcile --config ... --min-age 0s` (in this process: no interpreter start-up)."""
    return main(["audit", "reconcile", "--config", str(config), "--min-age", "0s", *extra])


async def test_the_reconcile_command_takes_its_turn_with_the_replicas(
    postgres: PostgresServer,
    env: DevEnv,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`pvegate audit reconcile` follows the replicas' rule: while a replica holds the pvegate-reconcile
    lock it settles nothing (it waits --wait, then says so); once the lock is free it settles, once."""
    url, key, (a, b) = await two_replicas(postgres, tmp_path)
    config = _cli_config(env, url, key, tmp_path / "pvegate.yaml")
    catalog = Catalog.load(env.config.connectors_dir)  # loaded once for both runs (seconds on a busy host)
    monkeypatch.setattr(Catalog, "load", staticmethod(lambda *_a, **_k: catalog))
    try:
        await reads(a, 3)
        await a.close()
        async with b.exclusive("pvegate-reconcile") as turn:
            assert turn
            busy = await asyncio.wait_for(asyncio.to_thread(_reconcile_cli, config, "--wait", "1s"), 30)
        assert busy == 1
        assert "another gateway replica is reconciling" in capsys.readouterr().err
        assert results(PgLocation(url)) == {}
        assert await asyncio.wait_for(asyncio.to_thread(_reconcile_cli, config), 30) == 0
        assert await reconciler(b).settle_stale_replicas() == []  # nothing left: A is forgotten
    finally:
        await b.close()
    assert results(PgLocation(url)) == {f"req-{i}": 1 for i in range(3)}


class _CutMidPass(Reconciler):
    """The lock's connection is cut (a network blip, a DBA's pg_terminate_backend) before this pass writes
    anything; another replica then takes the lock and runs its whole pass before this one goes on."""

    other: Reconciler
    admin: asyncpg.Connection
    others_pass: list[Settled] | None = None

    async def settle(self, call: Any, *args: Any) -> Settled:
        if self.others_pass is None:
            await self.admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            await asyncio.sleep(0.2)
            self.others_pass = await self.other.settle_stale_replicas()
        return await super().settle(call, *args)


async def test_a_pass_that_lost_its_lock_writes_nothing_more(postgres: PostgresServer, tmp_path: Path) -> None:
    url, key, (a, b) = await two_replicas(postgres, tmp_path)
    c = AuditLog(PgLocation(url), head_key=key)
    await c.open()
    admin = await asyncpg.connect(url)
    try:
        await reads(a, 3)
        await a.close()
        cut = reconciler(b, _CutMidPass)
        assert isinstance(cut, _CutMidPass)
        cut.other, cut.admin = reconciler(c), admin
        settled = await asyncio.wait_for(cut.settle_stale_replicas(), 30)
        assert [(s.request_id, s.action) for s in cut.others_pass or []] == [
            (f"req-{i}", "interrupted") for i in range(3)
        ]
        assert {s.action for s in settled} == {"open"}  # left: the lock is another replica's now
        assert "lock" in str(settled[0].detail)
        async with b.exclusive("pvegate-reconcile") as turn:  # the pool gave up the cut connection
            assert turn
            await turn.confirm()
    finally:
        await admin.close()
        await c.close()
        await b.close()
    assert results(PgLocation(url)) == {f"req-{i}": 1 for i in range(3)}
    assert off(auditlib.verify, PgLocation(url), key=key).ok


async def test_a_claimed_replica_is_claimed_once_unless_by_the_lock_holder(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    _url, _key, (a, b) = await two_replicas(postgres, tmp_path)
    try:
        name = a.replica_id
        assert name is not None
        await a.close()  # a clean stop: gone at once
        assert await b.claim_gone({name}) == {name}  # moved from gone to claimed
        assert await b.claim_gone({name}) == set()  # a second claimant without the lock does not win too
        async with b.exclusive("pvegate-reconcile") as turn:  # the lock holder resumes what a pass left
            assert await b.claim_gone({name}, turn) == {name}
    finally:
        await b.close()


async def test_a_gone_replica_whose_clock_ran_ahead_is_settled_before_it_is_forgotten(
    postgres: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica's records carry its own clock: one running 60 s ahead (NTP broken) leaves calls
    "from the future" for the others. Its open calls are still settled, and its row is forgotten only
    once none is left open."""
    url, _key, (a, b) = await two_replicas(postgres, tmp_path)
    real = time.time
    try:
        with monkeypatch.context() as m:  # only while A writes
            m.setattr(auditlib, "time", types.SimpleNamespace(time=lambda: real() + 60, monotonic=time.monotonic))
            await reads(a, 1)
        await a.close()
        assert a.replica_id in await b.stale_replicas()
        mine = Outcomes(b, grace_seconds=1, min_free_bytes=0)
        with mine.flight("req-0"):  # still running here (an in-flight call is never settled): not forgotten
            settled = await Reconciler(None, None, mine, {}).settle_stale_replicas()  # type: ignore[arg-type]
            assert [(s.request_id, s.action) for s in settled] == [("req-0", "in_flight")]
            assert a.replica_id in await b.stale_replicas()
        settled = await reconciler(b).settle_stale_replicas()
        assert [(s.request_id, s.action, s.owner) for s in settled] == [("req-0", "interrupted", a.replica_id)]
        assert a.replica_id not in await b.stale_replicas()
        assert off(open_calls, PgLocation(url), 0, None) == []
    finally:
        await b.close()
