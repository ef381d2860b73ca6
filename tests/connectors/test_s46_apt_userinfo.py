"""An APT source's password with a quote in it never leaves node_apt_repositories.

RFC 3986 allows `'` (and the other sub-delims ! $ & ( ) * + , ; =) in a URI's userinfo, and apt
takes a source line `deb https://mirror:Pa'ss@repo.vendor.example/debian trixie main` as written:
Proxmox's GET /nodes/{node}/apt/repositories hands the URI back verbatim. The tool's reducer
stripped userinfo only up to the first quote (the rule its error texts need, where a URL is
quoted), so such a URI came back whole, password included.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.reducers import TRANSFORMS

SECRET = "Pa'ss-9f3c"  # planted: the tool must never show it


def _reduce(answer: dict[str, Any]) -> Any:
    tool = Catalog.load(REPO_ROOT / "connectors").tools["node_apt_repositories"]
    return TRANSFORMS[str(tool.output.get("reducer"))](answer, {"node": "pve1"})


def _answer(uri: str, comment: str, error: str) -> dict[str, Any]:
    repo = {"Types": ["deb"], "URIs": [uri, "http://deb.debian.org/debian"], "Suites": ["trixie"],
            "Components": ["main"], "Enabled": True, "FileType": "list", "Comment": comment}  # fmt: skip
    return {
        "files": [{"path": "/etc/apt/sources.list.d/vendor.list", "repositories": [repo], "digest": [1]}],
        "errors": [{"path": "/etc/apt/sources.list.d/x.list", "error": error}],
        "infos": [],
        "digest": "abc",
    }


@pytest.mark.parametrize("secret", [SECRET, 'Pa"ss-9f3c', "it's(me)!"])
def test_a_quote_in_a_source_password_does_not_stop_its_removal(secret: str) -> None:
    uri = f"https://mirror:{secret}@repo.vendor.example/debian"
    out = _reduce(_answer(uri, f" vendor agent (from {uri})", f"malformed entry 'deb {uri} x'"))
    repo = out["files"][0]["repositories"][0]
    assert repo["URIs"] == ["https://***@repo.vendor.example/debian", "http://deb.debian.org/debian"]
    assert repo["Comment"] == " vendor agent (from https://***@repo.vendor.example/debian)"
    assert out["errors"][0]["error"] == "malformed entry 'deb https://***@repo.vendor.example/debian x'"
    assert secret not in str(out) and "mirror" not in str(out)


def test_urls_without_credentials_are_left_alone() -> None:
    out = _reduce(_answer("http://download.proxmox.com/debian/pve", " it's the no-subscription repo", "none"))
    repo = out["files"][0]["repositories"][0]
    assert repo["URIs"] == ["http://download.proxmox.com/debian/pve", "http://deb.debian.org/debian"]
    assert repo["Comment"] == " it's the no-subscription repo"
