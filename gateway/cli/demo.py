"""`pvegate demo`: the simulator, the OPA sidecar and the gateway on one machine,
then a short scripted agent session through the official MCP SDK client.

With `--idp` (`make demo IDP=1`) a real Keycloak (gateway/dev/keycloak.py, provisioned by
`make tools`) starts too: the gateway trusts its realm instead of HS256 demo tokens, the admin
console is enabled, and the scripted session uses the provider's tokens (the agent's by client
credentials, alice's by the realm's password-grant test client)."""

from __future__ import annotations

import asyncio
import fcntl
import html
import os
import re
import secrets
import shutil
import socket
import ssl
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import uvicorn

from gateway.cli import clientconfig
from gateway.core.config import Config
from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv, make_env
from gateway.dev.keycloak import (
    AGENT_CLIENT,
    CONSOLE_CLIENT,
    KEYCLOAK_VERSION,
    SCOPE,
    KeycloakServer,
    KeycloakUnavailable,
    install_dir,
    java_home,
    provision_realm,
    start_keycloak,
)
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.server import uvicorn_config
from gateway.store.audit import verify as verify_audit
from gateway.tools.catalog import Catalog

DEMO_DIR = Path(os.environ.get("PVEGATE_DEMO_DIR") or REPO_ROOT / ".state" / "demo")
KEYCLOAK_START_TIMEOUT = 120.0  # ~10-20 s normally; a loaded machine gets more, never forever
IDP_SWITCH = "make demo IDP=1 (pvegate demo --idp)"


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
    say("  A held call (pending_approval): approve it as an approver (alice, group sre-leads), then")
    say('  retry the same call with the one-time token in params._meta["pvegate/approval"]')
    say("  (the Inspector: --tool-metadata pvegate/approval=<token>):")
    cli = Path(sys.executable).parent / "pvegate"  # the virtualenv's: `pvegate` may not be on PATH
    mint = f"{cli} token mint --config {env.config_path}"
    say(f"    export PVEGATE_APPROVER_TOKEN=$({mint} --sub alice --group sre-leads --kind human --ttl 600)")
    say(f"    {cli} approvals approve <apr-id> --config {env.config_path}")
    say("  Stop: Ctrl-C (the simulator and OPA stop with it). Demo-only: HS256 tokens signed here, a")
    say("  simulated Proxmox with a root token; deployment.md says what production needs instead.")
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


def hold_demo_dir(demo_dir: Path) -> IO[str] | None:
    """The demo directory's lock, held for the run: a second demo from the same directory (another
    port) would remove the first one's audit log and rewrite its configuration under it. None when
    another demo holds it."""
    demo_dir.mkdir(parents=True, exist_ok=True)
    lock = open(demo_dir / "demo.lock", "a+")  # held (open) for the demo's lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return None
    return lock


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


def _page_message(page: str) -> str:
    """The message of a Keycloak or console error page, for a one-line report."""
    found = re.search(r'class="instruction">([^<]+)<|<p[^>]*>([^<]+)</p>|<title>([^<]+)<', page)
    text = next((g for g in found.groups() if g), "") if found else page[:200]
    return " ".join(html.unescape(text).split())


