"""A JWKS file replaced by one with the same mtime was never read again.

`auth.jwks_file` is documented as "re-read when it changes", but the change was detected by the
file's mtime alone. A new file that carries the old one's mtime (a Nix store path: every file has
mtime 1; `cp -p`, `rsync -t`, `tar x` or a reproducible image layer keep the source's; a coarse
timestamp filesystem gives two quick writes the same one) was never read: the key the operator
removed (a compromised one) stayed trusted until a restart, for new tokens and cached ones alike,
and a key added was never trusted. The file is now known by its whole identity (device, inode,
size, mtime and ctime), as gateway/policy/optimized.py knows the OPA binary.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from gateway.auth.tokens import Authenticator, AuthError
from gateway.core.config import AuthConfig
from tests.auth.keys import AUDIENCE, ISSUER, IdP

FIXED = 1  # the mtime of every file in a Nix store


def _deploy(idp: IdP, store: Path, name: str, link: Path) -> None:
    """Write the JWKS as a new store file with the fixed mtime and point the configured path at it."""
    target = idp.write(store / name)
    os.utime(target, (FIXED, FIXED))
    tmp = link.with_name(link.name + ".new")
    tmp.symlink_to(target)
    tmp.replace(link)  # atomic, as a deployment switches a profile


def test_a_replaced_jwks_file_with_the_same_mtime_is_read_again(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    link = tmp_path / "jwks.json"
    old, new = IdP(), IdP()
    old.add("RS256", kid="old")
    new.add("RS256", kid="new")
    _deploy(old, store, "a-jwks.json", link)
    auth = Authenticator(AuthConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=link, algorithms=("RS256",)))
    assert auth.jwks is not None
    auth.jwks.min_refresh_seconds = 3600.0  # no forced re-read by an unknown kid: only the change counts
    old_token = old.token("old")

    async def scenario() -> None:
        assert (await auth.authenticate(f"Bearer {old_token}")).sub == "idp-agent"  # verified and cached
        _deploy(new, store, "b-jwks.json", link)  # the old key rotated out (compromised)
        with pytest.raises(AuthError, match="unknown signing key"):
            await auth.authenticate(f"Bearer {old_token}")  # neither from the cache nor verified again
        with pytest.raises(AuthError, match="unknown signing key"):
            await auth.authenticate(f"Bearer {old.token('old', sub='another')}")
        assert (await auth.authenticate(f"Bearer {new.token('new')}")).sub == "idp-agent"

    asyncio.run(scenario())


def test_a_jwks_file_rewritten_in_place_with_its_old_mtime_is_read_again(tmp_path: Path) -> None:
    """`cp -p` over the file: the same inode and mtime, another content (and ctime)."""
    path = tmp_path / "jwks.json"
    old, new = IdP(), IdP()
    old.add("RS256", kid="old")
    new.add("RS256", kid="new")
    old.write(path)
    st = os.stat(path)
    auth = Authenticator(AuthConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=path, algorithms=("RS256",)))
    assert auth.jwks is not None
    auth.jwks.min_refresh_seconds = 3600.0

    async def scenario() -> None:
        await auth.authenticate(f"Bearer {old.token('old')}")
        new.write(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        with pytest.raises(AuthError, match="unknown signing key"):
            await auth.authenticate(f"Bearer {old.token('old')}")
        await auth.authenticate(f"Bearer {new.token('new')}")

    asyncio.run(scenario())
