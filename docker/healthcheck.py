"""Container health probe: exit 0 when URL answers 200, else 1 (Docker HEALTHCHECK, compose healthcheck).

Usage: python healthcheck.py [URL]   (default: $PVEGATE_HEALTH_URL, else the gateway's readiness path)

The image has Python but no curl or wget; the official OPA images have neither (a static binary
on a distroless base), which is why the compose file runs OPA from this image too. The probe
talks to its own container on loopback: the gateway's certificate names its public host, so it
is not verified here (the probe checks health, it sends nothing secret).
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.error
import urllib.request

# the gateway's readiness endpoint (docs/deployment.md: red while OPA, the policy or the audit fail)
READY_PATH = "/readyz"
DEFAULT_URL = os.environ.get("PVEGATE_HEALTH_URL", f"https://127.0.0.1:8443{READY_PATH}")


def probe(url: str, timeout: float = 3.0) -> bool:
    if not url.startswith(("http://127.0.0.1:", "https://127.0.0.1:", "http://localhost:", "https://localhost:")):
        raise SystemExit(f"healthcheck: {url}: loopback URLs only")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # our own process on loopback, see above
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:  # noqa: S310 - scheme checked above
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


if __name__ == "__main__":
    sys.exit(0 if probe(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_URL) else 1)
