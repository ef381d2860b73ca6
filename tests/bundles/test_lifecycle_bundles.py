"""Bundles, from a review of the policy lifecycle, each against the real OPA.

- a bundle loaded once (no bundle plugin) was named `once@rev` by the policy status while every
  decision's provenance (the audit's bundle_revision, readiness) named it `/path/once.tar.gz@rev`:
  one naming now, the provenance's;
- `pvegate bundle verify` with a key file that is no PEM public key printed OPA's parse error as a
  `REFUSED:` of the bundle; with the private signing key it said OK. Both are key errors now
  (`error:`, exit 1 as for a missing key), said before OPA is asked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy.bundle_status import PolicyStatus
from gateway.policy.bundles import build
from gateway.policy.decisions import DecisionClient
from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar
from tests.bundles.test_bundle_revisions import _decide, _input, _refreshed, keys
from tests.bundles.test_bundles import _verify, verifiable

__all__ = ["keys", "verifiable"]  # fixtures, used by name


def test_a_bundle_loaded_once_is_named_as_its_decisions_name_it(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    priv, pub = keys
    bundle = tmp_path / "good1.tar.gz"
    rev = build(REPO_ROOT / "policies", bundle, priv, revision="good1", checks=False, optimize=False)
    opa = OPASidecar(bundle=bundle, verification_key=pub)
    opa.start(timeout=20)
    try:
        decision = _decide(opa.url, _input())
        assert not decision.failed_closed and decision.revision is not None
        audited = decision.as_dict()["bundle_revision"]  # what the audit records, and readiness shows
        assert audited == decision.revision and audited.endswith(f"@{rev}")
        status = _refreshed(PolicyStatus(opa.url, opa.source))
        assert status.source == "bundle"
        assert status.revision == audited  # was `good1@good1` beside `<path>/good1.tar.gz@good1`
        (name,) = status.bundles
        assert f"{name}@{rev}" == audited
        assert status.as_dict()["bundles"][0]["name"] == name
        assert f'pvegate_policy_bundle_info{{name="{name}",revision="{rev}"}} 1' in status.prometheus()
    finally:
        opa.stop()


def test_the_provenance_and_the_status_share_the_name_format() -> None:
    """Both join `name@revision` per bundle, sorted by name (no OPA: the two readers side by side)."""
    status = PolicyStatus("http://127.0.0.1:1", "bundle")
    status._from_manifests({"/srv/b/one.tar.gz": {"manifest": {"revision": "r1"}}})
    envelope = {"provenance": {"bundles": {"/srv/b/one.tar.gz": {"revision": "r1"}}}}
    assert status.revision == DecisionClient._provenance(envelope) == "/srv/b/one.tar.gz@r1"


@pytest.mark.parametrize("key", ["garbage", "private", "empty"])
def test_verify_refuses_a_key_that_is_no_public_key_as_a_key_error(
    verifiable: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    bundle, pub = verifiable
    if key == "private":
        path = pub.parent / "bundle-signing.pem"  # keygen's pair: the signing key beside the public one
        assert path.is_file() and b"PRIVATE KEY" in path.read_bytes()
    else:
        path = tmp_path / f"{key}.pem"
        path.write_text("garbage\n" if key == "garbage" else "")
    assert _verify(bundle, path) == 1
    out, err = capsys.readouterr()
    assert not out and err.startswith("error: ") and "REFUSED" not in err and err.count("\n") == 1
    if key == "private":
        assert "is a private (signing) key" in err and "must not sit on the gateway host" in err
    else:
        assert err == f"error: the verification key {path} is not a PEM public key\n"  # not OPA's "PEM block"
    # the key's public half verifies it
    assert _verify(bundle, pub) == 0
    assert capsys.readouterr().out.startswith(f"OK: {bundle} is signed")
