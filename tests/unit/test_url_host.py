"""The host the policy's download allow-list decides on (target.url_host)."""

from __future__ import annotations

import pytest

from gateway.tools.targets import url_host


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://cdimage.debian.org/debian-cd/x.iso", "cdimage.debian.org"),
        ("http://Download.Proxmox.COM./images/x.tar.zst", "download.proxmox.com"),
        ("https://mirror.example.net:8443/x.iso", "mirror.example.net"),
        ("https://download.proxmox.com@evil.example/x.iso", None),  # userinfo: never trusted
        ("https://user:pw@download.proxmox.com/x.iso", None),
        ("ftp://download.proxmox.com/x.iso", None),
        ("https://download.proxmox.com:99999/x.iso", None),  # a port out of range
        ("https:///x.iso", None),
        ("not a url", None),
        (None, None),
    ],
)
def test_url_host(url: object, host: str | None) -> None:
    assert url_host(url) == host
