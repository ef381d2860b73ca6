"""`make demo ONESHOT=1` is half of the README's contract: run it as a user would."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

from gateway.cli import clientconfig
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]


def _demo(demo_dir: Path, port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "demo", "--oneshot", "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PVEGATE_DEMO_DIR": str(demo_dir)},
        cwd=ROOT,
    )


def test_demo_oneshot_behaves(tmp_path: Path) -> None:
    demo_dir = tmp_path / "demo"
    (demo_dir / "state").mkdir(parents=True)
    (demo_dir / "state" / "audit.db").write_text("a previous run's records")
    port = free_port()
    done = _demo(demo_dir, port)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "demo: all steps behaved" in out
    assert out.count(": OK") >= 9, out[-4000:]
    assert "Traceback" not in out
    # the configuration an operator copies from the demo keeps the production bound on audit rows of
    # refused unauthenticated requests (the test environments lift it)
    assert "auth_failure_rows_per_minute" not in (demo_dir / "pvegate.yaml").read_text()
    # it names the switch that adds the identity provider and the console (tests/e2e/test_demo_idp.py)
    assert "the admin console needs an identity provider: make demo IDP=1 (pvegate demo --idp)" in out
    # it says that it wiped the previous run's audit and approvals
    assert f"removed the previous demo's audit log and approval requests ({demo_dir / 'state'})" in out

    # the README's statement of what demo-agent sees is the demo's own answer
    seen = re.search(r"demo-agent sees (\d+ of \d+; hidden: .*)", out)
    assert seen, out[-4000:]
    count, hidden = seen.group(1).split("; hidden: ")
    readme_words = f"({count}; hidden: " + ", ".join(f"`{n}`" for n in hidden.split(", ")) + ")"
    assert readme_words in (ROOT / "README.md").read_text(), f"README.md should say {readme_words}"

    # the client snippets are printed with the real URL and token, in the README's formats
    url = f"https://127.0.0.1:{port}/mcp"
    token = re.search(r"Bearer token:\s+(\S+)", out)
    assert token
    for snippet in clientconfig.snippets(url, token.group(1), str(demo_dir / "tls" / "ca.pem")):
        for line in snippet.text.splitlines():
            assert line in out, f"{snippet.client}: {line!r} not printed"
        if snippet.lang == "json":
            json.loads(snippet.text)

    # how to approve a held call from the shell, as printed: the approver's token it mints is a JWT
    mint = re.search(r"export PVEGATE_APPROVER_TOKEN=\$\((.+)\)$", out, re.M)
    assert mint, out
    minted = subprocess.run(shlex.split(mint.group(1)), capture_output=True, text=True, timeout=60, check=False)
    assert minted.returncode == 0 and minted.stdout.strip().count(".") == 2, minted.stdout + minted.stderr
    assert re.search(r"/pvegate approvals approve <apr-id> --config \S+pvegate\.yaml$", out, re.M), out


def test_a_second_demo_from_the_same_directory_says_so_and_touches_nothing(tmp_path: Path) -> None:
    """Another port does not make another demo: the state directory (its audit log, its configuration)
    is the running demo's, and removing it under that demo would lose its audit."""
    demo_dir = tmp_path / "demo"
    (demo_dir / "state").mkdir(parents=True)
    audit = demo_dir / "state" / "audit.db"
    audit.write_text("the running demo's records")
    with open(demo_dir / "demo.lock", "a+") as running:  # as the first demo holds it
        fcntl.flock(running, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = _demo(demo_dir, free_port())
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"pvegate: cannot start: another demo runs from {demo_dir} (its audit log and configuration are there);"
        " stop it first (Ctrl-C), or keep a second demo elsewhere with PVEGATE_DEMO_DIR=<dir>"
    ], done.stderr
    assert audit.read_text() == "the running demo's records"
    assert not (demo_dir / "pvegate.yaml").exists()


def test_demo_on_a_busy_port_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _demo(tmp_path / "demo", port)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"pvegate: cannot start: 127.0.0.1:{port} is in use; choose another with make demo PORT=<port>"
        " (or pvegate demo --port <port>)"
    ], done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_make_demo_passes_the_port_on() -> None:
    # run as `make test` runs it too: a nested make (MAKELEVEL > 0) prints "Leaving directory" lines
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "demo", "PORT=9443"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].split()[-3:] == ["demo", "--port", "9443"]


def test_ctrl_c_stops_the_demo_and_says_so(tmp_path: Path) -> None:
    """The README: Ctrl-C stops the demo, its simulator and OPA with it. It did, and printed nothing."""
    import signal
    import time

    demo_dir, port = tmp_path / "demo", free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "demo", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PVEGATE_DEMO_DIR": str(demo_dir)},
        cwd=ROOT,
        start_new_session=True,
    )
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 240
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if "serving until Ctrl-C" in line:
                break
            assert time.monotonic() < deadline, "".join(seen[-40:])
        else:
            raise AssertionError("the demo ended before serving: " + "".join(seen[-40:]))
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 130, rest[-3000:]
    assert ">> demo stopped: the gateway, its simulator and OPA are down" in rest, rest[-3000:]
    assert "Traceback" not in rest
    left = subprocess.run(["pgrep", "-f", str(demo_dir)], capture_output=True, text=True, check=False)
    assert left.stdout.strip() == "", left.stdout
