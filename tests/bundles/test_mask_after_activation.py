"""A bundle activated while the gateway runs, with decision logs on, that drops `system.log.mask`.

The start checks the mask (tests/config/test_decision_log_mask.py) and `pvegate bundle build`
refuses a tree without it, but OPA's bundle plugin activates a new signed bundle on its own: one
built elsewhere (plain `opa build`, signed with the trusted key) without the mask would have OPA
log every call's arguments, passwords included, until the next restart. Once the gateway sees the
activation it checks the mask with a query that carries no input, and refuses every call, without
asking OPA, until a bundle with the mask is active again; readiness says so. Real OPA, real bundle
service (tests/bundles/test_rollout.py's), OPA's console decision log in state_dir/opa.log.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv, make_env
from gateway.policy.bundle_status import PolicyStatus, note_activation
from gateway.policy.bundles import build, keygen, manifest_of
from gateway.policy.decisions import DecisionClient
from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar, find_opa
from tests.bundles.test_bundle_revisions import _input
from tests.bundles.test_rollout import BundleService, _admin, _ctx, _wait
from tests.support import GatewayThread, free_port

REASON = (
    "the active policy bundle's data.system.log.mask does not remove tool arguments; decision logs are on: "
    "refusing every call until a bundle with the mask is active"
)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """masked1 and masked2 from `pvegate bundle build`; nomask from plain `opa build` (the gateway's
    build refuses the tree), signed with the same trusted key."""
    d = tmp_path_factory.mktemp("mask-activation")
    priv, pub = keygen(d / "keys")
    tree = d / "tree"
    shutil.copytree(REPO_ROOT / "policies", tree)
    build(tree, d / "masked1.tar.gz", priv, revision="masked1", checks=False, optimize=False)
    build(tree, d / "masked2.tar.gz", priv, revision="masked2", checks=False, optimize=False)
    stage = d / "nomask"
    shutil.copytree(REPO_ROOT / "policies", stage, ignore=shutil.ignore_patterns("*_test.rego", "golden", ".*", "log"))
    assert not (stage / "system" / "log").exists()
    cmd = [str(find_opa()), "build", "-b", ".", "-o", str(d / "nomask.tar.gz"), "--revision", "nomask"]
    cmd += ["--signing-key", str(priv), "--signing-alg", "RS256"]
    subprocess.run(cmd, cwd=stage, check=True, capture_output=True)
    assert manifest_of(d / "nomask.tar.gz").get("revision") == "nomask"
    return {"dir": d, "pub": pub}


@pytest.fixture(scope="module")
def service(bundles: dict[str, Any]) -> Iterator[BundleService]:
    root = bundles["dir"] / "srv"
    root.mkdir()
    shutil.copy(bundles["dir"] / "masked1.tar.gz", root / "pvegate.tar.gz")
    svc = BundleService(root)
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def gw(
    sim: object, bundles: dict[str, Any], service: BundleService, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevEnv]:
    opa = {
        "mode": "managed",
        "decision_logs": True,  # OPA's console decision log: state_dir/opa.log
        "services": {"policyhub": {"url": service.url}},
        "bundles": {
            "pvegate": {
                "service": "policyhub",
                "resource": "pvegate.tar.gz",
                "polling": {"min_delay_seconds": 1, "max_delay_seconds": 1},
                "signing": {"keyid": "policy-signer"},
            }
        },
        "keys": {"policy-signer": {"key": bundles["pub"].read_text(), "algorithm": "RS256"}},
    }
    env = make_env(tmp_path_factory.mktemp("gw-mask"), {"default": sim}, port=free_port(), opa=opa)  # type: ignore[dict-item]
    g = GatewayThread(env.config).start()
    yield env
    g.stop()


def _swap(src: Path, live: Path) -> None:
    tmp = live.with_suffix(".tmp")
    shutil.copy(src, tmp)
    tmp.rename(live)


async def _call(env: DevEnv, tool: str, args: dict[str, Any]) -> tuple[bool, str]:
    token = env.token("mask-agent", [], groups=["team-web"], kind="agent")
    async with mcp_client(env.url, token, env.ca_file) as client:
        res = await client.call_tool(tool, args)
    text = " ".join(getattr(c, "text", "") for c in res.content)
    return bool(res.is_error), text + " " + json.dumps(getattr(res, "structured_content", None) or {})


def _snapshot(env: DevEnv, marker: str) -> str:
    """A call whose argument is a secret (as a password would be): the text of its answer."""
    return asyncio.run(_call(env, "snapshot_create", {"vmid": 100, "snapname": marker}))[1]


def _bundle_revision(env: DevEnv) -> str | None:
    bundles = _admin(env, "/admin/health").json()["policy"].get("bundles") or [{}]
    return bundles[0].get("revision")  # type: ignore[no-any-return]


def _readyz(env: DevEnv) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(f"https://127.0.0.1:{env.config.port}/readyz", verify=_ctx(env)).json()
    return doc


def _logged_since(log_file: Path, offset: int) -> list[dict[str, Any]]:
    with open(log_file, "rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{") and '"decision_id"' in line]


def test_a_bundle_without_the_mask_refuses_every_call_until_one_with_it_is_active(
    gw: DevEnv, bundles: dict[str, Any], service: BundleService
) -> None:
    log_file = gw.config.state_dir / "opa.log"
    assert _bundle_revision(gw) == "masked1"
    assert _readyz(gw)["status"] == "ready"
    served = _snapshot(gw, marker0 := f"maskA{secrets.token_hex(5)}")
    assert "policy decision unavailable" not in served
    _wait(lambda: marker0 not in log_file.read_text() and "mask-agent" in log_file.read_text(), "the masked entry")

    # a signed bundle without the mask: OPA activates it; once the gateway has seen that, nothing more
    # that carries a call's input reaches OPA
    _swap(bundles["dir"] / "nomask.tar.gz", service.root / "pvegate.tar.gz")
    _wait(lambda: _bundle_revision(gw) == "nomask", "the unmasked bundle's activation")
    offset = log_file.stat().st_size
    secret = f"maskB{secrets.token_hex(5)}"
    refused = _snapshot(gw, secret)
    assert REASON in refused, refused
    health = _admin(gw, "/admin/health").json()
    assert health["status"] == "unready" and any(REASON in r for r in health["reasons"]), health["reasons"]
    ready = _readyz(gw)
    assert ready["status"] == "unready" and ready["checks"]["policy"]["detail"] == REASON, ready
    denied, text = asyncio.run(_call(gw, "list_nodes", {}))
    assert denied and REASON in text
    time.sleep(2.5)  # OPA writes an entry after it answers; the readiness probe asks every 2 s
    assert secret not in log_file.read_text()
    # no decision with an input at all (the mask's own query carries none)
    assert not [e for e in _logged_since(log_file, offset) if (e.get("input") or {}).get("arguments") is not None]

    # a bundle with the mask again: served again, arguments masked
    _swap(bundles["dir"] / "masked2.tar.gz", service.root / "pvegate.tar.gz")
    _wait(lambda: _readyz(gw)["status"] == "ready", "ready again")
    assert _bundle_revision(gw) == "masked2"
    denied, text = asyncio.run(_call(gw, "list_nodes", {}))
    assert "policy decision unavailable" not in text
    served = _snapshot(gw, marker2 := f"maskC{secrets.token_hex(5)}")
    assert "policy decision unavailable" not in served
    time.sleep(1.0)
    assert marker2 not in log_file.read_text() and secret not in log_file.read_text()


def _secret_input(secret: str) -> dict[str, Any]:
    doc = _input()
    doc["arguments"] = {**doc["arguments"], "password": secret}
    return doc


def _active(opa: OPASidecar) -> str | None:
    with opa.client(timeout=2) as c:
        st = c.get("/v1/status").json()["result"]["bundles"]["pvegate"]
    return st.get("active_revision")  # type: ignore[no-any-return]


def test_the_decision_client_asks_the_mask_itself(bundles: dict[str, Any], tmp_path: Path) -> None:
    """Without the status poll: a decision under a revision the client has not seen has the mask asked
    (that one decision is logged already: the documented window), and an activation the client knows
    of (note_activation, as the poll counts one) has it asked before any input is sent."""
    d, log_file = bundles["dir"], tmp_path / "opa.log"
    live = tmp_path / "live.tar.gz"
    _swap(d / "masked1.tar.gz", live)
    opa = OPASidecar(
        bundle=live, verification_key=bundles["pub"], watch_bundle=True, bundle_poll_seconds=1,
        decision_logs=True, log_file=log_file,
    )  # fmt: skip
    opa.start(timeout=30)
    client = DecisionClient(opa.url, 5000)
    loop = asyncio.new_event_loop()
    try:
        first = loop.run_until_complete(client.decide(_secret_input(s0 := f"maskD{secrets.token_hex(5)}")))
        assert not first.failed_closed and client.log_mask_refusal is None

        _swap(d / "nomask.tar.gz", live)
        _wait(lambda: _active(opa) == "nomask", "the unmasked bundle's activation")
        # the first answer under the new revision: refused once it is seen to be unmasked
        seen = loop.run_until_complete(client.decide(_secret_input(f"maskE{secrets.token_hex(5)}")))
        assert seen.failed_closed and seen.deny == (f"denied: policy decision unavailable ({REASON})",)
        assert client.log_mask_refusal == REASON
        s1 = f"maskF{secrets.token_hex(5)}"
        assert loop.run_until_complete(client.decide(_secret_input(s1))).deny == seen.deny
        assert loop.run_until_complete(client.visible_tools(_secret_input(s1))) is None

        # a bundle with the mask: the status poll sees its activation and asks the mask again
        _swap(d / "masked2.tar.gz", live)
        _wait(lambda: _active(opa) == "masked2", "the masked bundle's activation")
        status = PolicyStatus(opa.url, opa.source)
        _wait(lambda: asyncio.run(status.refresh_once()) or client.log_mask_refusal is None, "the mask again")
        assert not loop.run_until_complete(client.decide(_secret_input(f"maskG{secrets.token_hex(5)}"))).failed_closed

        # an activation counted (as the poll counts one) before anyone asked its mask: the client asks
        # it, with no input, before it sends the call
        _swap(d / "nomask.tar.gz", live)
        _wait(lambda: _active(opa) == "nomask", "the unmasked bundle again")
        note_activation(opa.url)
        s2 = f"maskH{secrets.token_hex(5)}"
        assert loop.run_until_complete(client.decide(_secret_input(s2))).deny == seen.deny
        time.sleep(1.0)  # OPA writes an entry after it answers
        text = log_file.read_text()
        assert s0 not in text and s1 not in text and s2 not in text
    finally:
        loop.run_until_complete(client.close())
        loop.close()
        opa.stop()
