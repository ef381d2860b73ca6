"""The MCP Inspector's CLI mode (a second, independent client from the npm registry) against the live gateway.

Installed by scripts/provision-inspector.sh into .tools/node (make tools); skipped with that
hint if it is absent. TLS is verified against the dev CA via NODE_EXTRA_CA_CERTS.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from tests.support import GatewayThread, audit_rows

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / ".tools/node/node_modules/@modelcontextprotocol/inspector-cli/build/index.js"

pytestmark = pytest.mark.skipif(
    not CLI.exists() or shutil.which("node") is None,
    reason="MCP Inspector not installed: run scripts/provision-inspector.sh",
)


def inspector(env: DevEnv, token: str, *args: str) -> tuple[int, Any, str]:
    cmd = ["node", str(CLI), env.url, "--transport", "http", "--header", f"Authorization: Bearer {token}", *args]
    proc = subprocess.run(
        cmd,
        cwd=CLI.parent,  # 0.21.2 resolves its own package.json relative to the cwd
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NODE_EXTRA_CA_CERTS": str(env.ca_file)},
    )
    try:
        out = json.loads(proc.stdout) if proc.stdout.strip() else None
    except json.JSONDecodeError:
        out = None
    return proc.returncode, out, proc.stdout + proc.stderr


def test_inspector_lists_tools(gateway: GatewayThread, env: DevEnv) -> None:
    rc, out, text = inspector(env, env.token("demo-agent", ["operator"]), "--method", "tools/list")
    assert rc == 0, text
    tools = {t["name"]: t for t in out["tools"]}
    assert "list_nodes" in tools and tools["list_nodes"]["inputSchema"]["type"] == "object"


def test_inspector_calls_a_read_tool(gateway: GatewayThread, env: DevEnv) -> None:
    rc, out, text = inspector(
        env, env.token("demo-agent", ["operator"]), "--method", "tools/call", "--tool-name", "list_nodes"
    )
    assert rc == 0, text
    assert out["isError"] is False and out["structuredContent"]["items"]
    rid = out["_meta"]["pvegate/request_id"]
    assert [r["kind"] for r in audit_rows(env.config.audit_path, rid)] == ["received", "decision", "result"]


def test_inspector_sees_a_policy_denial(gateway: GatewayThread, env: DevEnv) -> None:
    rc, out, text = inspector(
        env, env.token("demo-stranger", []), "--method", "tools/call", "--tool-name", "list_nodes"
    )
    assert rc == 0, text
    assert out["isError"] is True and "Denied by policy" in out["content"][0]["text"]


def test_inspector_without_token_is_refused(gateway: GatewayThread, env: DevEnv) -> None:
    rc, _, text = inspector(env, "not-a-jwt", "--method", "tools/list")
    assert rc != 0 and "invalid_token" in text


def test_the_readme_inspector_command_works(gateway: GatewayThread, env: DevEnv) -> None:
    """The Inspector line of README.md / `pvegate demo`, run as written (npx replaced by the
    pinned local install of the same package)."""
    import shlex

    from gateway.cli import clientconfig

    snippet = next(s for s in clientconfig.snippets(env.url, env.token("demo-agent", ["operator"]), str(env.ca_file))
                   if s.client == "MCP Inspector")  # fmt: skip
    words = shlex.split(snippet.text)
    ca, npx, yes, package, *args = words
    assert (npx, yes, package) == ("npx", "-y", clientconfig.INSPECTOR)  # -y: runs without a terminal to ask
    name, _, value = ca.partition("=")
    bin_js = ROOT / ".tools/node/node_modules/@modelcontextprotocol/inspector/cli/build/cli.js"
    proc = subprocess.run(
        ["node", str(bin_js), *args],
        cwd=ROOT,  # where a user runs it: the checkout
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, name: value},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "list_guests" in {t["name"] for t in json.loads(proc.stdout)["tools"]}
