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


def test_a_credential_plugin_is_refused_naming_the_supported_methods(base: dict[str, Any]) -> None:
    found = problems(_service(base, credentials={"plugin": SECRET}))
    assert len(found) == 1 and found[0].startswith(f"{AT}.credentials.plugin: "), found
    assert "bearer, oauth2, client_tls" in found[0], found
    _secret_free(found)


# the metadata-server forms: the platform gives OPA its credentials, nothing secret sits in the file
@pytest.mark.parametrize(
    "credentials",
    [
        {"s3_signing": {"metadata_credentials": {"aws_region": "eu-west-1"}}},
        {
            "s3_signing": {
                "metadata_credentials": {"aws_region": "eu-west-1", "iam_role": "opa-bundles"},
                "service": "s3",
                "signature_version": "4",
            }
        },
        {"gcp_metadata": {"audience": "https://storage.googleapis.com"}},
        {
            "gcp_metadata": {
                "scopes": ["https://www.googleapis.com/auth/devstorage.read_only"],
                "endpoint": "http://metadata.google.internal",
                "access_token_path": "/computeMetadata/v1/instance/service-accounts/default/token",
                "identity_token_path": "/computeMetadata/v1/instance/service-accounts/default/identity",
            }
        },
        {"azure_managed_identity": {}},
        {
            "azure_managed_identity": {
                "endpoint": "http://169.254.169.254/metadata/identity/oauth2/token",
                "api_version": "2018-02-01",
                "resource": "https://storage.azure.com/",
                "object_id": "obj",
                "client_id": "cid",
                "mi_res_id": "/subscriptions/s/resourceGroups/g",
                "use_app_service_msi": False,
            }
        },
    ],
)
def test_a_metadata_server_method_loads(base: dict[str, Any], tmp_path: Path, credentials: dict[str, Any]) -> None:
    load(write(tmp_path, _service(base, credentials=credentials)))


@pytest.mark.parametrize(
    ("s3_signing", "named"),
    [
        ({"environment_credentials": {}}, "environment_credentials"),
        ({"profile_credentials": {"path": "/root/.aws/credentials", "profile": "p"}}, "profile_credentials"),
        ({"web_identity_credentials": {"aws_region": "eu-west-1"}}, "web_identity_credentials"),
        ({"assume_role_credentials": {"iam_role_arn": "arn:x"}}, "assume_role_credentials"),
        ({"aws_secret_access_key": SECRET}, "aws_secret_access_key"),
        ({"aws_access_key_id": SECRET}, "aws_access_key_id"),
        ({"aws_session_token": SECRET}, "aws_session_token"),
        (
            {"metadata_credentials": {"aws_region": "eu-west-1", "aws_secret_access_key": SECRET}},
            "metadata_credentials.aws_secret_access_key",
        ),
    ],
)
def test_an_aws_form_needing_a_secret_is_refused_by_name(
    base: dict[str, Any], s3_signing: dict[str, Any], named: str
) -> None:
    doc = {"metadata_credentials": {"aws_region": "eu-west-1"}, **s3_signing}
    found = problems(_service(base, credentials={"s3_signing": doc}))
    assert found and all(line.startswith(f"{AT}.credentials.s3_signing.{named}: ") for line in found), found
    assert "metadata_credentials" in found[0], found
    _secret_free(found)


@pytest.mark.parametrize(
    ("credentials", "named"),
    [
        (
            {"s3_signing": {"metadata_credentials": {"aws_region": "r", "iam_rol": "x"}}},
            "s3_signing.metadata_credentials.iam_rol",
        ),
        ({"s3_signing": {"metadata_credential": {"aws_region": "r"}}}, "s3_signing.metadata_credential"),
        ({"s3_signing": {"metadata_credentials": {"aws_region": "r"}, "sevice": "s3"}}, "s3_signing.sevice"),
        ({"gcp_metadata": {"audiance": "opa"}}, "gcp_metadata.audiance"),
        ({"azure_managed_identity": {"clientid": "c"}}, "azure_managed_identity.clientid"),
    ],
)
def test_a_mistyped_key_in_a_metadata_method_is_refused(
    base: dict[str, Any], credentials: dict[str, Any], named: str
) -> None:
    found = problems(_service(base, credentials=credentials))
    assert any(line.startswith(f"{AT}.credentials.{named}: unknown setting") for line in found), found


def test_s3_signing_needs_metadata_credentials(base: dict[str, Any]) -> None:
    found = problems(_service(base, credentials={"s3_signing": {"service": "s3"}}))
    assert any(f"{AT}.credentials.s3_signing.metadata_credentials: required" in line for line in found), found


LINE = f"Authorization: Bearer {SECRET}"  # a whole header line pasted where a mapping belongs


@pytest.mark.parametrize(
    "entry",
    [
        {"headers": LINE},
        {"credentials": LINE},
        *({"credentials": {method: LINE}} for method in ("bearer", "oauth2", "client_tls")),
        *({"credentials": {method: LINE}} for method in ("s3_signing", "gcp_metadata", "azure_managed_identity")),
        *(
            {
                "credentials": {
                    "oauth2": {
                        "token_url": "https://idp/token",
                        "client_id": "opa",
                        "client_secret": {"env": "S"},
                        field: LINE,
                    }
                }
            }
            for field in ("additional_headers", "additional_parameters")
        ),
    ],
)
def test_a_string_where_a_mapping_belongs_is_not_echoed(base: dict[str, Any], entry: dict[str, Any]) -> None:
    found = problems(_service(base, **entry))
    assert any("expected a mapping, got a string" in line for line in found), found
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
