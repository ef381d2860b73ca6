"""The revision the gateway names (health, readiness, the audit's provenance) is only what OPA reports now.

PolicyStatus kept every bundle name it had ever seen: after an external OPA's configuration renamed its
bundle, the old name's revision stayed in `revision` beside the new one; after OPA restarted with no bundle
at all (nothing in /v1/status, no manifest loaded), the old revision stayed and `revision_known` was true
while OPA decided with no policy. Bundles OPA stops reporting are now forgotten. Real opa, a real signed
bundle served from 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx

from gateway.policy.bundle_status import PolicyStatus
from gateway.policy.bundles import keygen
from gateway.policy.opa_sidecar import find_opa, free_port
from tests.bundles.test_s48_status_after_restart import _refreshed, _signed_bundle, _start, _wait, service

__all__ = ["service"]  # the fixture, used by name


def _config(path: Path, url: str, pub: Path, name: str) -> Path:
    bundle = {
        "service": "svc",
        "resource": "b.tar.gz",
        "polling": {"min_delay_seconds": 1, "max_delay_seconds": 1},
        "signing": {"keyid": "k"},
    }
    doc = {
        "services": {"svc": {"url": url}},
        "bundles": {name: bundle},
        "keys": {"k": {"algorithm": "RS256", "key": pub.read_text()}},
    }
    path.write_text(json.dumps(doc))
    return path


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(timeout=10)


def test_a_renamed_or_removed_bundle_is_no_longer_named(tmp_path: Path, service: tuple[str, Path]) -> None:
    url, served = service
    priv, pub = keygen(tmp_path / "keys")
    (served / "b.tar.gz").write_bytes(_signed_bundle(tmp_path, priv, "r1").read_bytes())
    port = free_port()
    opa_url = f"http://127.0.0.1:{port}"
    status = PolicyStatus(opa_url, "external")

    proc = _start(_config(tmp_path / "a.json", url, pub, "pvegate"), port)
    try:
        _wait(lambda: _refreshed(status).revision == "pvegate@r1", "the first revision")
    finally:
        _stop(proc)

    # the platform renames the bundle in OPA's configuration and restarts it
    proc = _start(_config(tmp_path / "b.json", url, pub, "policy"), port)
    try:
        _wait(lambda: _refreshed(status).revision is not None and "policy@r1" in status.revision, "the renamed bundle")
        assert status.revision == "policy@r1", status.revision
        assert [b["name"] for b in status.as_dict()["bundles"]] == ["policy"]
        assert not any('name="pvegate"' in line for line in status.prometheus())
    finally:
        _stop(proc)

    # then starts OPA with no bundle at all: no policy decides
    cmd = [str(find_opa()), "run", "--server", "--addr", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: _ok(opa_url), "the bare OPA")
        _refreshed(status)
        assert status.reachable is True
        assert status.revision is None and status.revision_known is False, status.as_dict()
        assert "pvegate_policy_revision_known 0" in status.prometheus()
    finally:
        _stop(proc)


def _ok(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_bundle_that_comes_back_older_is_still_a_rollback() -> None:
    """Forgetting a name must not forget the newest build seen under it: an OPA restarted with nothing, then
    served an older (validly signed) bundle under the same name, is a rollback all the same."""

    def loaded(revision: str, built_at: str) -> dict[str, object]:
        return {"pvegate": {"manifest": {"revision": revision, "metadata": {"built_at": built_at}}}}

    status = PolicyStatus("http://127.0.0.1:9", "external")
    status._from_manifests(loaded("r2", "2026-12-01T00:00:00.000000Z"))
    status._from_manifests({})
    assert status.revision is None and status.revision_known is False
    status._from_manifests(loaded("r1", "2026-11-01T00:00:00.000000Z"))
    assert status.revision == "pvegate@r1"
    assert status.bundle_error is not None and "rollback" in status.bundle_error, status.as_dict()
