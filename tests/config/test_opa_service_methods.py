"""opa.services: the credential methods pvegate does not support are refused by name (OPA ignores a
key it does not know, so a mistyped or half-configured method would load and fail only at OPA's
first request), oauth2 holds only what client_credentials with a secret reference needs, and
`headers` are HTTP header names with string values, never `Authorization`, never echoed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import load
from gateway.core.config_schema import problems

from .conftest import write

SECRET = "aws-secret-key-9f8e7d6c5b4a"
AT = "opa.services.siem"


def _service(base: dict[str, Any], **entry: Any) -> dict[str, Any]:
    base.setdefault("opa", {})["services"] = {"siem": {"url": "https://logs.example.internal", **entry}}
    return base


def _secret_free(found: list[str]) -> None:
    assert all(SECRET not in line for line in found), found


@pytest.mark.parametrize(
    ("method", "value"),
    [
        ("s3_signing", {"environment_credentials": {}, "static_credentials": {"aws_secret_access_key": SECRET}}),
        ("gcp_metadata", {"audience": "opa", "token_path": "/x"}),
        ("azure_managed_identity", {"client_id": SECRET}),
        ("plugin", SECRET),
    ],
)
def test_an_unsupported_method_is_refused_naming_the_supported_ones(
    base: dict[str, Any], method: str, value: Any
) -> None:
    found = problems(_service(base, credentials={method: value}))
    assert len(found) == 1, found
    assert found[0].startswith(f"{AT}.credentials.{method}: ")
    assert "bearer, oauth2 or client_tls" in found[0], found
    _secret_free(found)


@pytest.mark.parametrize(
    ("oauth2", "named"),
    [
        # the signing key would have to be a private key in opa.keys, which holds public keys only
        ({"signing_key": "k"}, "signing_key"),
        ({"thumbprint": "aa"}, "thumbprint"),
        ({"additional_claims": {"sub": "x"}}, "additional_claims"),
        ({"include_jti_claim": True}, "include_jti_claim"),
        ({"aws_kms": {"name": "k"}}, "aws_kms"),
        ({"aws_signing": {"static_credentials": {"aws_secret_access_key": SECRET}}}, "aws_signing"),
        ({"azure_keyvault": {"key": "k"}}, "azure_keyvault"),
        ({"azure_signing": {"client_secret": SECRET}}, "azure_signing"),
    ],
)
def test_an_unsupported_oauth2_field_is_refused(base: dict[str, Any], oauth2: dict[str, Any], named: str) -> None:
    doc = {"token_url": "https://idp/token", "client_id": "opa", "client_secret": {"env": "S"}, **oauth2}
    found = problems(_service(base, credentials={"oauth2": doc}))
    assert found and all(line.startswith(f"{AT}.credentials.oauth2.{named}: ") for line in found), found
    assert "client_credentials" in found[0]
    _secret_free(found)


@pytest.mark.parametrize(
    ("oauth2", "expected"),
    [
        ({"client_id": "opa", "client_secret": {"env": "S"}}, f"{AT}.credentials.oauth2.token_url: required"),
        ({"token_url": "https://idp/token", "client_secret": {"env": "S"}}, "oauth2.client_id: required"),
        ({"token_url": "https://idp/token", "client_id": "opa"}, "exactly one of client_secret"),
        (
            {
                "token_url": "https://idp/token",
                "client_id": "opa",
                "client_secret": {"env": "S"},
                "client_assertion_path": "/a",
            },
            "exactly one of client_secret",
        ),
        (
            {
                "token_url": "https://idp/token",
                "client_id": "opa",
                "client_secret": {"env": "S"},
                "grant_type": "jwt_bearer",
            },
            "oauth2.grant_type: expected one of client_credentials",
        ),
    ],
)
def test_oauth2_needs_what_client_credentials_needs(
    base: dict[str, Any], oauth2: dict[str, Any], expected: str
) -> None:
    found = problems(_service(base, credentials={"oauth2": oauth2}))
    assert any(expected in line for line in found), found


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {SECRET}"},
        {"authorization": f"Bearer {SECRET}"},
        {"Proxy-Authorization": f"Basic {SECRET}"},
    ],
)
def test_authorization_in_headers_is_refused_without_its_value(base: dict[str, Any], headers: dict[str, str]) -> None:
    found = problems(_service(base, headers=headers))
    assert len(found) == 1 and found[0].startswith(f"{AT}.headers.") and "credentials" in found[0], found
    _secret_free(found)


@pytest.mark.parametrize(
    "headers",
    [
        {f"Authorization: Bearer {SECRET}": "x"},  # a whole header line pasted as the name
        {f"X-Api-Key {SECRET}": "x"},
        {"X-Api-Key": 12345678},
        {"X-Api-Key": f"{SECRET}\r\nX-Injected: 1"},
        {"X-Api-Key": {"file": SECRET}},
    ],
)
def test_a_bad_header_is_refused_without_echoing_it(base: dict[str, Any], headers: dict[str, Any]) -> None:
    found = problems(_service(base, headers=headers))
    assert len(found) == 1 and found[0].startswith(f"{AT}.headers"), found
    _secret_free(found)
    assert "12345678" not in found[0]


@pytest.mark.parametrize(
    ("oauth2", "named"),
    [
        ({"additional_headers": {"Authorization": f"Basic {SECRET}"}}, "additional_headers.Authorization"),
        ({"additional_headers": {f"X-Key: {SECRET}": "x"}}, "additional_headers"),
        ({"additional_parameters": {"client_secret": 12345678}}, "additional_parameters.client_secret"),
    ],
)
def test_the_token_requests_headers_and_parameters_are_never_echoed(
    base: dict[str, Any], oauth2: dict[str, Any], named: str
) -> None:
    doc = {"token_url": "https://idp/token", "client_id": "opa", "client_secret": {"env": "S"}, **oauth2}
    found = problems(_service(base, credentials={"oauth2": doc}))
    assert len(found) == 1 and found[0].startswith(f"{AT}.credentials.oauth2.{named}: "), found
    _secret_free(found)
    assert "12345678" not in found[0]


@pytest.mark.parametrize(
    "entry",
    [
        {"headers": {"X-Tenant": "blue", "Accept-Encoding": "gzip"}},
        {
            "credentials": {
                "oauth2": {
                    "token_url": "https://idp/token",
                    "client_id": "opa",
                    "client_secret": {"file": "secrets/siem"},
                    "scopes": ["logs"],
                }
            }
        },
        {
            "credentials": {
                "oauth2": {"token_url": "https://idp/token", "client_id": "opa", "client_assertion_path": "/a"}
            }
        },
        {
            "credentials": {
                "oauth2": {
                    "grant_type": "client_credentials",
                    "token_url": "https://idp/token",
                    "client_id": "o",
                    "client_assertion": {"env": "A"},
                }
            }
        },
    ],
)
def test_a_supported_service_loads(base: dict[str, Any], tmp_path: Path, entry: dict[str, Any]) -> None:
    (tmp_path / "secrets" / "siem").write_text(SECRET + "\n")
    load(write(tmp_path, _service(base, **entry)))
