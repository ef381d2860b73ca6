"""Is an external OPA open to anyone? Its API must answer only the holder of our token.

An OPA that answers `GET /v1/data/system/authz` without a token serves the policy and its data
to whoever reaches it, and takes writes from them: the gateway refuses to start against one
(`gateway.app.refuse_open_opa`) and, since an OPA can be restarted with other flags behind a
running gateway, the readiness prober asks again every `health.opa_probe_interval` and the
decision client refuses every call while the answer is yes.

The question goes to OPA itself, never through a proxy the environment names (HTTP_PROXY and the
like): a proxy's refusal (403, 407, 502) would pass for OPA wanting a token.
"""

from __future__ import annotations

import httpx

from gateway.policy.opa_address import direct

PROBE_PATH = "/v1/data/system/authz"


def open_access_message(url: str) -> str:
    return (
        f"the OPA at {url} answers without a token: run it with --authentication=token "
        "--authorization=basic and a bundle from `pvegate bundle build` (docs/deployment.md)"
    )


def _is_open(status: int) -> bool:
    # 401/403: it wants a token. Anything else but 200 (404 on an old OPA, 5xx) is not an open API.
    return status == 200


def opa_is_open(url: str, timeout: float = 2.0) -> bool | None:
    """True: answers without a token. False: refuses. None: not reachable (nothing to conclude)."""
    try:
        r = httpx.get(url.rstrip("/") + PROBE_PATH, **direct(url, {"timeout": timeout}))
    except httpx.HTTPError:
        return None
    return _is_open(r.status_code)


async def opa_is_open_async(url: str) -> bool | None:
    try:
        async with httpx.AsyncClient(**direct(url, {"timeout": 2.0})) as http:
            r = await http.get(url.rstrip("/") + PROBE_PATH)
    except httpx.HTTPError:
        return None
    return _is_open(r.status_code)
