"""Secrets of the certificate family are masked before projection (gateway/tools/runtimes/masking.py)."""

from __future__ import annotations

from gateway.tools.runtimes.masking import MASK, acme_account, mask_tail, subscription


def test_subscription_key_keeps_prefix_and_last_four() -> None:
    assert subscription({"key": "pve2c-0123456789", "status": "active"}, {}) == {
        "key": "pve2c-******6789",
        "status": "active",
    }
    assert mask_tail("short-abc") == "short-****"  # too short to show any of it
    assert mask_tail("nodashatall1234567") == "*" * 14 + "4567"
    assert "0123456789" not in str(subscription({"key": "pve4b-0123456789"}, {}))
    assert subscription({"status": "notfound"}, {}) == {"status": "notfound"}


def test_acme_account_key_is_masked() -> None:
    out = acme_account({"account": {"key": {"kty": "RSA", "n": "secret"}, "status": "valid"}, "tos": "x"}, {})
    assert out == {"account": {"key": MASK, "status": "valid"}, "tos": "x"}
