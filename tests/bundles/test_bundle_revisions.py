"""What the gateway says about the bundle OPA decides with, from a real OPA.

- a bundle without a revision has none (not `name@`): health and readiness say it is unknown;
- a bundle loaded once (no watch) has its revision reported (OPA's status then has no `bundles`);
- a new bundle reusing a revision has its data checked again once its activation is seen;
- an older, validly signed bundle replacing a newer one is reported as a rollback.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.policy.bundle_status import PolicyStatus
from gateway.policy.bundles import build, keygen, manifest_of
from gateway.policy.decisions import Decision, DecisionClient
from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar, find_opa


def _input(name: str = "agent_stops_staging_guest") -> dict[str, Any]:
    doc = json.loads((REPO_ROOT / "policies" / "golden" / f"{name}.json").read_text())
    case: dict[str, Any] = doc[name]["input"]
    return case


def _decide(url: str, input_doc: dict[str, Any], client: DecisionClient | None = None) -> Decision:
    async def go() -> Decision:
        c = client or DecisionClient(url, 5000)
        try:
            return await c.decide(input_doc)
        finally:
            if client is None:
                await c.close()

    return asyncio.run(go())


def _refreshed(status: PolicyStatus) -> PolicyStatus:
    asyncio.run(status.refresh_once())
    return status


def _wait(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := check():
            return got
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return keygen(tmp_path_factory.mktemp("keys") / "keys")


# --- a bundle without a revision ----------------------------------------------------------------


def test_provenance_names_no_bundle_without_a_revision() -> None:
    prov = DecisionClient._provenance
    assert prov({"provenance": {"bundles": {"pvegate": {"revision": ""}}}}) is None
    assert prov({"provenance": {"bundles": {"pvegate": {}}}}) is None
    assert prov({"provenance": {"bundles": {"a": {"revision": "r1"}, "b": {"revision": ""}}}}) == "a@r1"
    assert prov({"provenance": {"bundles": {"pvegate": {"revision": "r1"}}}}) == "pvegate@r1"


@pytest.mark.parametrize("watch", [False, True])
def test_a_bundle_without_a_revision_has_an_unknown_revision(
    tmp_path: Path, keys: tuple[Path, Path], watch: bool
) -> None:
    """Built by plain `opa build` (no revision in its manifest): decisions name no revision and the
    status says it is unknown (readiness: `policy` red), where it used to be `pvegate@`."""
    priv, pub = keys
    stage = tmp_path / "stage"
    shutil.copytree(REPO_ROOT / "policies", stage, ignore=shutil.ignore_patterns("*_test.rego", "golden", ".*"))
    bundle = tmp_path / "norev.tar.gz"
    cmd = [str(find_opa()), "build", "-b", ".", "-o", str(bundle), "--signing-key", str(priv), "--signing-alg", "RS256"]
    subprocess.run(cmd, cwd=stage, check=True, capture_output=True)
    assert not manifest_of(bundle).get("revision")
    opa = OPASidecar(bundle=bundle, verification_key=pub, watch_bundle=watch, bundle_poll_seconds=1)
    opa.start(timeout=20)
    try:
        d = _decide(opa.url, _input())
        assert not d.failed_closed and d.revision is None and d.as_dict()["bundle_revision"] is None
        status = _refreshed(PolicyStatus(opa.url, opa.source))
        assert status.reachable and status.bundles
        assert status.revision is None and status.revision_known is False
        assert "pvegate_policy_revision_known 0" in status.prometheus()
    finally:
        opa.stop()


# --- a bundle loaded once: OPA's status has no `bundles` -----------------------------------------


def test_a_bundle_loaded_once_reports_its_revision(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    priv, pub = keys
    bundle = tmp_path / "once.tar.gz"
    rev = build(REPO_ROOT / "policies", bundle, priv, revision="once-1", checks=False, optimize=False)
    opa = OPASidecar(bundle=bundle, verification_key=pub)
    opa.start(timeout=20)
    try:
        status = _refreshed(PolicyStatus(opa.url, opa.source))
        assert status.source == "bundle" and status.reachable
        assert status.revision is not None and status.revision.endswith(f"@{rev}")
        assert status.revision_known is True
        assert "pvegate_policy_revision_known 1" in status.prometheus()
        (b,) = status.bundles.values()
        assert b.built_at == manifest_of(bundle)["metadata"]["built_at"]  # type: ignore[index]
    finally:
        opa.stop()


# --- a watched bundle file: a revision reused, an older bundle ----------------------------------


def _swap(src: Path, live: Path) -> None:
    tmp = live.with_suffix(".tmp")
    shutil.copy(src, tmp)
    tmp.rename(live)


def test_a_revision_reused_by_a_bundle_with_invalid_data_is_checked_again(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    """The data check is kept per revision; a second bundle under the same revision with broken data
    is refused once the status poll has seen its activation, not served from the old check."""
    priv, pub = keys
    good, bad = tmp_path / "good", tmp_path / "bad"
    for tree in (good, bad):
        shutil.copytree(REPO_ROOT / "policies", tree)
    data = bad / "data" / "data.yaml"
    data.write_text(data.read_text() + "\nbogus_section: 1\n")
    build(good, tmp_path / "good.tar.gz", priv, "prod", checks=False, optimize=False)
    build(bad, tmp_path / "bad.tar.gz", priv, "prod", checks=False, optimize=False)
    live = tmp_path / "live.tar.gz"
    shutil.copy(tmp_path / "good.tar.gz", live)
    opa = OPASidecar(bundle=live, verification_key=pub, watch_bundle=True, bundle_poll_seconds=1)
    opa.start(timeout=20)
    status = PolicyStatus(opa.url, opa.source)
    client = DecisionClient(opa.url, 5000)
    loop = asyncio.new_event_loop()
    try:
        _refreshed(status)
        first = status.bundles["pvegate"].activated_at
        d = loop.run_until_complete(client.decide(_input()))
        assert d.allow and d.revision == "pvegate@prod"
        _swap(tmp_path / "bad.tar.gz", live)
        _wait(lambda: _refreshed(status).bundles["pvegate"].activated_at != first, "the second bundle's activation")
        assert status.revision == "pvegate@prod"  # the same name: only the activation tells them apart
        d = loop.run_until_complete(client.decide(_input()))
        assert not d.allow and d.revision == "pvegate@prod"
        assert client.data_check is not None and not client.data_check.valid
        assert any("bogus_section" in p for p in client.data_check.problems)
    finally:
        loop.run_until_complete(client.close())
        loop.close()
        opa.stop()


def test_an_older_signed_bundle_is_reported_as_a_rollback(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    """Signatures authenticate, they do not order: OPA activates the older bundle (it is validly
    signed); the gateway reports it as the bundle's error and in a metric, until a bundle at least
    as new as the newest seen is active again."""
    priv, pub = keys
    tree = tmp_path / "tree"
    shutil.copytree(REPO_ROOT / "policies", tree)
    build(tree, tmp_path / "v1.tar.gz", priv, "v1", checks=False, optimize=False)
    build(tree, tmp_path / "v2.tar.gz", priv, "v2", checks=False, optimize=False)
    built = [manifest_of(tmp_path / f"{v}.tar.gz")["metadata"]["built_at"] for v in ("v1", "v2")]  # type: ignore[index]
    assert built[0] < built[1]
    live = tmp_path / "live.tar.gz"
    shutil.copy(tmp_path / "v2.tar.gz", live)
    opa = OPASidecar(bundle=live, verification_key=pub, watch_bundle=True, bundle_poll_seconds=1)
    opa.start(timeout=20)
    status = PolicyStatus(opa.url, opa.source)
    try:
        assert _refreshed(status).revision == "pvegate@v2" and status.bundle_error is None
        assert 'pvegate_policy_bundle_rollback{name="pvegate"} 0' in status.prometheus()

        _swap(tmp_path / "v1.tar.gz", live)  # the older bundle: OPA activates it
        _wait(lambda: _refreshed(status).revision == "pvegate@v1", "the older bundle's activation")
        error = status.bundle_error
        assert error is not None and "rollback" in error and "v1" in error and "v2" in error
        assert 'pvegate_policy_bundle_rollback{name="pvegate"} 1' in status.prometheus()
        doc = status.as_dict()
        assert doc["error"] == error and doc["bundles"][0]["rollback"] and doc["bundles"][0]["built_at"] == built[0]
        assert doc["bundles"][0]["last_error"] == doc["bundles"][0]["rollback"]

        _swap(tmp_path / "v2.tar.gz", live)  # the newest again: the rollback is over
        _wait(lambda: _refreshed(status).revision == "pvegate@v2", "the newer bundle again")
        assert status.bundle_error is None
        assert 'pvegate_policy_bundle_rollback{name="pvegate"} 0' in status.prometheus()
    finally:
        opa.stop()
