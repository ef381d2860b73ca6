"""Bundle verification keys the configuration's load refuses: an HMAC algorithm (OPA would take the
public key's text as the shared secret: anyone who can read it signs a bundle OPA activates), a
private key (the signing key must not sit on the gateway host), anything that is not a PEM public
key, and a key of another kind than its algorithm. End to end: the managed OPA of such a
configuration never starts, so no forged bundle can activate (real opa)."""

from __future__ import annotations

import functools
import http.server
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gateway.core.config import ConfigError, load
from gateway.core.keys import public_key_problem, verification_key_problem
from gateway.policy.bundles import keygen
from gateway.policy.bundles import verification_key_problem as reexported
from gateway.policy.opa_sidecar import OPASidecar, OPAUnavailable, find_opa
from tests.config.conftest import run_pvegate, write


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return keygen(tmp_path_factory.mktemp("keys") / "keys")


def _service_opa(base: dict[str, Any], key: str, algorithm: str | None = "RS256") -> dict[str, Any]:
    entry = {"key": key} | ({"algorithm": algorithm} if algorithm is not None else {})
    base["opa"] = {
        "services": {"hub": {"url": "http://127.0.0.1:1"}},
        "bundles": {"pvegate": {"service": "hub", "resource": "pvegate.tar.gz", "signing": {"keyid": "signer"}}},
        "keys": {"signer": entry},
    }
    return base


def _refused(tmp_path: Path, raw: dict[str, Any]) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, raw))
    return err.value.problems


@pytest.mark.parametrize("algorithm", ["HS256", "HS384", "HS512", "RS265", "EdDSA"])
def test_an_hmac_or_unknown_key_algorithm_is_refused(
    base: dict[str, Any], tmp_path: Path, pair: tuple[Path, Path], algorithm: str
) -> None:
    problems = _refused(tmp_path, _service_opa(base, pair[1].read_text(), algorithm))
    assert len(problems) == 1 and problems[0].startswith("opa.keys.signer.algorithm: expected one of RS256,"), problems
    assert "HS256" not in problems[0].split("got")[0]  # never offered as a choice


def test_a_private_key_in_opa_keys_is_refused(base: dict[str, Any], tmp_path: Path, pair: tuple[Path, Path]) -> None:
    problems = _refused(tmp_path, _service_opa(base, pair[0].read_text()))
    assert problems == (
        "opa.keys.signer.key is a private (signing) key: give its public half (bundle-verify.pem); "
        "the signing key must not sit on the gateway host",
    )


@pytest.mark.parametrize(
    "key",
    ["not a key at all", "-----BEGIN PUBLIC KEY-----\nSUPERSECRETKEYJUNK\n-----END PUBLIC KEY-----\n"],
)
def test_a_key_that_is_no_pem_public_key_is_refused(base: dict[str, Any], tmp_path: Path, key: str) -> None:
    problems = _refused(tmp_path, _service_opa(base, key))
    assert problems == ("opa.keys.signer.key is not a PEM public key",)
    assert "SUPERSECRET" not in "".join(problems)


