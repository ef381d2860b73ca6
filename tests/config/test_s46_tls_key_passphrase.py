"""A passphrase-protected tls.key: refused in one line, never a passphrase prompt.

OpenSSL asked `Enter PEM pass phrase:` on the controlling terminal while `pvegate serve` (or
`config check --files`) checked the key: the start sat there waiting for input, and without a
terminal (systemd) or with none typed it said only `cannot load CERT and KEY: Invalid argument`.
The gateway has no passphrase to give uvicorn: the key must be stored decrypted (mode 0600).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import termios
from pathlib import Path
from typing import Any

import pytest

from gateway.policy.opa_sidecar import REPO_ROOT
from tests.config.conftest import PVEGATE, write


def _keys(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    passout = ["-passout", "pass:a-passphrase"]  # the key is written encrypted
    cmd = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-keyout", str(key), "-out", str(cert)]
    subprocess.run(
        [*cmd, "-days", "1", "-subj", "/CN=127.0.0.1", *passout], check=True, capture_output=True, timeout=60
    )
    return cert, key


def _on_a_terminal(args: list[str], timeout: float) -> tuple[int, str]:
    """Run the real `pvegate` with a terminal of its own as controlling terminal (where OpenSSL prompts)
    and nobody typing: (exit status, what it wrote to the terminal and stderr)."""
    master, slave = os.openpty()

    def own_terminal() -> None:
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    env = {k: v for k, v in os.environ.items() if not k.startswith("PVEGATE_")}
    proc = subprocess.Popen(
        [*PVEGATE, *args],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
        env=env,
        preexec_fn=own_terminal,  # the controlling terminal is what is tested
    )
    os.close(slave)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        os.set_blocking(master, False)
        try:
            seen = os.read(master, 4096).decode(errors="replace")
        except OSError:
            seen = ""
        raise AssertionError(f"still waiting after {timeout} s; the terminal shows {seen!r}") from None
    finally:
        os.close(master)
    return proc.returncode, out.decode()


@pytest.mark.parametrize("files_check", [True, False])
def test_an_encrypted_tls_key_is_refused_without_a_prompt(
    base: dict[str, Any], tmp_path: Path, files_check: bool
) -> None:
    cert, key = _keys(tmp_path)
    base["tls"] = {"cert": str(cert), "key": str(key)}
    base["listen"]["port"] = 1  # never reached: the key is refused first
    path = write(tmp_path, base)
    args = ["config", "check", "--files", str(path)] if files_check else ["serve", "--config", str(path)]
    rc, out = _on_a_terminal(args, timeout=30)
    said = f"tls.key: {key} is encrypted: pvegate has no passphrase to give; store it decrypted (mode 0600)"
    if files_check:
        assert rc == 1 and out == f"{path}: {said}\n", out
    else:
        assert rc == 2 and out == f"pvegate: cannot start: {said}\n", out
    assert "pass phrase" not in out.lower() and "Traceback" not in out
