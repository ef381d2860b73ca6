"""`pvegate demo`: the simulator, the OPA sidecar and the gateway on one machine,
then a short scripted agent session through the official MCP SDK client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import uvicorn

from gateway.client import mcp_client
from gateway.devenv import DevEnv, make_env
from gateway.opa_sidecar import REPO_ROOT
from gateway.server import uvicorn_config

DEMO_DIR = REPO_ROOT / ".state" / "demo"


@dataclass
class Step:
    title: str
    run: Callable[[], Awaitable[tuple[bool, str]]]


def say(text: str = "") -> None:
    print(text, flush=True)


def connection_help(env: DevEnv, token: str) -> None:
    snippet = {
        "mcpServers": {
            "pvegate": {
                "type": "streamable-http",
                "url": env.url,
                "headers": {"Authorization": f"Bearer {token}"},
            }
        }
    }
    say("=" * 72)
    say("pvegate is serving MCP over HTTPS")
    say(f"  URL:            {env.url}")
    say(f"  CA certificate: {env.ca_file}   (e.g. NODE_EXTRA_CA_CERTS / SSL_CERT_FILE)")
    say(f"  Bearer token:   {token}")
    say(f"  Audit database: {env.config.audit_path}")
    say("  Client config snippet:")
    for line in json.dumps(snippet, indent=2).splitlines():
        say("    " + line)
    say("=" * 72)


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


def scripted_steps(env: DevEnv) -> list[Step]:
    agent = env.token("demo-agent", ["operator"])
    stranger = env.token("demo-stranger", [])

    async def list_tools() -> tuple[bool, str]:
        async with mcp_client(env.url, agent, env.ca_file) as client:
            tools = await client.list_tools()
        names = [t.name for t in tools.tools]
        return "list_nodes" in names, f"demo-agent sees {len(names)} tools: {', '.join(names[:8])}..."

    async def allowed_read() -> tuple[bool, str]:
        async with mcp_client(env.url, agent, env.ca_file) as client:
            res = await client.call_tool("list_nodes", {})
        items = (res.structured_content or {}).get("items", [])
        nodes = ", ".join(f"{n.get('node')}({n.get('status')})" for n in items)
        return (not res.is_error and bool(items)), f"list_nodes allowed -> {nodes}"

    async def denied_call() -> tuple[bool, str]:
        async with mcp_client(env.url, stranger, env.ca_file) as client:
            res = await client.call_tool("list_nodes", {})
        return res.is_error and "Denied by policy" in _text(res), f"no-role principal -> {_text(res)}"

    return [
        Step("tools/list as demo-agent (operator)", list_tools),
        Step("an allowed read: list_nodes", allowed_read),
        Step("a denied call: a principal with no role", denied_call),
    ]


async def run_session(env: DevEnv) -> bool:
    ok = True
    for i, step in enumerate(scripted_steps(env), 1):
        try:
            passed, detail = await step.run()
        except Exception as exc:
            passed, detail = False, f"{type(exc).__name__}: {exc}"
        ok &= passed
        say(f"[{i}] {step.title}: {'OK' if passed else 'UNEXPECTED'}\n    {detail}")
    return ok


async def _demo(oneshot: bool, port: int) -> int:
    from gateway.sim.harness import start_simulator

    say(">> starting the Proxmox VE simulator (scenario: default)")
    sim = await asyncio.to_thread(start_simulator, "default", DEMO_DIR / "sim")
    try:
        say(f"   API {sim.api_url}; SSH nodes: {', '.join(sim.ssh_nodes) or 'none'}")
        env = make_env(DEMO_DIR, {"default": sim}, port=port)
        say(">> starting OPA sidecar and gateway")
        server = uvicorn.Server(uvicorn_config(env.config))
        serving = asyncio.create_task(server.serve())
        while not server.started:
            if serving.done():
                serving.result()
                return 1
            await asyncio.sleep(0.05)
        connection_help(env, env.token("demo-agent", ["operator"], ttl_seconds=8 * 3600))
        say(">> scripted agent session (official mcp SDK client)")
        ok = await run_session(env)
        if oneshot:
            server.should_exit = True
            await serving
            say("demo: all steps behaved" if ok else "demo: some steps did not behave")
            return 0 if ok else 1
        say("serving until Ctrl-C")
        await serving
        return 0 if ok else 1
    finally:
        sim.stop()


def run_demo(oneshot: bool = False, port: int = 8443) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_demo(oneshot, port))
    return 130


if __name__ == "__main__":
    sys.exit(run_demo(oneshot="--oneshot" in sys.argv))
