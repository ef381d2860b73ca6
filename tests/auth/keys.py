"""Test identity provider: real RSA / EC / Ed25519 keys, a JWKS document, and token minting."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

ISSUER = "https://idp.example.test"
AUDIENCE = "https://127.0.0.1/mcp"


def _private(alg: str) -> Any:
    if alg == "RS256":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if alg == "ES256":
        return ec.generate_private_key(ec.SECP256R1())
    if alg == "EdDSA":
        return ed25519.Ed25519PrivateKey.generate()
    raise ValueError(alg)


def _jwk(alg: str, public: Any, kid: str) -> dict[str, Any]:
    codec = {"RS256": RSAAlgorithm, "ES256": ECAlgorithm, "EdDSA": OKPAlgorithm}[alg]
    doc: dict[str, Any] = json.loads(codec.to_jwk(public))
    doc.update(kid=kid, alg=alg, use="sig")
    return doc


@dataclass
class IdP:
    keys: dict[str, tuple[str, Any]] = field(default_factory=dict)  # kid -> (alg, private key)

    def add(self, alg: str, kid: str | None = None) -> str:
        kid = kid or f"{alg.lower()}-{uuid.uuid4().hex[:8]}"
        self.keys[kid] = (alg, _private(alg))
        return kid

    def jwks(self) -> dict[str, Any]:
        return {"keys": [_jwk(alg, key.public_key(), kid) for kid, (alg, key) in self.keys.items()]}

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(self.jwks()))
        return path

    def token(self, kid: str, *, headers: dict[str, Any] | None = None, **claims: Any) -> str:
        alg, key = self.keys[kid]
        return jwt.encode(claims_for(**claims), key, algorithm=alg, headers={"kid": kid, **(headers or {})})


def claims_for(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "idp-agent",
        "iat": now,
        "nbf": now,
        "exp": now + 600,
        "realm_access": {"roles": ["operator"]},
        "groups": ["sre"],
        "scope": "pvegate:tools",
    }
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


def alg_none(claims: dict[str, Any]) -> str:
    return jwt.encode(claims, None, algorithm="none")
