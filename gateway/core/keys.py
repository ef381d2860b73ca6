"""Bundle verification keys: what may verify a signed OPA bundle on the gateway host.

A key that verifies a bundle's signature must be a PEM *public* key of an asymmetric algorithm:

- not a private key: OPA accepts one (it verifies with its public half), but the signing key must
  not sit on a host that only verifies;
- not anything else (garbage, a typo, a certificate): OPA reads an unreadable file name as the
  key's PEM text itself and fails later, or not at all;
- never with an HMAC algorithm (HS256/HS384/HS512): OPA then takes the key's text as the shared
  secret, so anyone who can read the *public* key could sign a bundle it accepts.

Used by the configuration's load (`opa.keys`, `opa.verification_key`), the managed OPA's start and
`pvegate bundle verify` / `policy replay` (through gateway/policy/bundles.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

# OPA v1.22.3's bundle signing algorithms (v1/keys/keys.go), less the HMAC ones (HS256, HS384,
# HS512): with those the "key" is a shared secret, and a public key is no secret
RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_ALGORITHMS = ("ES256", "ES384", "ES512")
ASYMMETRIC_ALGORITHMS = RSA_ALGORITHMS + EC_ALGORITHMS
DEFAULT_ALGORITHM = "RS256"  # OPA's, when a key names none


def public_key_problem(pem: bytes, what: str, algorithm: str | None = None) -> str | None:
    """Why `pem` cannot verify bundle signatures (it is no PEM public key, or a private one, or not
    of `algorithm`'s kind when one is given), or None. `what` names it in the message."""
    if b"PRIVATE KEY-----" in pem:
        return (
            f"{what} is a private (signing) key: give its public half (bundle-verify.pem); "
            "the signing key must not sit on the gateway host"
        )
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return f"{what} is not a PEM public key"
    if algorithm is None:
        return None
    if algorithm not in ASYMMETRIC_ALGORITHMS:
        return (
            f"{what}: algorithm {algorithm!r} is not one of {', '.join(ASYMMETRIC_ALGORITHMS)} "
            "(an HMAC algorithm would take the public key's text as the shared secret)"
        )
    if algorithm in RSA_ALGORITHMS and not isinstance(key, rsa.RSAPublicKey):
        return f"{what} is not an RSA public key, as algorithm {algorithm} needs"
    if algorithm in EC_ALGORITHMS and not isinstance(key, ec.EllipticCurvePublicKey):
        return f"{what} is not an EC public key, as algorithm {algorithm} needs"
    return None


def opa_keys_problems(keys: dict[str, Any]) -> list[str]:
    """Why entries of OPA's `keys` configuration (key id -> {key, algorithm}) cannot verify bundles: an
    algorithm that is not asymmetric, or a key that is no PEM public key of its algorithm's kind."""
    out: list[str] = []
    for kid, entry in keys.items():
        fields = entry if isinstance(entry, dict) else {}
        algorithm = str(fields.get("algorithm") or DEFAULT_ALGORITHM)
        key = fields.get("key")
        if algorithm not in ASYMMETRIC_ALGORITHMS:
            out.append(
                f"opa.keys.{kid}.algorithm: {algorithm!r} is not one of {', '.join(ASYMMETRIC_ALGORITHMS)} "
                "(an HMAC algorithm would take the public key's text as the shared secret)"
            )
        elif not isinstance(key, str):
            out.append(f"opa.keys.{kid}.key: no PEM public key given")
        elif (problem := public_key_problem(key.encode(), f"opa.keys.{kid}.key", algorithm)) is not None:
            out.append(problem)
    return out


def verification_key_problem(key: Path) -> str | None:
    """Why the file `key` cannot be a bundle verification key (a PEM public key), or None. Said before
    OPA is asked: OPA takes an unreadable --verification-key for the key's PEM text itself ("failed
    to parse PEM block"), and accepts a private key (it verifies with its public half), but the
    signing key must not sit on a host that only verifies."""
    try:
        pem = key.read_bytes()
    except FileNotFoundError:
        return f"verification key {key} not found"
    except OSError as exc:
        return f"cannot read the verification key {key}: {exc.strerror or exc}"
    return public_key_problem(pem, f"the verification key {key}")
