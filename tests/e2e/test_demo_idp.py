"""`make demo IDP=1` (`pvegate demo --idp`): the demo with the real Keycloak of `make tools`, the
gateway trusting its realm, and the admin console enabled. Run as a user would (~25-40 s: Keycloak's
start is most of it); the scripted session signs alice in to the console through Keycloak's own
login form, so a console the demo cannot use fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.cli.demo import run_demo
from gateway.dev import keycloak
from gateway.dev.keycloak import AGENT_CLIENT, DEFAULT_USERS
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str, demo_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PVEGATE_DEMO_DIR": str(demo_dir)},
        cwd=ROOT,
    )


def test_demo_idp_oneshot_signs_in_to_the_console_and_prints_what_to_use(tmp_path: Path) -> None:
    demo_dir = tmp_path / "demo"
    port = free_port()
    done = _run("demo", "--idp", "--oneshot", "--port", str(port), demo_dir=demo_dir)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "demo: all steps behaved" in out
    assert out.count(": OK") >= 10, out[-4000:]  # the scripted session and the console sign-in
    assert "the admin console: an approver signs in through Keycloak: OK" in out
    assert "Traceback" not in out

    # what a person needs: the console URL, the demo users with their passwords, the agent's token
    assert f"Admin console:  https://127.0.0.1:{port}/admin/" in out
    for user in DEFAULT_USERS.values():
        assert re.search(rf"^\s+{user.username} / {re.escape(user.password)}\s+role ", out, re.M), user.username
    issuer = re.search(r"Issuer:\s+(http://127\.0\.0\.1:\d+/realms/pvegate)$", out, re.M)
    assert issuer, out[-4000:]
    assert f"curl -s -d grant_type=client_credentials -d client_id={AGENT_CLIENT} -d client_secret=" in out
    assert f"{issuer.group(1)}/protocol/openid-connect/token | jq -r .access_token" in out

    # the gateway's configuration: the realm's tokens only (no HS256 secret), the console on, and valid
    config = demo_dir / "pvegate.yaml"
    raw = yaml.safe_load(config.read_text())
    assert raw["auth"]["issuer"] == issuer.group(1)
    assert "hs256_secret" not in raw["auth"]
    assert raw["console"]["enabled"] is True
    assert raw["console"]["issuer"] == issuer.group(1)
    check = _run("config", "check", str(config), demo_dir=demo_dir, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr

    # the demo took its Keycloak down with it
    with pytest.raises(httpx.ConnectError):
        httpx.get(issuer.group(1), timeout=5)


def test_demo_idp_without_keycloak_says_run_make_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(keycloak, "_ROOT", tmp_path)  # a checkout where `make tools` never ran
    monkeypatch.setattr("gateway.cli.demo.DEMO_DIR", tmp_path / "demo")
    assert run_demo(oneshot=True, port=free_port(), idp=True) == 2
    err = capsys.readouterr().err
    assert err.startswith("pvegate: cannot start the identity provider: Keycloak "), err
    assert "is not provisioned" in err and "run `make tools`" in err
    assert not (tmp_path / "demo").exists()  # nothing was started


def test_make_demo_idp_passes_the_switch_on() -> None:
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "demo", "IDP=1"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].split()[-2:] == ["demo", "--idp"]
