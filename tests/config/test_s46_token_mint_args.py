"""`pvegate token mint` with a blank --sub (or a blank --role, --group, --scope): a usage error.

`--sub ""` printed a token, exit 0, that the gateway then refused on every request ("token lacks
the subject claim"); `--role ""` put an empty role in it. Now each is refused before anything is
signed, exit 2, and nothing is printed on stdout. The gateway's own Authenticator shows the tokens.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway.auth.tokens import Authenticator, AuthError, mint_hs256
from gateway.core.config import load
from tests.config.conftest import run_pvegate, write


def _accepted(config: Path, token: str) -> bool:
    auth = Authenticator(load(config).auth)
    try:
        asyncio.run(auth.authenticate(f"Bearer {token}"))
    except AuthError:
        return False
    return True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sub", ""], "argument --sub: a blank subject"),
        (["--sub", "  "], "argument --sub: a blank subject"),
        (["--sub", "agent-1", "--role", ""], "argument --role: a blank role"),
        (["--sub", "agent-1", "--group", " "], "argument --group: a blank group"),
        (["--sub", "agent-1", "--scope", ""], "argument --scope: a blank scope"),
    ],
)
def test_a_blank_value_is_a_usage_error(base: dict[str, Any], tmp_path: Path, args: list[str], message: str) -> None:
    config = write(tmp_path, base)
    r = run_pvegate("token", "mint", "--config", str(config), *args)
    assert r.returncode == 2 and r.stdout == "", r
    assert message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_minted_token_is_one_the_gateway_accepts(base: dict[str, Any], tmp_path: Path) -> None:
    config = write(tmp_path, base)
    r = run_pvegate("token", "mint", "--config", str(config), "--sub", "agent-1", "--role", "operator")
    assert r.returncode == 0, r.stderr
    assert _accepted(config, r.stdout.strip())


def test_why_a_blank_subject_is_refused(base: dict[str, Any], tmp_path: Path) -> None:
    """What `--sub ""` used to print: a token every request with it is refused."""
    config = write(tmp_path, base)
    cfg = load(config).auth
    assert cfg.hs256_secret is not None
    token = mint_hs256(cfg.hs256_secret.read(), issuer=cfg.issuer, audience=cfg.audience, sub="", roles=[])
    assert not _accepted(config, token)