def test_a_key_of_another_kind_than_its_algorithm_is_refused(
    base: dict[str, Any], tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    problems = _refused(tmp_path, _service_opa(base, pair[1].read_text(), "ES256"))
    assert problems == ("opa.keys.signer.key is not an EC public key, as algorithm ES256 needs",)
    ec_pub = ec.generate_private_key(ec.SECP256R1()).public_key()
    pem = ec_pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    assert _refused(tmp_path, _service_opa(base, pem, None)) == (  # OPA's default: RS256
        "opa.keys.signer.key is not an RSA public key, as algorithm RS256 needs",
    )
    load(write(tmp_path, _service_opa(base, pem, "ES256")))


def test_control_a_public_key_of_an_asymmetric_algorithm_loads(
    base: dict[str, Any], tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    for algorithm in ("RS256", "RS512", "PS384", None):
        cfg = load(write(tmp_path, _service_opa(base, pair[1].read_text(), algorithm)))
        assert cfg.opa.keys["signer"]["key"] == pair[1].read_text()


def test_a_private_or_garbage_verification_key_file_is_refused(
    base: dict[str, Any], tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    base["opa"] = {"bundle": "b.tar.gz", "verification_key": str(pair[0])}
    assert _refused(tmp_path, base) == (
        f"opa.verification_key {pair[0]} is a private (signing) key: give its public half (bundle-verify.pem); "
        "the signing key must not sit on the gateway host",
    )
    junk = tmp_path / "junk.pem"
    junk.write_text("-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n")
    base["opa"]["verification_key"] = str(junk)
    assert _refused(tmp_path, base) == (f"opa.verification_key {junk} is not a PEM public key",)
    base["opa"]["verification_key"] = str(pair[1])
    assert load(write(tmp_path, base)).opa.verification_key == pair[1]


def test_config_check_says_so_in_one_line(base: dict[str, Any], tmp_path: Path, pair: tuple[Path, Path]) -> None:
    path = write(tmp_path, _service_opa(base, pair[1].read_text(), "HS256"))
    r = run_pvegate("config", "check", str(path))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "opa.keys.signer.algorithm" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_the_pem_check_lives_in_core_and_bundles_reexports_it(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    assert reexported is verification_key_problem
    assert verification_key_problem(pair[1]) is None
    assert verification_key_problem(tmp_path / "none.pem") == f"verification key {tmp_path / 'none.pem'} not found"
    assert public_key_problem(b"x", "k") == "k is not a PEM public key"


def test_a_forged_hmac_bundle_never_activates(base: dict[str, Any], tmp_path: Path, pair: tuple[Path, Path]) -> None:
    """hs256_e2e: a bundle HMAC-signed with the public key's text, served to a managed OPA whose
    opa.keys entry says HS256. The configuration is refused at load, and a sidecar given such keys
    directly refuses to start OPA at all: no decision is ever made with the forged bundle."""
    forged, src = tmp_path / "forge", tmp_path / "src"
    forged.mkdir()
    src.mkdir()
    (src / "p.rego").write_text('package pvegate\n\ndecision := {"allow": true}\n')  # allow everything
    cmd = [str(find_opa()), "build", "-b", ".", "--signing-key", str(pair[1]), "--signing-alg", "HS256"]
    subprocess.run([*cmd, "-o", str(forged / "forged.tar.gz")], cwd=src, check=True, capture_output=True)
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(forged))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    started: list[OPASidecar] = []
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        raw = _service_opa(base, pair[1].read_text(), "HS256")
        raw["opa"]["services"]["hub"]["url"] = url
        with pytest.raises(ConfigError, match=r"opa\.keys\.signer\.algorithm"):
            load(write(tmp_path, raw))
        sidecar = OPASidecar(
            log_file=tmp_path / "opa.log",
            services={"hub": {"url": url}},
            bundles={"pvegate": {"service": "hub", "resource": "forged.tar.gz", "signing": {"keyid": "signer"}}},
            keys={"signer": {"key": pair[1].read_text(), "algorithm": "HS256"}},
        )
        started.append(sidecar)
        with pytest.raises(OPAUnavailable, match=r"opa.keys.signer.algorithm: 'HS256' is not one of RS256"):
            sidecar.start(timeout=20)
        assert sidecar.process is None and not (tmp_path / "opa.log").exists()  # OPA was never started
        for keys in (
            {"signer": {"key": pair[0].read_text(), "algorithm": "RS256"}},
            {"signer": {"key": "not a key", "algorithm": "RS256"}},
        ):
            started.append(OPASidecar(services=sidecar.services, bundles=sidecar.bundles, keys=keys))
            with pytest.raises(OPAUnavailable, match=r"opa\.keys\.signer\.key is"):
                started[-1].start(timeout=20)
    finally:
        for s in started:  # an OPA that did start (the bug) is not left running
            s.stop()
        server.shutdown()
