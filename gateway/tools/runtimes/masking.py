"""Transforms that mask secrets a Proxmox answer carries (the certificate family): a value
the caller may need to recognise keeps its last four characters, anything else is replaced.
They run before projection and redaction, so no path returns the clear value."""

from __future__ import annotations

from typing import Any

MASK = "****"


def mask_tail(value: Any, keep: int = 4) -> Any:
    """'pve2c-0123456789' -> 'pve2c-******6789' (prefix up to the first '-' and the last `keep` kept)."""
    if not isinstance(value, str) or not value:
        return value
    prefix, sep, rest = value.partition("-")
    if not sep:
        prefix, rest = "", value
    shown = rest[-keep:] if len(rest) > 2 * keep else ""
    return f"{prefix}{sep}{'*' * max(len(rest) - len(shown), len(MASK))}{shown}"


def subscription(data: Any, args: dict[str, Any]) -> Any:
    if isinstance(data, dict) and "key" in data:
        return {**data, "key": mask_tail(data["key"])}
    return data


def acme_account(data: Any, args: dict[str, Any]) -> Any:
    """The account's key (a JWK, with the private part where a CA or version includes it) is never returned."""
    if isinstance(data, dict) and isinstance(data.get("account"), dict):
        account = dict(data["account"])
        if "key" in account:
            account["key"] = MASK
        return {**data, "account": account}
    return data
