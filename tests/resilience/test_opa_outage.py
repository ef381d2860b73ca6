"""OPA killed while calls are flowing: every call in the outage is denied with a
clear reason and audited, none runs without a decision, and traffic recovers by
itself once the supervisor has restarted the sidecar."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from gateway.dev.devenv import DevEnv
from tests.resilience.helpers import (
    call,
    client,
    decisions_by_request,
    fresh_config,
    request_id,
    text_of,
    url_of,
)
from tests.support import GatewayThread, audit_rows

WORKERS = 6


async def test_opa_killed_under_load_denies_audits_and_recovers(renv: DevEnv, rsim: Any) -> None:
    cfg = fresh_config(renv, "opa-kill")
    gw = GatewayThread(cfg).start()
    url = url_of(cfg)
    tokens = [renv.token(f"opa-kill-{i}", ["operator"], kind="service") for i in range(40)]
    outcomes: list[tuple[float, int, dict[str, Any] | None]] = []
    stop = asyncio.Event()
    killed_at: float | None = None
    try:
        rsim.clear_logs()

        async def worker(n: int, http: httpx.AsyncClient) -> None:
            i = n
            while not stop.is_set():
                i += WORKERS
                r = await call(http, url, tokens[i % len(tokens)], "list_nodes")
                outcomes.append(
                    (time.monotonic(), r.status_code, r.json().get("result") if r.status_code == 200 else None)
                )

        async with client(renv) as http:
            tasks = [asyncio.create_task(worker(n, http)) for n in range(WORKERS)]
            await asyncio.sleep(1.0)
            sidecar = gw.components.sidecar
            assert sidecar is not None and sidecar.process is not None
            sidecar.process.kill()  # SIGKILL: no goodbye
            killed_at = time.monotonic()
            deadline = killed_at + 30
            while time.monotonic() < deadline:  # run until calls have been allowed again for a while
                await asyncio.sleep(0.25)
                late_ok = [o for o in outcomes if o[0] > killed_at and o[2] and not o[2].get("isError")]
                if sidecar.restarts >= 1 and len(late_ok) >= 20:
                    break
            stop.set()
            await asyncio.gather(*tasks)
    finally:
        gw.stop()

    assert all(status == 200 for _, status, _ in outcomes), {s for _, s, _ in outcomes}
    results = [res for _, _, res in outcomes if res is not None]
    denied = [res for res in results if res.get("isError")]
    allowed = [res for res in results if not res.get("isError")]
    assert denied, "no call landed in the outage window"
    for res in denied:  # the only failure is the fail-closed deny, and it says why
        assert "policy decision unavailable" in text_of(res), text_of(res)
    assert any(t > killed_at and res and not res.get("isError") for t, _, res in outcomes), "traffic did not recover"
    assert gw.components.sidecar is not None and gw.components.sidecar.restarts >= 1

    # every answered call has its decision record; denials are marked failed-closed
    decisions = decisions_by_request(cfg.audit_path)
    for res in denied:
        d = decisions[request_id(res)]
        assert d["outcome"] == "deny" and '"failed_closed":true' in d["body"]
    for res in allowed:
        assert decisions[request_id(res)]["outcome"] == "allow"
    # nothing ran without a decision: Proxmox saw exactly as many reads as were allowed
    reads = [e for e in rsim.requests_log() if e["method"] == "GET" and e["path"].endswith("/nodes")]
    allow_rows = [r for r in audit_rows(cfg.audit_path) if r["kind"] == "decision" and r["outcome"] == "allow"]
    assert len(reads) == len(allow_rows) == len(allowed)
