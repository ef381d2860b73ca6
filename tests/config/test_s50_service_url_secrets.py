"""A credential written into an OPA service's URL is refused, and never echoed.

`opa.services.<n>.url` took anything after `http(s)://host`: a pre-signed URL's `?sig=`, a token in a
query string, a user name and password. OPA appends each bundle's resource to the URL and logs the
result as it is (state_dir/opa.log, every poll; Go masks a password, not a query), and the same text
reached the gateway's start error and /admin/health's policy error. A query there also made every
bundle URL wrong (`.../b?sig=X/pvegate.tar.gz`). The URL is now a base URL with no user name or
password, query or fragment (credentials go in `credentials`), refused without showing the value;
and a URL a pattern refuses elsewhere is shown with its query values masked as well as its userinfo.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import ConfigError, load
from gateway.core.config_schema import _show
from tests.config.conftest import write

SECRETS = ("S3CRETPW", "QUERYSECRET", "FRAGSECRET")


def _opa(base: dict[str, Any], url: str) -> dict[str, Any]:
    base["opa"] = {"services": {"hub": {"url": url}}}
    return base


@pytest.mark.parametrize(
    "url",
    [
        "https://alice:S3CRETPW@bundles.example",
        "https://bundles.example/b?sig=QUERYSECRET",
        "https://bundles.example/b#FRAGSECRET",
        "https://bundles.example?token=QUERYSECRET&x=1",
    ],
)
def test_a_service_url_carrying_a_credential_is_refused_unshown(base: dict[str, Any], tmp_path: Path, url: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, _opa(base, url)))
    (problem,) = err.value.problems
    assert problem.startswith("opa.services.hub.url: expected a base URL"), problem
    assert "credentials" in problem and not any(s in problem for s in SECRETS), problem


@pytest.mark.parametrize("url", ["https://bundles.example", "http://127.0.0.1:8181/", "https://hub.example/opa/v1"])
def test_a_base_url_with_a_path_still_loads(base: dict[str, Any], tmp_path: Path, url: str) -> None:
    assert load(write(tmp_path, _opa(base, url))).opa.services["hub"]["url"] == url


def test_query_values_of_a_shown_url_are_masked() -> None:
    shown = _show("https://u:S3CRETPW@h.example/p?sig=QUERYSECRET&a=b")
    assert not any(s in shown for s in SECRETS) and "h.example/p?sig=***&a=***" in shown, shown
