"""A vote's or withdrawal's note is text for people: control characters (tab and line breaks excepted) are
refused with a 400 at the admin API, on SQLite and on a real PostgreSQL alike. A NUL was stored by SQLite
(and made the installation unmovable to PostgreSQL) and raised a raw driver error on PostgreSQL (an internal
error, 500). A value PostgreSQL refuses anywhere else (SQLSTATE class 22: a NUL in an id from the path) is
a 400 naming it, never an internal error. Real gateway, real OPA, real simulator."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv, make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.store.audit_seal import HeadKey
from tests.approvals.conftest import Api, write_policy_data
from tests.approvals.test_flow import pending, shutdown_args
from tests.pgserver import PostgresServer
from tests.store.auditstore import new_pg_database, sign_new_chain
from tests.support import GatewayThread, free_port


@pytest.fixture(scope="module")
def pg_env(asim: Any, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    policy = write_policy_data(tmp_path_factory.mktemp("npolicy"))
    opa = {
        "mode": "managed",
        "policies": [str(REPO_ROOT / "policies" / "pvegate"), str(REPO_ROOT / "policies" / "system"), str(policy)],
    }
    url = asyncio.run(new_pg_database(postgres, "n_"))
    env = make_env(
        tmp_path_factory.mktemp("ngw"),
        {"default": asim},
        port=free_port(),
        opa=opa,
        extra={"storage": {"url": url}, "health": {"cluster_probe_interval": 0}},
    )
    HeadKey.create(env.config.audit_key_path)  # what `pvegate db upgrade` makes once, and signs the chain with
    asyncio.run(sign_new_chain(url, env.config.audit_key_path))
    return env


@pytest.fixture(scope="module")
def pg_api(pg_env: DevEnv) -> Iterator[Api]:
    gw = GatewayThread(pg_env.config).start()
    yield Api(pg_env)
    gw.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def napi(request: pytest.FixtureRequest) -> Api:
    if request.param == "sqlite":
        return request.getfixturevalue("api")  # the package's approvals gateway (SQLite)
    return request.getfixturevalue("pg_api")


async def test_a_note_with_control_characters_is_refused_and_changes_nothing(napi: Api) -> None:
    aid, _ = await pending(napi, "vm_shutdown", shutdown_args())
    lead = napi.human("note-lead", ["sre-leads"])
    for note in ("ok\x00note", "bell\x07", "esc \x1b[31mred", "del\x7f"):
        r = await napi.admin("POST", f"/admin/approvals/{aid}/deny", lead, {"note": note})
        assert r.status_code == 400 and "control characters" in r.json()["detail"], (repr(note), r.text)
        r = await napi.admin("POST", f"/admin/approvals/{aid}/withdraw", napi.admin_token, {"note": note})
        assert r.status_code == 400 and "control characters" in r.json()["detail"], (repr(note), r.text)
    r = await napi.admin("GET", f"/admin/approvals/{aid}", napi.admin_token)
    assert r.status_code == 200 and r.json()["state"] == "pending", r.text  # no vote, no withdrawal
    # tab and line breaks (a browser's textarea sends CRLF) are text
    r = await napi.admin("POST", f"/admin/approvals/{aid}/deny", lead, {"note": "line one\r\nline two\tend"})
    assert r.status_code == 200 and r.json()["state"] == "denied", r.text


async def test_an_id_the_database_cannot_hold_is_a_400_not_an_internal_error(napi: Api) -> None:
    lead = napi.human("note-lead", ["sre-leads"])
    for method, path, token in (
        ("GET", "/admin/approvals/a%00b", napi.admin_token),
        ("POST", "/admin/approvals/a%00b/approve", lead),
        ("POST", "/admin/approvals/a%00b/withdraw", napi.admin_token),
    ):
        r = await napi.admin(method, path, token, {} if method == "POST" else None)
        assert r.status_code in (400, 404), (path, r.status_code, r.text)  # SQLite holds a NUL: no such request
        assert "internal" not in r.text, r.text
        if napi.env.config.storage.postgresql:
            assert r.status_code == 400 and r.json()["error"] == "invalid_request", r.text
            assert "the database refuses a value of this request" in r.json()["detail"], r.text
