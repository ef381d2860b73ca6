"""`pvegate demo`: the simulator, the OPA sidecar and the gateway on one machine,
then a short scripted agent session through the official MCP SDK client."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import ssl
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from gateway.cli import clientconfig
from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv, make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.server import uvicorn_config
from gateway.store.audit import verify as verify_audit
from gateway.tools.catalog import Catalog

DEMO_DIR = Path(os.environ.get("PVEGATE_DEMO_DIR") or REPO_ROOT / ".state" / "demo")


@dataclass
class Step:
    title: str
    run: Callable[[], Awaitable[tuple[bool, str]]]


def say(text: str = "") -> None:
    print(text, flush=True)


def connection_help(env: DevEnv, token: str) -> None:
    say("=" * 72)
    say("pvegate is serving MCP over HTTPS")
    say(f"  URL:            {env.url}")
    say(f"  CA certificate: {env.ca_file}   (e.g. NODE_EXTRA_CA_CERTS / SSL_CERT_FILE)")
    say(f"  Bearer token:   {token}")
    say(f"  Audit database: {env.config.audit_path}")
    say(f"  Config:         {env.config_path}")
    say("  Client configuration (the formats of README.md, values filled in):")
    for line in clientconfig.console(env.url, token, str(env.ca_file)):
        say(line)
    say("=" * 72)


def visibility(visible: set[str], catalog: set[str], code: str = "") -> str:
    """How many tools a principal sees, and which are hidden (the README's words, from the live answer)."""
    hidden = ", ".join(f"{code}{n}{code}" for n in sorted(catalog - visible))
    return f"{len(visible & catalog)} of {len(catalog)}; hidden: {hidden or 'none'}"


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def reset_state(demo_dir: Path) -> str | None:
    """A fresh audit and approval store each run (TLS and secrets are kept, so client configs
    stay valid). Returns the notice to print when a previous run's records were removed."""
    state = demo_dir / "state"
    had_records = state.is_dir() and any(state.iterdir())
    shutil.rmtree(state, ignore_errors=True)
    if not had_records:
        return None
    return (
        f">> removed the previous demo's audit log and approval requests ({state}); "
        "TLS certificates, secrets and tokens are kept"
    )


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


def _meta(result: Any) -> dict[str, Any]:
    return dict(getattr(result, "meta", None) or {})


def scripted_steps(env: DevEnv, admin_url: str) -> list[Step]:
    """An operator agent's session: read, a guard-rail denial, and a four-eyes approval."""
    agent = env.token("demo-agent", ["operator"])
    alice = env.token("alice", ["approver"], groups=["sre-leads"], kind="human")
    risky = ("vm_shutdown", {"node": "pve1", "vmid": 100, "timeout": 30})  # prod + HA: high risk
    state: dict[str, str] = {}
    verify = ssl.create_default_context(cafile=str(env.ca_file))

    async def list_tools() -> tuple[bool, str]:
        async with mcp_client(env.url, agent, env.ca_file) as client:
            tools = (await client.list_tools()).tools
        names = {t.name for t in tools}
        catalog = {t.name for t in Catalog.load(env.config.connectors_dir)}
        hidden = "guest_delete" not in names  # operators may never delete guests, so they never see it
        return "list_guests" in names and hidden, f"demo-agent sees {visibility(names, catalog)}"

    async def allowed_read() -> tuple[bool, str]:
        async with mcp_client(env.url, agent, env.ca_file) as client:
            res = await client.call_tool("list_guests", {})
        items = (res.structured_content or {}).get("items", [])
        prod = sum(1 for g in items if "prod" in (g.get("tags") or []))
        return not res.is_error and bool(items), f"list_guests allowed: {len(items)} guests, {prod} tagged prod"

    async def guard_rail() -> tuple[bool, str]:
        async with mcp_client(env.url, agent, env.ca_file) as client:
            res = await client.call_tool("guest_delete", {"node": "pve2", "vmid": 107})
        return res.is_error and "protected" in _text(res), _text(res)

    async def needs_approval() -> tuple[bool, str]:
        async with mcp_client(env.url, agent, env.ca_file) as client:
            res = await client.call_tool(*risky)
        meta = _meta(res)
        state["approval"] = str(meta.get("pvegate/approval_id", ""))
        ok = res.is_error and meta.get("pvegate/outcome") == "pending_approval" and bool(state["approval"])
        return ok, _text(res)[:220] + "..."

    async def self_approval() -> tuple[bool, str]:
        async with httpx.AsyncClient(verify=verify) as http:
            r = await http.post(
                f"{admin_url}/admin/approvals/{state['approval']}/approve",
                headers={"Authorization": f"Bearer {agent}"},
                json={"note": "I approve myself"},
            )
        return (
            r.status_code == 403,
            f"the agent tries to approve its own request -> HTTP {r.status_code}: {r.text[:160]}",
        )

    async def alice_approves() -> tuple[bool, str]:
        async with httpx.AsyncClient(verify=verify) as http:
            r = await http.post(
                f"{admin_url}/admin/approvals/{state['approval']}/approve",
                headers={"Authorization": f"Bearer {alice}"},
                json={"note": "planned maintenance"},
            )
        token = r.json().get("token", "") if r.status_code == 200 else ""
        state["token"] = token
        return bool(token), f"alice (sre-leads) approves -> HTTP {r.status_code}, one-time token issued (shown once)"

    async def retry_with_token() -> tuple[bool, str]:
        async with mcp_client(env.url, agent, env.ca_file) as client:
            res = await client.call_tool(*risky, meta={"pvegate/approval": state["token"]})  # type: ignore[arg-type]
        upid = str((res.structured_content or {}).get("upid", ""))
        return not res.is_error and upid.startswith("UPID:"), f"retry with the token runs: {upid or _text(res)}"

    async def replay() -> tuple[bool, str]:
        async with mcp_client(env.url, agent, env.ca_file) as client:
            res = await client.call_tool(*risky, meta={"pvegate/approval": state["token"]})  # type: ignore[arg-type]
        return res.is_error and "used" in _text(res), f"replaying the token -> {_text(res)}"

    async def audit_chain() -> tuple[bool, str]:
        result = verify_audit(env.config.audit_path, key=env.config.audit_key_path)
        return result.ok, f"pvegate audit verify: {result.checked} records, chain intact={result.ok}"

    return [
        Step("tools/list as demo-agent (operator)", list_tools),
        Step("an allowed read", allowed_read),
        Step("a guard-rail denial: delete a protected guest", guard_rail),
        Step("a risky call needs a human: shut down a prod HA guest", needs_approval),
        Step("four-eyes: the agent cannot approve itself", self_approval),
        Step("an approver approves", alice_approves),
        Step("the agent retries with the one-time token", retry_with_token),
        Step("the token cannot be replayed", replay),
        Step("the audit chain verifies", audit_chain),
    ]


async def run_session(env: DevEnv) -> bool:
    ok = True
    for i, step in enumerate(scripted_steps(env, env.url.removesuffix("/mcp")), 1):
        try:
            passed, detail = await step.run()
        except Exception as exc:
            passed, detail = False, f"{type(exc).__name__}: {exc}"
        ok &= passed
        say(f"[{i}] {step.title}: {'OK' if passed else 'UNEXPECTED'}\n    {detail}")
    return ok


async def _demo(oneshot: bool, port: int) -> int:
    from gateway.sim.harness import start_simulator

    if port_in_use("127.0.0.1", port):
        print(
            f"pvegate: cannot start: 127.0.0.1:{port} is in use; choose another with make demo PORT=<port>"
            " (or pvegate demo --port <port>)",
            file=sys.stderr,
        )
        return 2
    say(">> starting the Proxmox VE simulator (scenario: default)")
    sim = await asyncio.to_thread(start_simulator, "default", DEMO_DIR / "sim")
    try:
        say(f"   API {sim.api_url}; SSH nodes: {', '.join(sim.ssh_nodes) or 'none'}")
        notice = reset_state(DEMO_DIR)
        if notice:
            say(notice)
        env = make_env(DEMO_DIR, {"default": sim}, port=port, extra={"health": {"cluster_probe_interval": 15}})
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
