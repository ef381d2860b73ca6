"""The shell samples of README.md and docs/ marked runnable run as written against a live
simulator + gateway, and exit 0.

Convention: a fenced ```sh block directly preceded by a `<!-- runnable -->` line. It runs
under `bash -euo pipefail` (every command must succeed) in a scratch directory that looks
like a checkout after `make demo`: `policies/`, `connectors/` and `.venv/` of this repository,
`.state/demo/` holding a live environment's config, TLS, secrets and state, and `pvegate`
on PATH. `$PVEGATE_CONFIG` and `$PVEGATE_AUDIT_DB` name that configuration and its audit
database (the docs say so where they use them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.dev.devenv import DevEnv
from tests.support import GatewayThread

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- runnable -->"
BLOCK = re.compile(r"^" + re.escape(MARK) + r"\n```sh\n(.*?)\n```", re.M | re.S)
# the commands an SRE uses, each of which must appear in some runnable sample
SRE_COMMANDS = (
    "pvegate token mint",
    "pvegate audit verify",
    "pvegate audit tail",
    "pvegate audit search",
    "pvegate audit export",
    "pvegate tools show",
    "pvegate tools least-privilege",
    "pvegate policy eval",
    "pvegate check",
    "pvegate approvals list",
)


def runnable_blocks() -> list[tuple[str, str]]:
    out = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append((f"{doc.relative_to(ROOT)}:{line}", m.group(1)))
    return out


BLOCKS = runnable_blocks()


def test_the_sre_commands_have_runnable_samples() -> None:
    text = "\n".join(body for _, body in BLOCKS)
    missing = [c for c in SRE_COMMANDS if c not in text]
    assert not missing, f"no runnable sample for: {', '.join(missing)}"


@pytest.fixture(scope="module")
def checkout(env: DevEnv, gateway: GatewayThread, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("docs-checkout")
    for name in ("policies", "connectors"):
        (work / name).symlink_to(ROOT / name)
    (work / ".venv").symlink_to(Path(sys.prefix))  # README's commands say .venv/bin/pvegate
    (work / ".state").mkdir()
    (work / ".state" / "demo").symlink_to(env.workdir)
    return work


@pytest.mark.parametrize(("where", "script"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_runnable_sample(where: str, script: str, checkout: Path, env: DevEnv) -> None:
    shell_env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PVEGATE_CONFIG": str(env.config_path),
        "PVEGATE_AUDIT_DB": str(env.config.audit_path),
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=checkout,
        env=shell_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{where} failed (exit {done.returncode}):\n{script}\n---\n{out[-3000:]}"
    assert "Traceback" not in out, out[-3000:]


def test_the_deployment_config_example_passes_config_check(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "deployment.md").read_text()
    example = re.search(r"^```yaml\n(.*?)\n```", text, re.M | re.S)
    assert example, "docs/deployment.md has no yaml example"
    path = tmp_path / "pvegate.yaml"
    path.write_text(example.group(1))
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
