"""The readiness probe's commit meets what a call's commit meets: a row another hand added past the
authenticated head refuses it (SQLite and PostgreSQL), next to the head or beyond a gap, so readiness
cannot turn green on an idle gateway that refuses every call; once the row is gone both work again."""

from __future__ import annotations

import pytest

from gateway.store.audit import AuditIntegrityError
from tests.store.auditstore import Store
from tests.store.conftest import store  # noqa: F401  (the fixture: an audit store on each backend)
from tests.store.test_audit_backends import rec


@pytest.mark.parametrize("past", [1, 5])  # next to the head, or beyond a gap
async def test_a_row_past_the_head_refuses_the_probe_and_every_commit(
    store: Store,  # noqa: F811
    past: int,
) -> None:
    log = store.log()
    await log.open()
    try:
        await log.append(rec(1), rec(2))
        await log.probe()
        assert log.last_error is None
        store.sql(
            f"INSERT INTO audit SELECT seq + {past}, ts, request_id, kind, principal, tool, target, outcome, body, "
            "hash, hash FROM audit WHERE seq = 2"
        )
        taken = f"record {2 + past} exists past the authenticated head \\(record 2\\)"
        for _ in range(2):  # every probe, not only the first: readiness stays red
            with pytest.raises(AuditIntegrityError, match=taken):
                await log.probe()
            assert log.last_error is not None and f"record {2 + past} exists past" in log.last_error
        with pytest.raises(AuditIntegrityError, match=taken):  # a gap is no way around it
            await log.append(rec(3))
        with pytest.raises(AuditIntegrityError, match=taken):
            await log.probe()

        store.sql(f"DELETE FROM audit WHERE seq = {2 + past}")  # the operator removes it
        await log.probe()
        assert log.last_error is None
        await log.append(rec(3))
        assert log.last_error is None
    finally:
        await log.close()