def scripted_steps(env: DevEnv, admin_url: str, kc: KeycloakServer | None = None) -> list[Step]:
    """An operator agent's session: read, a guard-rail denial, and a four-eyes approval. With a
    Keycloak, its tokens: the agent client's (client credentials) and alice's (a login session)."""
    if kc is None:
        agent_name = "demo-agent"
        agent = env.token(agent_name, ["operator"])
        alice = env.token("alice", ["approver"], groups=["sre-leads"], kind="human")
    else:
        agent_name = AGENT_CLIENT
        agent = kc.client_credentials_token()
        alice = kc.password_token("alice")
    risky = ("vm_shutdown", {"node": "pve1", "vmid": 100, "timeout": 30})  # prod + HA: high risk
    state: dict[str, str] = {}
    verify = ssl.create_default_context(cafile=str(env.ca_file))

    async def list_tools() -> tuple[bool, str]:
        async with mcp_client(env.url, agent, env.ca_file) as client:
            tools = (await client.list_tools()).tools
        names = {t.name for t in tools}
        catalog = {t.name for t in Catalog.load(env.config.connectors_dir)}
        hidden = "guest_delete" not in names  # operators may never delete guests, so they never see it
        return "list_guests" in names and hidden, f"{agent_name} sees {visibility(names, catalog)}"

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

    async def console_sign_in() -> tuple[bool, str]:
        # what a browser does: the console sends alice to Keycloak's login form, she signs in, the
        # callback opens her session; then the approvals page is hers
        assert kc is not None
        async with httpx.AsyncClient(verify=verify, follow_redirects=True, timeout=30) as http:
            page = await http.get(f"{admin_url}/admin/login")
            form = re.search(r'<form[^>]*id="kc-form-login"[^>]*action="([^"]+)"', page.text)
            if page.status_code != 200 or form is None:
                return False, f"no Keycloak login form behind /admin/login (HTTP {page.status_code}, {page.url})"
            user = kc.users["alice"]
            # Keycloak marks its login cookies Secure; a browser sends them to http://127.0.0.1 (a secure
            # context), httpx's jar does not: they go by hand, and the redirect back is followed by hand
            cookies = "; ".join(f"{c.name}={c.value}" for c in http.cookies.jar if c.domain.startswith("127.0.0.1"))
            sent = await http.post(
                html.unescape(form.group(1)),
                data={"username": user.username, "password": user.password},
                headers={"cookie": cookies},
                follow_redirects=False,
            )
            done = await http.get(sent.headers.get("location", f"{admin_url}/admin/callback"))
            queue = await http.get(f"{admin_url}/admin/approvals", headers={"accept": "text/html"})
        signed_in = done.status_code == 200 and "Signed in" in done.text
        ok = signed_in and queue.status_code == 200 and 'id="who">alice<' in queue.text
        why = "" if signed_in else f": {_page_message(done.text)}"
        return (
            ok,
            f"alice signs in to {admin_url}/admin/ through Keycloak's login form (HTTP {done.status_code}{why});"
            f" her approvals page: HTTP {queue.status_code}",
        )

    async def audit_chain() -> tuple[bool, str]:
        result = verify_audit(env.config.audit_path, key=env.config.audit_key_path)
        return result.ok, f"pvegate audit verify: {result.checked} records, chain intact={result.ok}"

    console = [Step("the admin console: an approver signs in through Keycloak", console_sign_in)] if kc else []
    return [
        Step(f"tools/list as {agent_name} (operator)", list_tools),
        Step("an allowed read", allowed_read),
        Step("a guard-rail denial: delete a protected guest", guard_rail),
        Step("a risky call needs a human: shut down a prod HA guest", needs_approval),
        Step("four-eyes: the agent cannot approve itself", self_approval),
        Step("an approver approves", alice_approves),
        Step("the agent retries with the one-time token", retry_with_token),
        Step("the token cannot be replayed", replay),
        *console,
        Step("the audit chain verifies", audit_chain),
    ]


async def run_session(env: DevEnv, kc: KeycloakServer | None = None) -> bool:
    ok = True
    steps = await asyncio.to_thread(scripted_steps, env, env.url.removesuffix("/mcp"), kc)
    for i, step in enumerate(steps, 1):
        try:
            passed, detail = await step.run()
        except Exception as exc:
            passed, detail = False, f"{type(exc).__name__}: {exc}"
        ok &= passed
        say(f"[{i}] {step.title}: {'OK' if passed else 'UNEXPECTED'}\n    {detail}")
    return ok


def console_key(demo_dir: Path) -> Path:
    """The console's session-signing key, kept across runs like the demo's other secrets."""
    key = demo_dir / "secrets" / "console-session-key"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_text(secrets.token_urlsafe(48))
        key.chmod(0o600)
    return key


def idp_extra(kc: KeycloakServer, demo_dir: Path) -> dict[str, Any]:
    """The gateway's `auth` (the realm's tokens only) and `console` sections for a demo Keycloak."""
    auth = {**kc.auth_config(), "required_scopes": [SCOPE], "kind": {"agent_clients": [AGENT_CLIENT]}}
    console = {
        "enabled": True,
        "issuer": kc.issuer,
        "client_id": CONSOLE_CLIENT,
        "session_key": {"file": str(console_key(demo_dir))},
    }
    return {"auth": auth, "console": console}


def idp_help(env: DevEnv, kc: KeycloakServer) -> None:
    """The console URL, the demo users and how the agent gets a token (demo-only secrets)."""
    base = env.url.removesuffix("/mcp")
    say("=" * 72)
    say(f"Identity provider: Keycloak {KEYCLOAK_VERSION}, realm {kc.realm}")
    say(f"  Issuer:         {kc.issuer}")
    say(f"  Admin console:  {base}/admin/   (sign in through Keycloak; the browser must trust {env.ca_file})")
    say("  Demo users (demo-only passwords, made for this run's throw-away realm):")
    for u in kc.users.values():
        groups = f", group {', '.join(u.groups)}" if u.groups else ""
        say(f"    {u.username} / {u.password}   role {', '.join(u.roles)}{groups}")
    say(f"  Agent token:    client {AGENT_CLIENT} (client credentials, role operator, valid 10 min):")
    say(
        f"    curl -s -d grant_type=client_credentials -d client_id={AGENT_CLIENT}"
        f" -d client_secret={kc.agent_secret} {kc.token_url} | jq -r .access_token"
    )
    say(f"  Keycloak admin: {kc.base_url}/admin/   admin / {kc.admin_password}")
    say("=" * 72)


