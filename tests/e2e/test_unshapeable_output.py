"""A call whose output cannot be shaped for the reply (output a node or a guest chose, which
breaks a shaping step) still ends with its result in the audit: it ran, so the audit says so,
and the client gets a clear tool error instead of an internal one. Before, the exception left
the call with a dispatch record and no result (a restart then called it interrupted)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway import pipeline
from gateway.dev.devenv import DevEnv
from tests.connectors.test_provision_e2e import admin, call, text
from tests.support import GatewayThread, audit_rows


async def test_output_that_breaks_shaping_is_a_recorded_result(
    gateway: GatewayThread, env: DevEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    def breaks(*_: Any) -> Any:  # what nesting without end did to drop_sensitive
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(pipeline, "shape", breaks)
    res = await call(env, admin(env), "list_nodes", {})
    assert res.is_error
    assert text(res) == "list_nodes: it ran, but its output could not be shaped for the reply (RecursionError)"
    rows = audit_rows(env.config.audit_path, res.meta["pvegate/request_id"])
    result = rows[-1]
    assert (result["kind"], result["outcome"]) == ("result", "ok"), rows
    assert "could not be shaped" in json.loads(result["body"])["error"]
