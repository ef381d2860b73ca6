"""Which key verifies a token: never a guess, never the JWT library's uncaught exception.

Planted in review and not caught before: a token without `kid` verified by the
first of several keys of its algorithm, and key-set entries without `alg` used for
any algorithm (pyjwt then raised TypeError: an uncaught exception, not a 401).
"""

from __future__ import annotations

import json
from pathlib import Path

import jwt
import pytest

from gateway.auth.tokens import AuthError
from tests.auth.keys import IdP, claims_for
from tests.auth.test_authenticator import make_auth, refused, run


def no_kid(idp: IdP, kid: str) -> str:
    alg, key = idp.keys[kid]
    return jwt.encode(claims_for(), key, algorithm=alg)  # no kid header


def test_no_kid_with_two_keys_of_its_algorithm_is_refused(tmp_path: Path) -> None:
    idp = IdP()
    first = idp.add("RS256", kid="rsa-a")
    idp.add("RS256", kid="rsa-b")
    idp.add("ES256", kid="ec")
    auth = make_auth(tmp_path, idp)
    err = refused(auth, no_kid(idp, first))  # signed by the key a guess would pick first
    assert err.status == 401 and "token names no kid" in str(err), err


def test_no_kid_with_exactly_one_key_of_its_algorithm_verifies(tmp_path: Path) -> None:
    idp = IdP()
    only = idp.add("RS256", kid="rsa-only")
    idp.add("ES256", kid="ec")
    assert run(make_auth(tmp_path, idp), no_kid(idp, only)).sub == "idp-agent"  # type: ignore[attr-defined]


def _without_alg(idp: IdP, path: Path) -> Path:
    doc = idp.jwks()
    for k in doc["keys"]:
        k.pop("alg")
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    ("signed_by", "alg", "named_kid"),
    [
        ("es256", "ES256", "rs256"),  # an EC signature naming the RSA key
        ("rs256", "RS256", "es256"),  # an RSA signature naming the EC key
        ("rs256", "RS256", "eddsa"),  # an RSA signature naming the Ed25519 key
        ("eddsa", "EdDSA", "rs256"),  # an Ed25519 signature naming the RSA key
    ],
)
def test_keys_without_alg_are_filtered_by_key_type(tmp_path: Path, signed_by: str, alg: str, named_kid: str) -> None:
    idp = IdP()
    for a in ("RS256", "ES256", "EdDSA"):
        idp.add(a, kid=a.lower())
    auth = make_auth(tmp_path, idp, jwks_file=_without_alg(idp, tmp_path / "jwks-no-alg.json"))
    _, key = idp.keys[signed_by]
    token = jwt.encode(claims_for(), key, algorithm=alg, headers={"kid": named_kid})
    err = refused(auth, token)  # an AuthError (a 401), not TypeError from the JWT library
    assert isinstance(err, AuthError) and err.status == 401
    assert f"key {named_kid!r} cannot verify {alg}" in str(err), err  # refused by key type, before pyjwt
    # and each key still verifies its own kind of token
    assert run(auth, jwt.encode(claims_for(), key, algorithm=alg, headers={"kid": signed_by})) is not None
