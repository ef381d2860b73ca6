"""`pvegate approvals` on the database, with the approver's own token and a real OPA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.approvals.conftest import Api, outcome
from tests.approvals.test_flow import pending, shutdown_args, sim_shutdowns
from tests.support import GatewayThread


def pvegate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=Path(__file__).resolve().parents[2],
    )


async def test_cli_list_show_approve_with_temporary_sidecar(api: Api, asim: Any, tmp_path: Path) -> None:
    cfg = str(api.env.config_path)
    args = shutdown_args()
    aid, _ = await pending(api, "vm_shutdown", args)
    listed = pvegate("approvals", "list", "--config", cfg)
    assert listed.returncode == 0 and aid in listed.stdout
    shown = pvegate("approvals", "show", aid, "--config", cfg)
    assert shown.returncode == 0 and "vm_shutdown" in shown.stdout and "sre-leads" in shown.stdout

    no_identity = pvegate("approvals", "approve", aid, "--config", cfg)
    assert no_identity.returncode == 2 and "your own approver token" in no_identity.stderr

    token_file = tmp_path / "alice.jwt"
    token_file.write_text(api.human("alice", ["sre-leads"]))
    approved = pvegate("approvals", "approve", aid, "--config", cfg, "--token-file", str(token_file))
    assert approved.returncode == 0, approved.stderr
    lines = approved.stdout.splitlines()
    token = lines[lines.index("one-time approval token (shown once, stored only as a hash):") + 1].strip()
    res = await api.call(api.agent(), "vm_shutdown", args, approval=token)
    assert outcome(res) in ("allowed", "failed") and len(sim_shutdowns(asim, args["timeout"])) == 1
    assert "used" in pvegate("approvals", "show", aid, "--config", cfg).stdout


async def test_cli_list_pages_through_the_whole_queue(api: Api) -> None:
    """The CLI showed the first 200 requests and no more: a page at a time now, as the API does."""
    cfg = str(api.env.config_path)
    await pending(api, "vm_shutdown", shutdown_args())
    await pending(api, "vm_shutdown", {**shutdown_args(), "timeout": 91})
    seen: list[str] = []
    cursor: list[str] = []
    for _ in range(100):
        page = pvegate("approvals", "list", "--state", "all", "--limit", "1", *cursor, "--config", cfg)
        assert page.returncode == 0, page.stderr
        seen += [line.split()[0] for line in page.stdout.splitlines()]
        more = [ln for ln in page.stderr.splitlines() if ln.startswith("more requests: --cursor ")]
        if not more:
            break
        cursor = ["--cursor", more[0].split()[-1]]
    listed = pvegate("approvals", "list", "--state", "all", "--limit", "500", "--config", cfg)
    every = [line.split()[0] for line in listed.stdout.splitlines()]
    assert len(every) >= 2 and seen == every  # one at a time, the same requests in the same order
    bad = pvegate("approvals", "list", "--cursor", "nonsense", "--config", cfg)
    assert bad.returncode == 2 and "--cursor" in bad.stderr and "Traceback" not in bad.stderr
    assert pvegate("approvals", "list", "--limit", "0", "--config", cfg).returncode == 2


async def test_cli_refusals_come_from_opa(api: Api, agw: GatewayThread) -> None:
    cfg = str(api.env.config_path)
    aid, _ = await pending(api, "vm_shutdown", shutdown_args())
    opa = agw.components.decisions.url
    sidecar = agw.components.sidecar
    assert sidecar is not None and opa.startswith("unix://")  # the sidecar's socket: no token to pass
    os_env: dict[str, str] = {}
    bob = pvegate(
        "approvals",
        "deny",
        aid,
        "--config",
        cfg,
        "--opa-url",
        opa,
        env={**os_env, "PVEGATE_APPROVER_TOKEN": api.human("bob")},
    )
    assert bob.returncode == 1 and "not in any of the approver groups" in bob.stderr
    forged = pvegate("approvals", "approve", aid, "--config", cfg, "--opa-url", opa, "--token", "not-a-jwt", env=os_env)
    assert forged.returncode == 2 and "rejected" in forged.stderr
    unknown = pvegate("approvals", "show", "apr-nope", "--config", cfg)
    assert unknown.returncode == 4
    withdrawn = pvegate("approvals", "withdraw", aid, "--config", cfg, "--note", "cli test")
    assert withdrawn.returncode == 0
    assert "withdrawn" in pvegate("approvals", "show", aid, "--config", cfg).stdout
    verify = pvegate("audit", "verify", "--config", cfg)  # CLI appends joined the gateway's chain cleanly
    assert verify.returncode == 0, verify.stderr


async def test_cli_sidecar_keeps_off_the_gateways_pid_file(api: Api, agw: GatewayThread, tmp_path: Path) -> None:
    """`approvals approve` beside a running gateway starts its own short-lived OPA: that OPA
    must neither overwrite nor remove the gateway's opa.pid (it lets a restarted gateway reap
    an OPA its killed predecessor left behind)."""
    pid_file = api.env.config.state_dir / "opa.pid"
    sidecar = agw.components.sidecar
    assert sidecar is not None and sidecar.process is not None
    before = pid_file.read_text()
    assert before.split()[0] == str(sidecar.process.pid)
    aid, _ = await pending(api, "vm_shutdown", shutdown_args())
    token_file = tmp_path / "alice.jwt"
    token_file.write_text(api.human("alice", ["sre-leads"]))
    cfg = str(api.env.config_path)
    approved = pvegate("approvals", "approve", aid, "--config", cfg, "--token-file", str(token_file))
    assert approved.returncode == 0, approved.stderr
    assert pid_file.exists(), "the CLI's temporary OPA removed the live gateway's pid file"
    assert pid_file.read_text() == before
