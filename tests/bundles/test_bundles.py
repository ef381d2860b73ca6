"""Signed bundles round-trip through the real OPA; tampered or foreign ones are refused."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.policy.bundles import BundleError, build, bundle_has_authz, keygen
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
    assert {"pvegate", "data", "system/log", "system/authz"} <= set(manifest["roots"])
    assert ".signatures.json" in files
    # partially evaluated with its data (the revision given again survives OPA's own manifest),
    # the authored modules kept beside for the rules no entrypoint covers
    assert manifest["metadata"]["optimized"] is True and "partial" in manifest["roots"]
    assert "optimized/pvegate.rego" in files and "pvegate/console/console.rego" in files
    # the API guard travels inside the signed bundle (partially evaluated too: the token is
    # still read from OPA's environment when asked; tests/e2e/test_external_opa.py runs it)
    assert bundle_has_authz(bundle)
    assert b"PVEGATE_OPA_TOKEN" in files["optimized/system/authz.rego"]


def test_signed_bundle_round_trips_with_provenance(signed: tuple[Path, Path, str]) -> None:
    bundle, pub, rev = signed
    opa = OPASidecar(bundle=bundle, verification_key=pub)
    opa.start()
    try:
        with opa.client() as c:
            r = c.post(
                "/v1/data/pvegate/decision?provenance=true", json={"input": {"contract_version": 1, "kind": "call"}}
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


# the authored module, the partially evaluated one that decides, and the data
@pytest.mark.parametrize("member", ["pvegate/decision.rego", "optimized/pvegate.rego", "data.json"])
def test_tampered_bundle_is_refused(signed: tuple[Path, Path, str], tmp_path: Path, member: str) -> None:
    bundle, pub, _ = signed
    original = _members(bundle)[member]
    if member.endswith(".json"):  # still valid JSON: the signature, not the parser, must refuse it
        data = json.loads(original)
        data["data"]["quotas"] = []
        changed = json.dumps(data).encode()
    else:
        changed = original + b"\n# allow everything, says the attacker\n"
    evil = tmp_path / "evil.tar.gz"
    _tamper(bundle, evil, member, changed)
    with pytest.raises(OPAUnavailable, match="digest mismatch"):
        OPASidecar(bundle=evil, verification_key=pub, log_file=tmp_path / "opa.log").start(timeout=10)


def test_bundle_signed_by_another_key_is_refused(signed: tuple[Path, Path, str], tmp_path: Path) -> None:
    bundle, _, _ = signed
    _, other_pub = keygen(tmp_path / "other")
    with pytest.raises(OPAUnavailable):
        OPASidecar(bundle=bundle, verification_key=other_pub).start(timeout=10)


def test_repacked_but_unchanged_bundle_still_loads(signed: tuple[Path, Path, str], tmp_path: Path) -> None:
    """Control for the tamper test: re-packing alone must not be what OPA refuses."""
    bundle, pub, _ = signed
    member = "optimized/pvegate.rego"
    same = tmp_path / "same.tar.gz"
    _tamper(bundle, same, member, _members(bundle)[member])
    opa = OPASidecar(bundle=same, verification_key=pub)
    opa.start(timeout=10)
    opa.stop()


# --- the build is gated on the policy checks and on a signature -----------------------------------


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "policies"
    shutil.copytree(REPO_ROOT / "policies", tree)
    return tree


def test_build_refuses_a_tree_whose_tests_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = _tree(tmp_path)
    (tree / "pvegate" / "zz_broken_test.rego").write_text(
        "package pvegate.zz_broken_test\n\ntest_wrong if {\n\t1 == 2\n}\n"
    )
    priv, _ = keygen(tmp_path / "keys")
    out = tmp_path / "b.tar.gz"
    rc = main(["bundle", "build", "--policies", str(tree), "--signing-key", str(priv), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and not out.exists()
    assert "opa test" in err and "test_wrong" in err and "nothing was built" in err
    with pytest.raises(BundleError, match="policy checks FAILED"):
        build(tree, out, priv)


def test_build_refuses_an_unformatted_tree(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    rego = tree / "pvegate" / "decision.rego"
    rego.write_text(rego.read_text().replace("\t", "    ", 1))
    with pytest.raises(BundleError, match="opa fmt"):
        build(tree, tmp_path / "b.tar.gz", None, unsigned=True)


def test_build_without_key_needs_unsigned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b.tar.gz"
    assert main(["bundle", "build", "-o", str(out)]) == 1
    assert "--unsigned" in capsys.readouterr().err and not out.exists()
    with pytest.raises(BundleError, match="signing-key"):
        build(REPO_ROOT / "policies", out, None)


def test_manifest_names_the_git_commit(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "policies"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    out = tmp_path / "b.tar.gz"
    rev = build(tree, out, None, unsigned=True)
    manifest = json.loads(_members(out)[".manifest"])
    assert manifest["revision"] == rev and rev.startswith(commit[:12])
    assert manifest["metadata"]["git_commit"] == commit
    assert manifest["metadata"]["git_dirty"] is False and manifest["metadata"]["checked"] is True
    assert ".signatures.json" not in _members(out)  # --unsigned means unsigned


def test_plain_asks_for_the_policy_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plain.tar.gz"
    assert main(["bundle", "build", "--unsigned", "--plain", "-o", str(out)]) == 0
    assert "; plain)" in capsys.readouterr().out
    files = _members(out)
    manifest = json.loads(files[".manifest"])
    assert manifest["metadata"]["optimized"] is False and "partial" not in manifest["roots"]
    assert not [n for n in files if n.startswith("optimized/")]
    assert (
        files["system/authz/authz.rego"]
        == (REPO_ROOT / "gateway/policy/opa_authz/system/authz/authz.rego").read_bytes()
    )


def test_a_tree_the_optimiser_cannot_build_is_built_plain(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A policy tree of one's own without the entrypoints the optimiser is given still builds, plain."""
    tree = tmp_path / "other"
    tree.mkdir()
    (tree / "p.rego").write_text("package other\n\nx := 1\n")
    out = tmp_path / "b.tar.gz"
    with caplog.at_level("WARNING", logger="pvegate.bundle"):
        rev = build(tree, out, None, unsigned=True, checks=False)
    assert "opa build -O=1 failed" in caplog.text and "undefined entrypoint" in caplog.text
    manifest = json.loads(_members(out)[".manifest"])
    assert manifest["revision"] == rev and manifest["metadata"]["optimized"] is False


