"""Resource-server behaviour over HTTPS: each auth failure gets the spec's status and header, and is audited."""

from __future__ import annotations

import dataclasses
import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from gateway.core.config import AuthConfig, SecretRef
from gateway.dev.devenv import DevEnv
from tests.auth.keys import AUDIENCE, ISSUER, IdP, alg_none, claims_for
from tests.support import GatewayThread, audit_rows, database_bytes, free_port

LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
HEADERS = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}


@dataclasses.dataclass
class IdpGateway:
    gw: GatewayThread
    idp: IdP
    url: str
    base: str
    audit: Path
    ca: ssl.SSLContext
    hs_secret: str


@pytest.fixture(scope="module")
def idp_gw(env: DevEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IdpGateway]:
    tmp = tmp_path_factory.mktemp("idp")
    idp = IdP()
    for alg in ("RS256", "ES256", "EdDSA"):
        idp.add(alg, kid=alg.lower())
    port = free_port()
    cfg = dataclasses.replace(
        env.config,
        port=port,
        public_url=f"https://127.0.0.1:{port}",
        audit_path=tmp / "audit.db",
        auth=AuthConfig(
            issuer=ISSUER,
            audience=AUDIENCE,
            hs256_secret=SecretRef(file=env.config.auth.hs256_secret.file) if env.config.auth.hs256_secret else None,
            jwks_file=idp.write(tmp / "jwks.json"),
            algorithms=("RS256", "ES256", "EdDSA", "HS256"),
            roles_claim="realm_access.roles",
            required_scopes=("pvegate:tools",),
        ),
    )
    gw = GatewayThread(cfg).start()
    base = f"https://127.0.0.1:{port}"
    yield IdpGateway(
        gw,
        idp,
        base + "/mcp",
        base,
        cfg.audit_path,
        ssl.create_default_context(cafile=str(env.ca_file)),
        env.jwt_secret,
    )
    gw.stop()


def post(g: IdpGateway, token: str | None, body: Any = LIST) -> httpx.Response:
    headers = dict(HEADERS)
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    with httpx.Client(verify=g.ca) as http:
        return http.post(g.url, json=body, headers=headers)


def _forged_hs_with_public_key(g: IdpGateway) -> str:
    from cryptography.hazmat.primitives import serialization

    _, key = g.idp.keys["rs256"]
    pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    jws = jwt.api_jws.PyJWS()
    jws._algorithms["HS256"].prepare_key = lambda k: k  # what an attacker's own library would do
    return jws.encode(json.dumps(claims_for()).encode(), pem, algorithm="HS256", headers={"kid": "rs256"})


def _tampered(g: IdpGateway) -> str:
    head, _, sig = g.idp.token("es256").split(".")
    body = jwt.utils.base64url_encode(json.dumps(claims_for(realm_access={"roles": ["admin"]})).encode()).decode()
    return f"{head}.{body}.{sig}"


def _stranger(g: IdpGateway) -> str:
    other = IdP()
    other.add("RS256", kid="unknown-kid")
    return other.token("unknown-kid")


CASES: dict[str, tuple[Any, int, str, str]] = {
    # name: (token factory, status, RFC 6750 error, reason fragment)
    "missing": (lambda g: None, 401, "invalid_request", "missing bearer token"),
    "expired": (lambda g: g.idp.token("rs256", exp=int(time.time()) - 300), 401, "invalid_token", "expired"),
    "wrong_audience": (lambda g: g.idp.token("rs256", aud="https://other/mcp"), 401, "invalid_token", "audience"),
    "wrong_issuer": (lambda g: g.idp.token("eddsa", iss="https://evil.example"), 401, "invalid_token", "issuer"),
    "alg_none": (lambda g: alg_none(claims_for()), 401, "invalid_token", "'none' is not accepted"),
    "hs_rs_confusion": (_forged_hs_with_public_key, 401, "invalid_token", "signature"),
    "unknown_kid": (_stranger, 401, "invalid_token", "unknown signing key"),
    "tampered": (_tampered, 401, "invalid_token", "signature"),
    "missing_scope": (lambda g: g.idp.token("rs256", scope="openid"), 403, "insufficient_scope", "missing scope"),
    # validly signed: a 500 before (float overflow), and a string exp was taken
    "exp_huge": (lambda g: g.idp.token("rs256", exp=10**400), 401, "invalid_token", "exp claim must be a number"),
    "exp_string": (
        lambda g: g.idp.token("es256", exp=str(int(time.time()) + 600)),
        401,
        "invalid_token",
        "exp claim must be a number",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_auth_failure_status_header_and_audit(idp_gw: IdpGateway, case: str) -> None:
    make, status, error, reason = CASES[case]
    token = make(idp_gw)
    before = len(audit_rows(idp_gw.audit))
    r = post(idp_gw, token)
    assert r.status_code == status, r.text
    challenge = r.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    if token is None:  # RFC 6750 §3.1: a request without credentials gets a challenge with no error code
        assert "error" not in challenge
    else:
        assert f'error="{error}"' in challenge
    assert f'resource_metadata="{idp_gw.base}/.well-known/oauth-protected-resource/mcp"' in challenge
    if status == 403:
        assert 'scope="pvegate:tools"' in challenge
    assert "Traceback" not in r.text
    rows = [row for row in audit_rows(idp_gw.audit)[before:] if row["kind"] == "auth_failure"]
    assert len(rows) == 1 and rows[0]["outcome"] == error and reason in rows[0]["body"]
    if token:
        assert token not in rows[0]["body"]  # the credential itself is never recorded
        signature = token.split(".")[-1]
        raw = database_bytes(idp_gw.audit).decode(errors="ignore")
        assert not signature or signature not in raw


@pytest.mark.parametrize("kid", ["rs256", "es256", "eddsa"])
def test_idp_token_reaches_the_tools(idp_gw: IdpGateway, kid: str) -> None:
    r = post(idp_gw, idp_gw.idp.token(kid))
    assert r.status_code == 200 and "result" in r.json()
    assert "list_nodes" in {t["name"] for t in r.json()["result"]["tools"]}  # roles from realm_access.roles


def test_protected_resource_metadata(idp_gw: IdpGateway) -> None:
    with httpx.Client(verify=idp_gw.ca) as http:
        docs = [
            http.get(idp_gw.base + p)
            for p in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp")
        ]
    for r in docs:
        assert r.status_code == 200
        doc = r.json()
        assert doc["resource"] == idp_gw.url
        assert doc["authorization_servers"] == [ISSUER]
        assert doc["bearer_methods_supported"] == ["header"]
        assert doc["scopes_supported"] == ["pvegate:tools"]


def test_admin_credential_cannot_call_tools(idp_gw: IdpGateway, env: DevEnv) -> None:
    assert env.config.admin.token is not None
    r = post(idp_gw, env.config.admin.token.read())
    assert r.status_code == 401 and 'error="invalid_token"' in r.headers["www-authenticate"]


def test_mcp_token_cannot_use_admin_api(idp_gw: IdpGateway) -> None:
    token = idp_gw.idp.token("rs256")
    with httpx.Client(verify=idp_gw.ca) as http:
        for path in ("/admin/audit/verify", "/admin/audit/records"):  # operator endpoints: admin token only
            r = http.get(idp_gw.base + path, headers={"authorization": f"Bearer {token}"})
            assert r.status_code == 401, (path, r.status_code)
