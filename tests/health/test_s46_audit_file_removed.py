"""The SQLite audit file removed or replaced under a running gateway: readiness said ready.

The gateway's open connection keeps writing into the removed file's inode (or into the old file,
while another one sits at audit.path): every commit succeeds, readiness stayed green, and every
record written from then on is out of reach of `pvegate audit verify` and lost at the next start.
Now /readyz turns red at the next audit probe and says why, without the file's path; a file put
back (the same one) turns it green again. A real gateway, a real OPA and the simulator.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.health.conftest import base_url, health_env, http_client, wait_for
from tests.resilience.helpers import call, result_of
from tests.support import GatewayThread, audit_rows


def _ready(r: Any) -> bool:
    return bool(r.status_code == 200)


def _unready(r: Any) -> bool:
    return bool(r.status_code == 503)


async def test_a_removed_audit_file_turns_readiness_red_until_it_is_back(hsim: Any, tmp_path: Path) -> None:
    store = tmp_path / "store"
    env = health_env(tmp_path / "gw", hsim, audit={"path": str(store / "audit.db")})
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    db, aside = store / "audit.db", store / "audit.db.aside"
    try:
        async with http_client(env) as http:
            await wait_for(http, base + "/readyz", _ready)
            db.rename(aside)  # as `rm` would, but it can be put back
            try:
                red, _ = await wait_for(http, base + "/readyz", _unready, timeout=10)
                reasons = red.json()["reasons"]
                assert reasons == ["audit: the audit database file is gone from audit.path (removed or renamed)"], (
                    reasons
                )
                assert str(store) not in red.text  # /readyz takes no credential
                assert not red.json()["checks"]["audit"]["ok"] and red.json()["checks"]["opa"]["ok"]
                metrics_token = env.config.admin.token.read()  # type: ignore[union-attr]
                scrape = await http.get(base + "/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
                assert "pvegate_ready 0" in scrape.text
            finally:
                aside.rename(db)
            await wait_for(http, base + "/readyz", _ready, timeout=10)
    finally:
        gw.stop()


async def test_a_replaced_audit_file_turns_readiness_red(hsim: Any, tmp_path: Path) -> None:
    store = tmp_path / "store"
    env = health_env(tmp_path / "gw", hsim, audit={"path": str(store / "audit.db")})
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    db = store / "audit.db"
    try:
        async with http_client(env) as http:
            await wait_for(http, base + "/readyz", _ready)
            # a copy restored over it: the gateway keeps writing into the old, unlinked file
            shutil.copyfile(db, store / "copy.db")
            (store / "copy.db").replace(db)
            red, _ = await wait_for(http, base + "/readyz", _unready, timeout=10)
            reasons = red.json()["reasons"]
            assert reasons == ["audit: the audit database file at audit.path is not the one this gateway writes"], (
                reasons
            )
    finally:
        gw.stop()


async def test_calls_are_refused_while_the_audit_file_is_gone(hsim: Any, tmp_path: Path) -> None:
    """Not only readiness: a call decided now would have its records committed into a file nobody reads,
    so it is refused (the audit store cannot take writes), and nothing reaches the unlinked file."""
    store = tmp_path / "store"
    env = health_env(tmp_path / "gw", hsim, audit={"path": str(store / "audit.db")})
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    db, aside = store / "audit.db", store / "audit.db.aside"
    token = env.token("file-watcher", ["operator"])
    try:
        async with http_client(env) as http:
            await wait_for(http, base + "/readyz", _ready)
            assert not result_of(await call(http, base + "/mcp", token, "list_nodes")).get("isError")
            before = len(audit_rows(db))
            db.rename(aside)
            try:
                r = await call(http, base + "/mcp", token, "list_nodes")
                assert r.status_code == 503, r.text
                assert "audit store cannot take writes" in r.text and str(store) not in r.text
            finally:
                aside.rename(db)
            assert len(audit_rows(db)) == before  # the refused call wrote nothing where no one would read it
            await wait_for(http, base + "/readyz", _ready, timeout=10)  # the store's failure held a moment
            assert not result_of(await call(http, base + "/mcp", token, "list_nodes")).get("isError")
    finally:
        gw.stop()