def test_a_bundle_without_the_api_guard_serves_the_managed_sidecar(tmp_path: Path) -> None:
    """The managed OPA's guard is its private socket, not the bundle's system.authz (which an external
    OPA needs): a bundle built before the guard was added to bundles still loads and answers."""
    policies = tmp_path / "policies"
    shutil.copytree(REPO_ROOT / "policies", policies)
    built = tmp_path / "with-guard.tar.gz"
    build(policies, built, None, checks=False, unsigned=True)  # a signature would cover the guard's file
    old = tmp_path / "old.tar.gz"  # as bundles were built before the guard was added to them
    with tarfile.open(built) as tin, tarfile.open(old, "w:gz") as tout:
        for m in tin.getmembers():
            if "authz" not in m.name:
                tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
    assert bundle_has_authz(built) and not bundle_has_authz(old)
    opa = OPASidecar(bundle=old)
    opa.start(timeout=10)
    try:
        with opa.client(timeout=5) as c:
            r = c.post("/v1/data/pvegate/decision", json={"input": {"contract_version": 1, "kind": "call"}})
        assert r.status_code == 200 and r.json()["result"]["allow"] is False
    finally:
        opa.stop()


# --- keygen never overwrites a key pair; the private key is never readable by others ---------------


def test_keygen_refuses_to_overwrite_a_key_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "keys"
    priv, pub = keys / "bundle-signing.pem", keys / "bundle-verify.pem"
    assert main(["bundle", "keygen", "--out", str(keys)]) == 0
    assert priv.stat().st_mode & 0o777 == 0o600
    first = priv.read_bytes(), pub.read_bytes()
    capsys.readouterr()
    assert main(["bundle", "keygen", "--out", str(keys)]) == 1
    out, err = capsys.readouterr()
    assert "already exists" in err and "--force" in err and str(priv) in err and not out
    assert (priv.read_bytes(), pub.read_bytes()) == first
    pub.unlink()  # either file alone is a key pair in use: still refused, nothing written
    assert main(["bundle", "keygen", "--out", str(keys)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert priv.read_bytes() == first[0] and not pub.exists()
    with pytest.raises(BundleError, match="already exists"):
        keygen(keys)


def test_keygen_force_replaces_the_pair_with_a_private_key_of_mode_0600(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tmp_path / "keys"
    old_priv, old_pub = keygen(keys)
    before = old_priv.read_bytes(), old_pub.read_bytes()
    old_priv.chmod(0o644)  # a key left readable: --force does not inherit its mode
    assert main(["bundle", "keygen", "--out", str(keys), "--force"]) == 0
    assert "signing key (keep secret)" in capsys.readouterr().out
    assert old_priv.read_bytes() != before[0] and old_pub.read_bytes() != before[1]
    assert old_priv.stat().st_mode & 0o777 == 0o600


def test_keygen_does_not_follow_a_planted_symlink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The key files are created, never opened: a link at their path is refused, its target never written."""
    keys = tmp_path / "keys"
    keys.mkdir()
    target = tmp_path / "elsewhere.pem"
    (keys / "bundle-signing.pem").symlink_to(target)  # dangling: exists() says no, O_EXCL still refuses
    assert main(["bundle", "keygen", "--out", str(keys)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert not target.exists() and not (keys / "bundle-verify.pem").exists()


def test_keygen_into_a_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("")
    assert main(["bundle", "keygen", "--out", str(tmp_path / "f")]) == 1
    assert capsys.readouterr().err.startswith("error: ")


# --- verify: a clear error on stderr for anything that is not a verified bundle ---------------------


@pytest.fixture(scope="module")
def verifiable(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A signed bundle and its key, built without the checks (`signed` covers the checked build)."""
    d = tmp_path_factory.mktemp("verify")
    priv, pub = keygen(d / "keys")
    build(REPO_ROOT / "policies", d / "pvegate.tar.gz", priv, checks=False)
    return d / "pvegate.tar.gz", pub


def _verify(bundle: Path, key: Path) -> int:
    return main(["bundle", "verify", str(bundle), "--verification-key", str(key)])


def test_verify_accepts_the_signed_bundle_and_writes_nothing_beside_it(
    verifiable: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "pvegate.tar.gz"
    shutil.copy2(verifiable[0], bundle)
    (tmp_path / "pvegate.tar.verified.tmp").mkdir()  # where the intermediate output used to go
    before = sorted(tmp_path.iterdir())
    assert _verify(bundle, verifiable[1]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"OK: {bundle} is signed") and not err
    assert sorted(tmp_path.iterdir()) == before


def test_verify_refusal_goes_to_stderr(
    verifiable: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, other_pub = keygen(tmp_path / "other")
    assert _verify(verifiable[0], other_pub) == 1
    out, err = capsys.readouterr()
    assert not out and err.startswith("REFUSED: ")


def test_verify_names_a_missing_key_or_bundle(
    verifiable: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, pub = verifiable
    missing = tmp_path / "nope.pem"
    assert _verify(bundle, missing) == 1
    out, err = capsys.readouterr()
    assert not out and err == f"error: verification key {missing} not found\n"  # not OPA's "PEM block"
    assert _verify(bundle, tmp_path) == 1  # a directory is no key either
    assert "verification key" in capsys.readouterr().err
    assert _verify(tmp_path / "nope.tar.gz", pub) == 1
    out, err = capsys.readouterr()
    assert not out and err == f"error: bundle {tmp_path / 'nope.tar.gz'} not found\n"


def _no_opa(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No opa anywhere find_opa looks (the checkout's own .tools/bin included)."""
    monkeypatch.delenv("PVEGATE_OPA", raising=False)
    monkeypatch.setattr("gateway.policy.opa_sidecar.REPO_ROOT", tmp_path)
    (tmp_path / "bin").mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))


def test_without_opa_verify_and_build_say_so(
    verifiable: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _no_opa(monkeypatch, tmp_path)
    assert _verify(verifiable[0], verifiable[1]) == 1
    out, err = capsys.readouterr()
    assert not out and err.startswith("error: no opa binary found") and "Traceback" not in err
    out_file = tmp_path / "b.tar.gz"
    assert main(["bundle", "build", "--unsigned", "-o", str(out_file)]) == 1
    out, err = capsys.readouterr()
    assert not out and err.startswith("error: no opa binary found") and not out_file.exists()


def test_an_opa_that_cannot_run_is_a_clear_error(
    verifiable: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "opa"
    broken.write_bytes(b"\x7fELF not really\n")
    broken.chmod(0o755)
    monkeypatch.setenv("PVEGATE_OPA", str(broken))
    assert _verify(verifiable[0], verifiable[1]) == 1
    out, err = capsys.readouterr()
    assert not out and err.startswith(f"error: cannot verify {verifiable[0]}: ") and str(broken) in err
    assert "Traceback" not in err
