"""A signing key that cannot sign is said before the policy checks, in words of its own.

`pvegate bundle build --signing-key` checked only that the file existed. A key that cannot sign
(the public verification key given by mistake, a passphrase-protected key, an EC key where bundles
are signed RS256, a file that is no key at all) ran every policy check first (up to minutes on a
real tree), then `opa build -O=1` failed on the key and the build logged that *the optimiser*
failed ("building the bundle plain (slower, the same answers)") before the plain build failed on
the same key with OPA's bare `unsupported key type: PUBLIC KEY`. The operator was sent looking
at the policy. Now the key is read first: a clear error, no checks run, nothing built, and the
key's content never quoted. Real opa, the real CLI.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gateway.cli import main
from gateway.policy.bundles import keygen
from gateway.policy.opa_sidecar import REPO_ROOT


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "policies"
    shutil.copytree(REPO_ROOT / "policies", tree)
    return tree


def _keys(d: Path) -> dict[str, tuple[Path, str]]:
    """Key files that cannot sign a bundle, each with what the error must say."""
    _, pub = keygen(d / "pair")
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    encrypted = d / "encrypted.pem"
    encrypted.write_bytes(
        rsa_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    ec_key = d / "ec.pem"
    ec_key.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    garbage = d / "garbage.pem"
    garbage.write_text("TOPSECRET-not-a-key\n")
    return {
        "public": (pub, "is a public (verification) key"),
        "encrypted": (encrypted, "is encrypted with a passphrase"),
        "ec": (ec_key, "is not an RSA private key"),
        "garbage": (garbage, "is not a PEM private key"),
        "directory": (d / "pair", "is a directory"),
    }


@pytest.mark.parametrize("kind", ["public", "encrypted", "ec", "garbage", "directory"])
def test_a_key_that_cannot_sign_is_refused_before_the_checks(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    key, said = _keys(tmp_path)[kind]
    out = tmp_path / "b.tar.gz"
    # a policy error the checks would report: seen in the output only if the checks ran
    tree = _tree(tmp_path)
    (tree / "pvegate" / "broken.rego").write_text("package pvegate.broken\n\nthis is not rego\n")
    with caplog.at_level(logging.WARNING, logger="pvegate.bundle"):
        code = main(["bundle", "build", "--policies", str(tree), "-o", str(out), "--signing-key", str(key)])
    err = capsys.readouterr().err
    assert code == 1
    assert said in err and "nothing was built" in err
    assert "policy checks" not in err and "broken.rego" not in err  # refused before the checks
    assert "opa build -O=1 failed" not in caplog.text  # never passed off as the optimiser's failure
    assert "TOPSECRET" not in err + caplog.text and "Traceback" not in err
    assert not out.exists()


def test_the_signing_key_of_keygen_still_signs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Control: keygen's own pair builds and verifies (the CLI's checks included)."""
    priv, pub = keygen(tmp_path / "keys")
    out = tmp_path / "b.tar.gz"
    assert main(["bundle", "build", "-o", str(out), "--signing-key", str(priv)]) == 0
    assert main(["bundle", "verify", str(out), "--verification-key", str(pub)]) == 0
    assert "OK:" in capsys.readouterr().out
