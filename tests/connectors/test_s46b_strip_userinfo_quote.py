"""strip_userinfo removes a URL's user name and password even when the password holds a quote.

RFC 3986 allows `'` among userinfo's sub-delims, and apt (or a settings file) takes such a URL as
written; strip_userinfo stopped at the first quote, so `https://u:pa'ss@h/x` came back whole, password
included, to every caller (the settings' error messages, Proxmox's APT sources). A URL quoted in a text
(`got 'https://u:p@h/x' and 'http://h2'`) is still shown with only its userinfo replaced.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.config_schema import redact
from gateway.core.redaction import strip_userinfo


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("https://u:pa'ss@h/x", "https://***@h/x"),
        ('https://u:pa"ss@h/x', "https://***@h/x"),
        ("https://u:it's(me)!@h/x", "https://***@h/x"),
        ("got 'https://u:pa'ss@h/x' and 'http://h2'", "got 'https://***@h/x' and 'http://h2'"),
        ('got "https://u:pa\'ss@h/x"', 'got "https://***@h/x"'),
        ("deb https://mirror:Pa'ss@repo.example/debian trixie main", "deb https://***@repo.example/debian trixie main"),
        # what it did before, and still does
        ("got 'https://u:p@h/x' and 'http://h2'", "got 'https://***@h/x' and 'http://h2'"),
        ("https://u:p/q@h/x", "https://***@h/x"),
        ("'https://h/x' is not allowed", "'https://h/x' is not allowed"),
        ("expected postgresql://USER@HOST:PORT/DATABASE", "expected postgresql://USER@HOST:PORT/DATABASE"),
        ("postgresql://USER:pw@h", "postgresql://***@h"),
        ("no URL: a@b", "no URL: a@b"),
    ],
)
def test_a_quote_in_a_password_does_not_stop_its_removal(text: str, shown: str) -> None:
    assert strip_userinfo(text) == shown


@pytest.mark.parametrize("secret", ["pa'ss", 'pa"ss', "it's"])
def test_a_settings_error_never_shows_a_password_with_a_quote(secret: str) -> None:
    text: Any = f"storage.url: got {f'postgresql://gw:{secret}@db.example/pvegate'!r}, expected ..."
    out = redact(text)
    assert secret not in out and "gw:" not in out and "***@db.example/pvegate" in out, out
