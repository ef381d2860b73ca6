"""Rollout without a restart, with status; decision logs to a remote sink.

A local bundle service on 127.0.0.1 (a plain HTTP server in this test) serves signed
bundles to the gateway's managed OPA, configured through pvegate's pass-through of OPA's
`services`, `bundles` and `keys`; the same server receives OPA's decision-log uploads.
A new revision activates (a call's decision changes and the revision shows in the audit
and the admin API); a tampered one is refused, shows up in /admin/health and the metrics,
and the previous revision keeps deciding. The watched bundle file works the same way.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import http.server
import io
import json
import logging
import secrets
import shutil
import ssl
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv, make_env
from gateway.policy.bundle_status import PolicyStatus
from gateway.policy.bundles import build, keygen
from gateway.policy.opa_address import httpx_async_client
from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar
from tests.support import GatewayThread, audit_rows, free_port

DENY_CANARY = """    - name: canary-no-node-list
      principal_groups: [rollout-canary]
      tools: [list_nodes]
      reason: the canary group may not list nodes in this revision
"""


class BundleService:
    """Serves files from a directory (with ETags) and collects decision-log uploads."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.logs: list[dict[str, Any]] = []
        self.raw: list[bytes] = []
        svc = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                f = svc.root / self.path.lstrip("/").split("?")[0]
                if not f.is_file():
                    self.send_error(404)
                    return
                data = f.read_bytes()
                etag = '"' + hashlib.sha256(data).hexdigest() + '"'
                if self.headers.get("If-None-Match") == etag:
                    self.send_response(304)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                svc.raw.append(body)
                svc.logs.extend(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _members(bundle: Path) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(bundle) as tar:
        return {m.name: (m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()}  # type: ignore[union-attr]


def tamper(src: Path, dst: Path) -> None:
    """The bundle with its data changed after signing (the canary rule removed)."""
    buf = io.BytesIO()
    changed = False
    with tarfile.open(fileobj=buf, mode="w:gz") as out:
        for name, (m, data) in _members(src).items():
            if name.lstrip("/") == "data.json" and data is not None:
                doc = json.loads(data)
                rules = doc["data"]["guardrails"]["deny_rules"]
                doc["data"]["guardrails"]["deny_rules"] = [r for r in rules if "canary" not in r["name"]]
                changed = len(rules) != len(doc["data"]["guardrails"]["deny_rules"])
                data = json.dumps(doc).encode()
                m.size = len(data)
            out.addfile(m, io.BytesIO(data) if data is not None else None)
    assert changed, "the canary rule was not found in the bundle's data"
    dst.write_bytes(buf.getvalue())


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Revision 1 (the shipped policies), revision 2 (a deny rule for the canary group), a tampered 2."""
    d = tmp_path_factory.mktemp("rollout")
    priv, pub = keygen(d / "keys")
    tree = d / "tree"
    shutil.copytree(REPO_ROOT / "policies", tree)
    rev1 = build(tree, d / "rev1.tar.gz", priv, revision=f"rev1-{secrets.token_hex(3)}", checks=False)
    data = tree / "data" / "data.yaml"
    data.write_text(data.read_text().replace("  deny_rules:\n", "  deny_rules:\n" + DENY_CANARY, 1))
    rev2 = build(tree, d / "rev2.tar.gz", priv, revision=f"rev2-{secrets.token_hex(3)}", checks=False)
    tamper(d / "rev2.tar.gz", d / "evil.tar.gz")
    return {"dir": d, "pub": pub, "rev1": rev1, "rev2": rev2}


@pytest.fixture(scope="module")
def service(bundles: dict[str, Any]) -> Iterator[BundleService]:
    root = bundles["dir"] / "srv"
    root.mkdir()
    shutil.copy(bundles["dir"] / "rev1.tar.gz", root / "pvegate.tar.gz")
    svc = BundleService(root)
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def gw(
    sim: object, bundles: dict[str, Any], service: BundleService, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevEnv]:
    opa = {
        "mode": "managed",
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
        "decision_logs_upload": {"service": "policyhub", "reporting": {"min_delay_seconds": 1, "max_delay_seconds": 1}},
    }
    env = make_env(tmp_path_factory.mktemp("gw-rollout"), {"default": sim}, port=free_port(), opa=opa)  # type: ignore[dict-item]
    g = GatewayThread(env.config).start()
    yield env
    g.stop()


def _admin(env: DevEnv, path: str) -> httpx.Response:
    assert env.config.admin.token is not None
    headers = {"Authorization": f"Bearer {env.config.admin.token.read()}"}
    return httpx.get(
        f"https://127.0.0.1:{env.config.port}{path}",
        headers=headers,
        verify=ssl.create_default_context(cafile=str(env.ca_file)),
    )


def _ctx(env: DevEnv) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(env.ca_file))


def _wait(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


async def _call(env: DevEnv, tool: str, args: dict[str, Any], sub: str = "rollout-web") -> tuple[bool, str]:
    token = env.token(sub, [], groups=["team-web", "rollout-canary"], kind="agent")
    async with mcp_client(env.url, token, env.ca_file) as client:
        res = await client.call_tool(tool, args)
    return bool(res.is_error), str((res.meta or {})["pvegate/request_id"])


def _revision_of(env: DevEnv, request_id: str) -> str:
    row = next(r for r in audit_rows(env.config.audit_path, request_id) if r["kind"] == "decision")
    return str(json.loads(row["body"])["bundle_revision"])


def test_new_revision_activates_and_a_tampered_one_is_refused(
    gw: DevEnv, bundles: dict[str, Any], service: BundleService
) -> None:
    rev1, rev2 = bundles["rev1"], bundles["rev2"]
    health = _admin(gw, "/admin/health").json()
    assert health["policy"]["source"] == "bundle_service"
    assert health["policy"]["revision"] == f"pvegate@{rev1}" and health["status"] == "ready"
    denied, rid = asyncio.run(_call(gw, "list_nodes", {}))
    assert not denied and _revision_of(gw, rid) == f"pvegate@{rev1}"

    # a new revision on the service: active within a poll or two, no restart
    shutil.copy(bundles["dir"] / "rev2.tar.gz", service.root / "pvegate.tar.gz")
    _wait(lambda: _admin(gw, "/admin/health").json()["policy"]["revision"] == f"pvegate@{rev2}", "revision 2")
    denied, rid = asyncio.run(_call(gw, "list_nodes", {}))
    assert denied and _revision_of(gw, rid) == f"pvegate@{rev2}"

    # a tampered bundle: refused by OPA, visible in health and metrics, revision 2 keeps deciding
    shutil.copy(bundles["dir"] / "evil.tar.gz", service.root / "pvegate.tar.gz")
    health = _wait(
        lambda: (h := _admin(gw, "/admin/health").json())["policy"]["error"] and h, "the refused bundle in health"
    )
    assert health["status"] == "degraded"
    assert health["policy"]["revision"] == f"pvegate@{rev2}"
    assert "digest mismatch" in health["policy"]["error"] or "signature" in health["policy"]["error"]
    assert health["policy"]["bundles"][0]["last_error_at"]
    metrics = _admin(gw, "/admin/metrics").text
    assert 'pvegate_policy_bundle_error{name="pvegate"} 1' in metrics
    assert f'pvegate_policy_bundle_info{{name="pvegate",revision="{rev2}"}} 1' in metrics
    denied, rid = asyncio.run(_call(gw, "list_nodes", {}))
    assert denied and _revision_of(gw, rid) == f"pvegate@{rev2}"
    # readiness: still ready (revision 2 decides), the refusal shown beside it
    ready = httpx.get(f"https://127.0.0.1:{gw.config.port}/readyz", verify=_ctx(gw)).json()
    assert ready["checks"]["policy"]["bundle_error"] and ready["checks"]["policy"]["ok"]
    # /readyz takes no credential: the refusal in the gateway's words, OPA's text (it may name the bundle
    # server) only in /admin/health
    public = ready["checks"]["policy"]
    assert public["bundle_error"] == "pvegate: OPA refused the latest bundle (details in /admin/health)"
    assert public["bundles"][0]["error"] is True and "last_error" not in public["bundles"][0]
    opa_text = health["policy"]["bundles"][0]["error"]
    assert opa_text and opa_text not in json.dumps(ready, ensure_ascii=False).replace('\\"', '"')
    assert 'pvegate_opa_bundle_error{name="pvegate"} 1.0' in _admin(gw, "/metrics").text

    # the good file back: the error clears, the last one stays on record
    shutil.copy(bundles["dir"] / "rev2.tar.gz", service.root / "pvegate.tar.gz")
    health = _wait(lambda: (h := _admin(gw, "/admin/health").json())["policy"]["error"] is None and h, "recovery")
    assert health["status"] == "ready" and health["policy"]["revision"] == f"pvegate@{rev2}"
    assert health["policy"]["bundles"][0]["last_error"]
    assert 'pvegate_policy_bundle_rollback{name="pvegate"} 0' in _admin(gw, "/admin/metrics").text

    # an older bundle, validly signed: OPA activates it (a signature authenticates, it does not
    # order), and the gateway reports the rollback: degraded, still ready, and in the metrics
    shutil.copy(bundles["dir"] / "rev1.tar.gz", service.root / "pvegate.tar.gz")
    health = _wait(
        lambda: (h := _admin(gw, "/admin/health").json())["policy"]["revision"] == f"pvegate@{rev1}" and h,
        "the older revision",
    )
    assert health["status"] == "degraded" and "rollback" in health["policy"]["error"]
    assert rev1 in health["policy"]["error"] and rev2 in health["policy"]["error"]
    assert 'pvegate_policy_bundle_rollback{name="pvegate"} 1' in _admin(gw, "/admin/metrics").text
    denied, rid = asyncio.run(_call(gw, "list_nodes", {}))
    assert not denied and _revision_of(gw, rid) == f"pvegate@{rev1}"


def test_every_decision_reaches_the_remote_sink_with_arguments_masked(gw: DevEnv, service: BundleService) -> None:
    marker = f"sink_{secrets.token_hex(6)}"
    rids = []
    for i in range(5):
        _, rid = asyncio.run(_call(gw, "snapshot_create", {"vmid": 100, "snapname": f"{marker}{i}"}, sub="sink-agent"))
        rids.append(rid)
    _, rid = asyncio.run(_call(gw, "list_guests", {}, sub="sink-agent"))
    rids.append(rid)
    ids = set()
    for rid in rids:
        row = next(r for r in audit_rows(gw.config.audit_path, rid) if r["kind"] == "decision")
        ids.add(json.loads(row["body"])["decision_id"])
    assert len(ids) == 6 and None not in ids
    got = _wait(lambda: ids <= {e.get("decision_id") for e in service.logs} and ids, "decisions at the sink")
    events = [e for e in service.logs if e.get("decision_id") in got]
    for e in events:
        assert e["path"] == "pvegate/decision" and e["input"]["principal"]["sub"] == "sink-agent"
        assert "/input/arguments" in e["erased"] and "arguments" not in e["input"]
    assert not any(marker.encode() in raw for raw in service.raw)


def refreshed(opa: OPASidecar, status: PolicyStatus) -> PolicyStatus:
    """`status` after one refresh from `opa`'s status API."""

    async def go() -> None:
        async with httpx_async_client(opa.url, timeout=2) as c:
            await status.refresh(c)

    asyncio.run(go())
    return status


def test_watched_bundle_file_activates_without_restart(bundles: dict[str, Any], tmp_path: Path) -> None:
    live = tmp_path / "pvegate.tar.gz"
    shutil.copy(bundles["dir"] / "rev1.tar.gz", live)
    opa = OPASidecar(bundle=live, verification_key=bundles["pub"], watch_bundle=True, bundle_poll_seconds=1)
    opa.start()
    status = PolicyStatus(opa.url, opa.source)

    try:
        assert refreshed(opa, status).revision == f"pvegate@{bundles['rev1']}" and status.source == "bundle_file_watch"
        shutil.copy(bundles["dir"] / "rev2.tar.gz", live)
        _wait(lambda: refreshed(opa, status).revision == f"pvegate@{bundles['rev2']}", "the new file's revision")
        shutil.copy(bundles["dir"] / "evil.tar.gz", live)
        _wait(lambda: refreshed(opa, status).bundle_error, "the refused file")
        assert status.revision == f"pvegate@{bundles['rev2']}" and status.revision_known is not False
        with opa.client() as c:
            r = c.post("/v1/data/pvegate/decision?provenance=true", json={"input": {}})
        assert r.json()["provenance"]["bundles"]["pvegate"]["revision"] == bundles["rev2"]
    finally:
        opa.stop()


def test_watched_bundle_file_is_served_to_its_opa_alone(
    bundles: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The loopback file server refuses any other local client (a process, another container in the
    namespace, a DNS-rebinding browser): no bearer token, 401; another Host, 403. OPA, given the
    token in its private config file, still loads and follows the file."""
    caplog.set_level(logging.DEBUG)
    live = tmp_path / "pvegate.tar.gz"
    shutil.copy(bundles["dir"] / "rev1.tar.gz", live)
    opa = OPASidecar(
        bundle=live,
        verification_key=bundles["pub"],
        watch_bundle=True,
        bundle_poll_seconds=1,
        log_file=tmp_path / "opa.log",
    )
    opa.start()
    try:
        server = opa._file_server
        assert server is not None
        url = f"{server.url}/{server.resource}"
        with httpx.Client(trust_env=False, timeout=5) as c:
            # the review's repro: any local client, any Host
            anon = c.get(url, headers={"Host": "evil.example"})
            assert anon.status_code == 403 and b"pvegate" not in anon.content
            anon = c.get(url)  # the right Host, no credential
            assert anon.status_code == 401 and not anon.content
            assert anon.headers["WWW-Authenticate"].startswith("Bearer")
            assert c.get(url, headers={"Authorization": "Bearer " + secrets.token_urlsafe(32)}).status_code == 401
            assert c.get(url, headers={"Authorization": "Basic b3BhOm9wYQ=="}).status_code == 401

            # the token exists only in OPA's private config file
            cfg_file = Path(opa._config_dir or "") / "opa-config.json"
            assert cfg_file.stat().st_mode & 0o777 == 0o600
            service = json.loads(cfg_file.read_text())["services"]["pvegate-bundle-file"]
            token = service["credentials"]["bearer"]["token"]
            assert len(token) >= 32 and service["url"] == server.url
            auth = {"Authorization": f"Bearer {token}"}
            # with the token but another Host (a rebinding browser that somehow had it): still refused
            assert c.get(url, headers={**auth, "Host": "evil.example"}).status_code == 403
            assert c.get(url, headers={**auth, "Host": "localhost"}).status_code == 403
            # OPA's own request: the file, with its ETag; an unchanged file is a 304
            ok = c.get(url, headers=auth)
            assert ok.status_code == 200 and ok.content == live.read_bytes()
            again = c.get(url, headers={**auth, "If-None-Match": ok.headers["ETag"]})
            assert again.status_code == 304 and again.headers["ETag"] == ok.headers["ETag"]

        # OPA authenticates: the first revision is active (start waits for it), a new file follows
        status = PolicyStatus(opa.url, opa.source)

        assert refreshed(opa, status).revision == f"pvegate@{bundles['rev1']}" and not status.bundle_error
        shutil.copy(bundles["dir"] / "rev2.tar.gz", live)
        _wait(lambda: refreshed(opa, status).revision == f"pvegate@{bundles['rev2']}", "the new file's revision")
        assert not status.bundle_error

        # the token is in no log and no repr
        assert token not in caplog.text and token not in repr(opa) and token not in repr(server)
        assert token not in (tmp_path / "opa.log").read_text()
        # the next OPA start gets a new token: the old one stops working
        opa._write_config()
        with httpx.Client(trust_env=False, timeout=5) as c:
            assert c.get(url, headers=auth).status_code == 401
    finally:
        opa.stop()
