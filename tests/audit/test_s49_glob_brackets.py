"""Search filters with `*` read a `[` as a character class on SQLite (GLOB) but as itself on PostgreSQL.

`pvegate audit search --principal 'renovate[bot]*'` (a GitHub-app style subject) found the records of
`renovateb` and none of `renovate[bot]` on SQLite, while PostgreSQL found the right ones: an operator's
search, export or the admin records page returned another principal's records and hid the ones asked for,
depending on the backend. A filter's glob is `*` (any run) and `?` (one character); everything else is itself.
"""

from __future__ import annotations

from gateway.store import audit as auditlib
from gateway.store.audit import AuditRecord
from tests.store.auditstore import Store, off
from tests.store.conftest import store  # noqa: F401 - the audit store on each backend

PRINCIPALS = ("renovate[bot]", "renovateb", "user[12]x", "user1", "a_b", "a%b", "axb")


async def test_brackets_in_a_glob_are_literal_on_every_backend(store: Store) -> None:  # noqa: F811
    log = store.log()
    await log.open()
    try:
        for p in PRINCIPALS:
            await log.append(AuditRecord(f"r-{p}", "received", p, "start_vm", "default/qemu/100", None, {}))
    finally:
        await log.close()

    def found(pattern: str) -> list[str]:
        return [r["principal"] for r in off(auditlib.search, store.where, auditlib.Query(principal=pattern))]

    assert found("renovate[bot]*") == ["renovate[bot]"]
    assert found("user[12]*") == ["user[12]x"]
    assert found("*]*") == ["renovate[bot]", "user[12]x"]
    assert found("a?b*") == ["a_b", "a%b", "axb"]  # `?` is still one character
    assert found("a_*") == ["a_b"]
    rows = list(off(lambda: list(auditlib.iter_rows(store.where, auditlib.Query(principal="renovate[bot]*")))))
    assert [r["principal"] for r in rows] == ["renovate[bot]"]  # export reads the same filter


async def test_the_python_filter_agrees_with_the_database(store: Store) -> None:  # noqa: F811
    """Replay's export filters and the admin filter check apply `filter_matches` to rows and names the
    database never sees; it must pick exactly what `Query.sql` picks, on each backend."""
    log = store.log()
    await log.open()
    try:
        for p in PRINCIPALS:
            await log.append(AuditRecord(f"r-{p}", "received", p, "start_vm", "default/qemu/100", None, {}))
    finally:
        await log.close()
    for pattern in ("renovate[bot]*", "user[12]*", "*]*", "a?b*", "a_*", "a%*", "*", "renovate[bot]", "a?b", "user1"):
        in_db = [r["principal"] for r in off(auditlib.search, store.where, auditlib.Query(principal=pattern))]
        assert [p for p in PRINCIPALS if auditlib.filter_matches(p, pattern)] == in_db, pattern
