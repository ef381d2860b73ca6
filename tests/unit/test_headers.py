"""gateway/core/headers.py: a header counted over the raw ASGI list, whatever its case."""

from __future__ import annotations

from gateway.core.headers import repeated


def test_one_copy_is_not_repeated() -> None:
    assert not repeated([(b"authorization", b"Bearer a"), (b"origin", b"https://x")], b"authorization")


def test_two_copies_in_any_case_are_repeated() -> None:
    raw = [(b"Authorization", b"Bearer a"), (b"accept", b"*/*"), (b"AUTHORIZATION", b"Bearer b")]
    assert repeated(raw, b"authorization")


def test_absent_header_is_not_repeated() -> None:
    assert not repeated([], b"origin")
