"""A cluster's Proxmox token that is no token started the gateway without a word.

The token file is sent as `Authorization: PVEAPIToken=<its text>`. A file holding the header's
own prefix, a user and password, a token id without its secret, or the token on two lines was
read as it was: `pvegate serve` (and `config check --files`) said nothing, and every call to the
cluster then failed with an upstream error. The shape USER@REALM!TOKENID=SECRET is now checked
at start and by `--files`; the token is never shown.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.config.conftest import run_pvegate, write

UUID = "0d2f7e5c-9a1b-4c3d-8e6f-7a8b9c0d1e2f"  # must never be echoed


@pytest.mark.parametrize(
    "text",
    [
        f"PVEAPIToken=pvegate@pve!gw={UUID}",  # the header's prefix pasted too
        f"pvegate@pve!gw\n{UUID}",  # on two lines
        f"pvegate@pve:{UUID}",  # a user and a password
        "pvegate@pve!gw",  # the id without its secret
        f"pvegate!gw={UUID}",  # no realm
        f"pvegate@pve!gw= {UUID}",  # a blank in it
    ],
)
def test_a_token_of_another_shape_is_refused(base: dict[str, Any], tmp_path: Path, text: str) -> None:
    token = tmp_path / "secrets" / "pve-token"
    token.write_text(text + "\n")
    os.chmod(token, 0o600)
    path = write(tmp_path, base)
    out = run_pvegate("config", "check", "--files", str(path))
    assert out.returncode == 1, out
    assert "clusters.default.token: not a Proxmox API token" in out.stderr, out.stderr
    assert ("without the `PVEAPIToken=` prefix" in out.stderr) == text.startswith("PVEAPIToken="), out.stderr
    assert UUID not in out.stdout + out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "text",
    [
        f"pvegate@pve!gw={UUID}",
        f"svc.gw@corp.example.com@ad!gw-1.a={UUID}",  # an email address as the user, in an LDAP realm
        f"a=b!c@oidc!t_1={UUID}",  # '=' and '!' in a user name: PVE admits them
    ],
)
def test_a_token_as_pveum_prints_it_passes(base: dict[str, Any], tmp_path: Path, text: str) -> None:
    token = tmp_path / "secrets" / "pve-token"
    token.write_text(text + "\n")
    os.chmod(token, 0o600)
    path = write(tmp_path, base)
    out = run_pvegate("config", "check", "--files", str(path))
    assert out.returncode == 0, out
    assert out.stdout.strip() == f"{path}: OK"
