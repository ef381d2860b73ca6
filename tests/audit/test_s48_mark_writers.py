"""The high-water mark is written by every AuditLog on the chain (a worker thread each), and by every
process on the host that shares the key's directory. The temporary file it is written through was named by
the pid alone, so two writers of one process shared it: one's rename took the other's file, whose own
rename then failed (ENOENT: "the high-water mark cannot be written"), or left a mark mixed from two writes.
Seen as a flaky `audit verify` in the clean-clone CI of stop 48 (three replicas' AuditLogs in one test
process). Each write now has a temporary name of its own."""

from __future__ import annotations

import threading
from pathlib import Path

from gateway.store.audit_seal import HeadKey, read_mark, write_mark


def test_concurrent_writers_of_one_mark_neither_fail_nor_garble_it(tmp_path: Path) -> None:
    key_path = tmp_path / "audit-head.key"
    HeadKey.create(key_path)
    key = HeadKey.load(key_path)
    mark = tmp_path / "audit-head.key.hwm"
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def writer(n: int) -> None:
        start.wait()
        for i in range(60):
            try:
                write_mark(mark, key, "db-1", i * 6 + n)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    body = read_mark(mark, key)  # whole and authenticated
    assert body is not None and body["db"] == "db-1" and body["seq"] >= 0
    assert not list(tmp_path.glob(".*.tmp")), "a temporary file was left behind"
