"""The legacy-era `Mcp-Session-Id` is opaque: it no longer shows who the session belongs to.

What was wrong: the session id was an HMAC-signed record whose payload was plain base64url JSON:
the token's issuer and subject, the expiry, the protocol version and the URL-elicitation flag.
Proxies, load balancers and logs that record request headers (most do, unlike bodies) then held
the principal's identity next to every request of the session. The id is now encrypted (AES-GCM
under a key derived from the shared state key, so any replica still reads it, no server-side
state). The guarantees stay: an id another principal presents grants nothing, a changed id is
refused, and an id issued before the upgrade (signed, readable) is taken as no session, not a 5xx.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import ssl
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.core.principal import Principal
from gateway.dev.devenv import ISSUER, DevEnv
from gateway.mcp.request_state import Sealer, Sessions
from gateway.store.shared_keys import state_key
from tests.approvals.conftest import Api
from tests.support import GatewayThread

VERSION = "2025-11-25"
OWNER = "s51-session-owner"
OTHER = "s51-session-other"
URL_ELICITATION_REQUIRED = -32042
_timeouts = itertools.count(551)  # distinct calls (test_handoff counts from 501)


@pytest.fixture(scope="module")
def http(aenv: DevEnv) -> Iterator[httpx.Client]:
    with httpx.Client(verify=ssl.create_default_context(cafile=str(aenv.ca_file)), timeout=30) as client:
        yield client


def _headers(token: str, session_id: str | None = None) -> dict[str, str]:
    h = {
        "authorization": f"Bearer {token}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": VERSION,
    }
    if session_id is not None:
        h["mcp-session-id"] = session_id
    return h


def _session(http: httpx.Client, api: Api, sub: str) -> str:
    """initialize declaring URL elicitation: the gateway hands out a session id remembering it."""
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": VERSION,
            "capabilities": {"elicitation": {"url": {}}},
            "clientInfo": {"name": "s51", "version": "1"},
        },
    }
    r = http.post(api.env.url, json=init, headers=_headers(api.agent(sub)))
    assert r.status_code == 200, r.text
    return r.headers["mcp-session-id"]


def _shutdown(http: httpx.Client, api: Api, sub: str, session_id: str | None) -> httpx.Response:
    """A vm_shutdown (held for approval): -32042 when the session says URL elicitation, else the plain result."""
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "vm_shutdown", "arguments": {"vmid": 100, "timeout": next(_timeouts)}},
    }
    r = http.post(api.env.url, json=call, headers=_headers(api.agent(sub), session_id))
    assert r.status_code == 200, (r.status_code, r.text)
    return r


def _elicited(r: httpx.Response) -> bool:
    doc: dict[str, Any] = r.json()
    if "error" in doc:
        assert doc["error"]["code"] == URL_ELICITATION_REQUIRED, doc
        return True
    assert doc["result"]["isError"] is True and "approval" in doc["result"]["structuredContent"], doc
    return False  # the plain pending result: no session honoured


def _decodings(text: str) -> Iterator[bytes]:
    """Every base64 (either alphabet) or hex decoding of the id and of each of its dot-separated parts."""
    for part in {text, *text.split(".")}:
        for decode in (base64.urlsafe_b64decode, base64.b64decode):
            try:
                yield decode(part + "=" * (-len(part) % 4))
            except (ValueError, binascii.Error):
                pass
        try:
            yield bytes.fromhex(part)
        except ValueError:
            pass


def test_s51_session_id_shows_no_identity(api: Api, agw: GatewayThread, http: httpx.Client) -> None:
    sid = _session(http, api, OWNER)
    needles = (OWNER.encode(), ISSUER.encode())
    assert OWNER not in sid and ISSUER not in sid
    for decoded in _decodings(sid):
        assert not any(n in decoded for n in needles), decoded
        assert b'"exp"' not in decoded and VERSION.encode() not in decoded, decoded
    assert sid != _session(http, api, OWNER)  # no two alike: nothing to correlate sessions by


def test_s51_own_session_elicits_another_principals_grants_nothing(
    api: Api, agw: GatewayThread, http: httpx.Client
) -> None:
    sid = _session(http, api, OWNER)
    assert _elicited(_shutdown(http, api, OWNER, sid))  # the id works for its owner
    assert not _elicited(_shutdown(http, api, OTHER, sid))  # and for no one else


def test_s51_tampered_session_id_is_refused(api: Api, agw: GatewayThread, http: httpx.Client) -> None:
    sid = _session(http, api, OWNER)
    flips = [sid[:i] + ("A" if sid[i] != "A" else "B") + sid[i + 1 :] for i in (0, len(sid) // 2, len(sid) - 2)]
    for bad in (*flips, sid[:-4], sid + "AAAA", "x", "a.b", "%%%%%%%%"):
        assert not _elicited(_shutdown(http, api, OWNER, bad)), bad


def test_s51_session_id_issued_before_the_upgrade_is_no_session(
    api: Api, agw: GatewayThread, http: httpx.Client
) -> None:
    """An id as the old code minted it (signed, readable, same key) still presented by a client."""
    key = asyncio.run(state_key(api.env.config))  # the key the gateway reads: the database's row
    old = Sealer(key).seal(
        "pvegate/session/v1",
        {"p": f"{ISSUER}\x1f{OWNER}", "v": VERSION, "eu": True, "exp": time.time() + 3600, "n": "00" * 8},
    )
    assert not _elicited(_shutdown(http, api, OWNER, old))


def test_s51_any_replica_reads_a_session_id_and_another_key_does_not() -> None:
    """Stateless across replicas: the same state key decrypts it, a rotated key gives no session."""
    key = b"k" * 64
    owner = Principal(sub=OWNER, iss=ISSUER, roles=(), groups=(), scopes=(), client_id=None, kind="agent")
    sid = Sessions(Sealer(key)).mint(owner, VERSION, True)
    assert Sessions(Sealer(key)).url_elicitation(sid, owner)  # another replica, same key
    assert not Sessions(Sealer(b"r" * 64)).url_elicitation(sid, owner)  # after a rotation
