"""A refusal quotes a client's text cut, never larger than the request that brought it (found by a
review: a 16 KB token whose header held a long key path ending in a lone surrogate gave a 24,043-character
refusal, in the audit and in the WWW-Authenticate header; Host and Origin were quoted uncut too)."""

from __future__ import annotations

import pytest

from gateway.auth.tokens import _check_text
from gateway.core.text import QUOTED_MAX, describe, quoted


def test_a_long_path_is_cut() -> None:
    path: tuple[str | int, ...] = (*(f"key-{i}-with-some-length" for i in range(800)), "\ud800")
    assert len(describe(path)) <= QUOTED_MAX and describe(path).endswith("...")
    assert describe(("a", 1, "b c")) == 'a[1]["b c"]'  # a short one as it was


def test_a_token_header_with_a_long_bad_path_gives_a_short_refusal() -> None:
    header = {"alg": "HS256"}
    node = header
    for i in range(600):
        node[f"k{i}"] = {}
        node = node[f"k{i}"]
    node["\ud800"] = 1
    with pytest.raises(Exception) as info:
        _check_text(header, "header")
    assert "is not valid Unicode text" in str(info.value) and len(str(info.value)) < QUOTED_MAX + 60


def test_host_and_origin_are_quoted_cut() -> None:
    assert len(quoted("h" * 20000)) == QUOTED_MAX
    assert quoted("gw.example") == "'gw.example'"
