"""Web origins and Host values: one reading of a URL's origin for the transport guard (every route) and
the console's same-origin check, so a request one of them takes as the gateway's own the other does too."""

from __future__ import annotations

from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}

# (scheme, host, port): scheme and host lowercased, an IPv6 host without its brackets, the port always given
Origin = tuple[str, str, int]


def url_origin(url: str) -> Origin | None:
    """The origin of an http(s) URL (RFC 6454), the default port filled in; None for anything else."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # an unbalanced bracket, a port that is no number from 0 to 65535
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), DEFAULT_PORTS[scheme] if port is None else port


def as_host(address: str) -> str:
    """An address as a Host header writes it: an IPv6 literal in brackets (RFC 3986 §3.2.2), else as it is."""
    return f"[{address}]" if ":" in address else address


def host_values(origin: Origin) -> frozenset[str]:
    """The Host header values that name the origin's host: with its port and without it (a client leaves a
    default port out; a Host without the port has always been taken as public_url's)."""
    _, host, port = origin
    return frozenset({as_host(host), f"{as_host(host)}:{port}"})


def origin_values(origin: Origin) -> frozenset[str]:
    """The Origin header values that are this origin: `scheme://host[:port]`, as a browser writes it (no
    default port, RFC 6454 §6.2) and, for a default port, with it written too."""
    scheme, host, port = origin
    written = f"{scheme}://{as_host(host)}:{port}"
    return frozenset({written, f"{scheme}://{as_host(host)}"} if port == DEFAULT_PORTS[scheme] else {written})