def _start_idp() -> KeycloakServer:
    kc = start_keycloak(timeout=KEYCLOAK_START_TIMEOUT)
    try:
        provision_realm(kc)
    except BaseException:
        kc.stop()
        raise
    return kc


async def _demo(oneshot: bool, port: int, idp: bool = False) -> int:
    # what can be checked without starting or writing anything, first
    if port_in_use("127.0.0.1", port):
        print(
            f"pvegate: cannot start: 127.0.0.1:{port} is in use; choose another with make demo PORT=<port>"
            " (or pvegate demo --port <port>)",
            file=sys.stderr,
        )
        return 2
    if idp:
        try:  # not provisioned: say so before starting anything
            java_home(install_dir())
        except KeycloakUnavailable as exc:
            print(f"pvegate: cannot start the identity provider: {exc}", file=sys.stderr)
            return 2
    lock = hold_demo_dir(DEMO_DIR)
    if lock is None:
        print(
            f"pvegate: cannot start: another demo runs from {DEMO_DIR} (its audit log and configuration are"
            " there); stop it first (Ctrl-C), or keep a second demo elsewhere with PVEGATE_DEMO_DIR=<dir>",
            file=sys.stderr,
        )
        return 2
    with lock:
        return await _demo_locked(oneshot, port, idp)


async def _demo_locked(oneshot: bool, port: int, idp: bool) -> int:
    kc: KeycloakServer | None = None
    if idp:
        say(f">> starting Keycloak {KEYCLOAK_VERSION} (about 10-20 s, at most {KEYCLOAK_START_TIMEOUT:.0f} s)")
        try:
            kc = await asyncio.to_thread(_start_idp)
        except (KeycloakUnavailable, httpx.HTTPError) as exc:
            print(f"pvegate: Keycloak did not come up: {exc}", file=sys.stderr)
            return 1
        say(f"   up in {kc.started_in:.1f} s, realm {kc.realm} provisioned in {kc.provisioned_in:.1f} s")
    try:
        return await _serve(oneshot, port, kc)
    finally:
        if kc is not None:
            kc.stop()


async def _serve(oneshot: bool, port: int, kc: KeycloakServer | None) -> int:
    from gateway.sim.harness import start_simulator

    say(">> starting the Proxmox VE simulator (scenario: default)")
    sim = await asyncio.to_thread(start_simulator, "default", DEMO_DIR / "sim")
    try:
        say(f"   API {sim.api_url}; SSH nodes: {', '.join(sim.ssh_nodes) or 'none'}")
        notice = reset_state(DEMO_DIR)
        if notice:
            say(notice)
        extra: dict[str, Any] = {
            "health": {"cluster_probe_interval": 15},
            # the production bound on audit rows of refused unauthenticated requests (the test
            # environments lift it): the demo's pvegate.yaml is what an operator copies
            "audit": {"path": str(DEMO_DIR / "state" / "audit.db")},
            # and the production per-principal limits (the test environments lift them too)
            "refused_calls_per_minute_per_principal": Config.refused_calls_per_minute_per_principal,
            "max_inflight_per_principal": Config.max_inflight_per_principal,
        }
        if kc is not None:
            extra.update(idp_extra(kc, DEMO_DIR))
        env = make_env(DEMO_DIR, {"default": sim}, port=port, extra=extra)
        say(">> starting OPA sidecar and gateway")
        server = uvicorn.Server(uvicorn_config(env.config))
        serving = asyncio.create_task(server.serve())
        while not server.started:
            if serving.done():
                serving.result()
                return 1
            await asyncio.sleep(0.05)
        if kc is None:
            connection_help(env, env.token("demo-agent", ["operator"], ttl_seconds=8 * 3600))
            say(f">> the admin console needs an identity provider: {IDP_SWITCH} starts Keycloak too")
        else:
            connection_help(env, await asyncio.to_thread(kc.client_credentials_token))
            idp_help(env, kc)
        say(">> scripted agent session (official mcp SDK client)")
        ok = await run_session(env, kc)
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


def run_demo(oneshot: bool = False, port: int = 8443, idp: bool = False) -> int:
    try:
        return asyncio.run(_demo(oneshot, port, idp))
    except KeyboardInterrupt:  # asyncio.run has run the demo's own clean-up by now
        say("\n>> demo stopped: the gateway, its simulator and OPA are down")
        return 130


if __name__ == "__main__":
    sys.exit(run_demo(oneshot="--oneshot" in sys.argv, idp="--idp" in sys.argv))
