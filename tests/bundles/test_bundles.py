"""Signed bundles round-trip through the real OPA; tampered or foreign ones are refused."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import httpx
import pytest

from gateway.policy.bundles import build, keygen
from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar, OPAUnavailable


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    d = tmp_path_factory.mktemp("bundle")
    priv, pub = keygen(d / "keys")
    rev = build(REPO_ROOT / "policies", d / "pvegate.tar.gz", priv)
    return d / "pvegate.tar.gz", pub, rev


def _members(bundle: Path) -> dict[str, bytes]:
    with tarfile.open(bundle) as tar:
        return {m.name.lstrip("/"): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_bundle_excludes_tests_and_carries_manifest(signed: tuple[Path, Path, str]) -> None:
    bundle, _, rev = signed
    files = _members(bundle)
    assert not [n for n in files if n.endswith("_test.rego") or "golden" in n]
    assert all(not n.startswith("tmp") for n in files)  # paths are bundle-relative
    manifest = json.loads(files[".manifest"])
    assert manifest["revision"] == rev
    assert {"pvegate", "data", "system/log"} <= set(manifest["roots"])
    assert ".signatures.json" in files


def test_signed_bundle_round_trips_with_provenance(signed: tuple[Path, Path, str]) -> None:
    bundle, pub, rev = signed
    opa = OPASidecar(bundle=bundle, verification_key=pub)
    opa.start()
    try:
        r = httpx.post(
            f"{opa.url}/v1/data/pvegate/decision?provenance=true",
            json={"input": {"contract_version": 1, "kind": "call"}},
        )
        body = r.json()
        assert r.status_code == 200 and body["result"]["allow"] is False
        revisions = [b["revision"] for b in body["provenance"]["bundles"].values()]
        assert revisions == [rev]
    finally:
        opa.stop()


def _tamper(src: Path, dst: Path, member: str, new: bytes) -> None:
    with tarfile.open(src) as tin, tarfile.open(dst, "w:gz") as tout:
        for m in tin.getmembers():
            data = tin.extractfile(m).read() if m.isfile() else None  # type: ignore[union-attr]
            if m.name.lstrip("/") == member:
                data = new
                m.size = len(new)
            tout.addfile(m, io.BytesIO(data) if data is not None else None)


def test_tampered_bundle_is_refused(signed: tuple[Path, Path, str], tmp_path: Path) -> None:
    bundle, pub, _ = signed
    member = "pvegate/decision.rego"
    original = _members(bundle)[member]
    evil = tmp_path / "evil.tar.gz"
    _tamper(bundle, evil, member, original + b"\n# allow everything, says the attacker\n")
    with pytest.raises(OPAUnavailable):
        OPASidecar(bundle=evil, verification_key=pub).start(timeout=10)


def test_bundle_signed_by_another_key_is_refused(signed: tuple[Path, Path, str], tmp_path: Path) -> None:
    bundle, _, _ = signed
    _, other_pub = keygen(tmp_path / "other")
    with pytest.raises(OPAUnavailable):
        OPASidecar(bundle=bundle, verification_key=other_pub).start(timeout=10)


def test_repacked_but_unchanged_bundle_still_loads(signed: tuple[Path, Path, str], tmp_path: Path) -> None:
    """Control for the tamper test: re-packing alone must not be what OPA refuses."""
    bundle, pub, _ = signed
    member = "pvegate/decision.rego"
    same = tmp_path / "same.tar.gz"
    _tamper(bundle, same, member, _members(bundle)[member])
    opa = OPASidecar(bundle=same, verification_key=pub)
    opa.start(timeout=10)
    opa.stop()
