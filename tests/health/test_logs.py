"""Structured logs: one JSON object per line carrying the request id, principal, tool and outcome,
joining the audit and OPA's decision log; tracebacks stay in the log, with the request id."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.core.config import ConfigError, load
from gateway.observability.logs import JsonFormatter, TextFormatter, bind
from tests.health.conftest import base_url, health_env, http_client, serving
from tests.resilience.helpers import call, request_id, result_of
from tests.support import GatewayThread, audit_rows

ROOT = Path(__file__).resolve().parents[2]


def _record(msg: str, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("kaput")
        except RuntimeError:
            exc_info = sys.exc_info()
    return logging.LogRecord("pvegate.test", logging.ERROR, __file__, 1, msg, None, exc_info)


def test_formatters_carry_the_bound_request() -> None:
    async def in_a_request() -> tuple[str, str]:
        bind("req-123", "agent-7", "vm_stop")
        rec = _record("it broke", exc=True)
        return JsonFormatter().format(rec), TextFormatter().format(rec)

    as_json, as_text = asyncio.run(in_a_request())
    assert "\n" not in as_json  # the traceback is a field of the one object
    doc = json.loads(as_json)
    assert doc["request_id"] == "req-123" and doc["principal"] == "agent-7" and doc["tool"] == "vm_stop"
    assert doc["level"] == "error" and doc["msg"] == "it broke" and "RuntimeError: kaput" in doc["exc"]
    assert as_text.startswith("ERROR pvegate.test: it broke [request req-123]\nTraceback")
    outside = json.loads(JsonFormatter().format(_record("idle")))  # no request bound here
    assert "request_id" not in outside


FORGED = "INFO pvegate.calls: tools/call vm_stop by admin: allowed"


def test_text_log_lines_cannot_be_forged_by_client_text() -> None:
    """A tool name is the client's: its controls are escaped and its length bounded in the line."""
    tool = f"x\n{FORGED}\r\x1b[2J\x85\u2028\u202e\x00\tend"
    msg = "tools/call %s by %s: %s"
    rec = logging.LogRecord("pvegate.calls", logging.INFO, __file__, 1, msg, (tool, "a", "b"), None)
    text = TextFormatter().format(rec)
    assert text.splitlines() == [text]  # str.splitlines knows every line break, \x85 and \u2028 included
    assert text == (f"INFO pvegate.calls: tools/call x\\n{FORGED}\\r\\x1b[2J\\x85\\u2028\\u202e\\x00\\tend by a: b")
    line = JsonFormatter().format(rec)
    assert json.loads(line)["msg"] == f"tools/call {tool} by a: b"  # JSON: as it was
    assert line.splitlines() == [line]  # \x85 and U+2028 escaped too (json.dumps leaves them raw)

    huge = TextFormatter().format(_record("y" * 100_000))
    assert len(huge) < 8300 and huge.endswith(f"... [cut {100_000 - 8192} characters]")
    assert TextFormatter().format(_record("z" * 8192)) == "ERROR pvegate.test: " + "z" * 8192  # at the bound: whole

    async def bound() -> str:
        bind("req\nERROR forged", "p", "t")
        return TextFormatter().format(_record("msg", exc=True))

    with_exc = asyncio.run(bound())  # the traceback still follows on lines of its own
    assert with_exc.startswith("ERROR pvegate.test: msg [request req\\nERROR forged]\nTraceback")


async def test_a_forged_tool_name_stays_on_its_line_in_the_served_log(hsim: Any, tmp_path: Path) -> None:
    env = health_env(tmp_path, hsim, log_format="text")
    stderr = tmp_path / "serve.log"
    async with serving(env, stderr) as (http, base):
        r = await call(http, base + "/mcp", env.token("forger", ["operator"]), f"nope\n{FORGED}\r\n" + "w" * 20_000)
        assert r.status_code in (200, 400), r.text
    lines = stderr.read_text().splitlines()
    assert not [ln for ln in lines if ln.startswith(FORGED)]
    (line,) = [ln for ln in lines if ln.startswith("INFO pvegate.calls: tools/call nope")]
    # escaped, and bounded: an unknown tool's name is cut where it is taken (…[N characters])
    assert f"nope\\n{FORGED}\\r\\n" in line and f"[{len(FORGED) + 20_007} characters]" in line
    assert len(line) < 1000, len(line)


def test_log_format_is_checked(tmp_path: Path, hsim: Any) -> None:
    env = health_env(tmp_path, hsim, log_format="json")
    assert env.config.log_format == "json"
    raw = yaml.safe_load(env.config_path.read_text())
    raw["log_format"] = "xml"
    env.config_path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="log_format: expected one of text, json, got 'xml'"):
        load(env.config_path)


async def test_json_log_lines_join_audit_and_opa_decision_log(hsim: Any, tmp_path: Path) -> None:
    env = health_env(tmp_path, hsim, log_format="json", opa={"mode": "managed", "decision_logs": True})
    stderr = tmp_path / "serve.log"
    async with serving(env, stderr) as (http, base):
        res = result_of(await call(http, base + "/mcp", env.token("log-joiner", ["operator"]), "list_nodes"))
        rid = request_id(res)

    lines = [ln for ln in stderr.read_text().splitlines() if ln.strip()]
    docs = [json.loads(ln) for ln in lines]  # every line is one JSON object
    (done,) = [d for d in docs if d.get("event") == "call" and d.get("request_id") == rid]
    assert done["principal"] == "log-joiner" and done["tool"] == "list_nodes" and done["outcome"] == "allowed"
    assert done["logger"] == "pvegate.calls" and done["duration_ms"] > 0
    assert {r["kind"] for r in audit_rows(env.config.audit_path, rid)} >= {"received", "decision", "result"}
    opa_log = env.config.state_dir / "opa.log"
    entries = [json.loads(ln) for ln in opa_log.read_text().splitlines() if rid in ln]
    assert any(e.get("input", {}).get("request", {}).get("id") == rid for e in entries), "OPA logged no such request"


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("pvegate")
    logger.addHandler(handler)
    yield buf
    logger.removeHandler(handler)


class _Broken:
    """A connector runtime with a bug (fault injection: nothing else makes the gateway fail unexpectedly)."""

    def check(self, *args: Any) -> None:
        return None

    async def call(self, *args: Any) -> Any:
        raise RuntimeError("bug with internal detail /srv/secret-path")

    async def close(self) -> None:
        return None


async def test_a_bug_is_logged_with_its_request_id_never_shown(
    hsim: Any, tmp_path: Path, captured: io.StringIO
) -> None:
    env = health_env(tmp_path, hsim)
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    try:
        gw.components.runtimes["pve_api"] = _Broken()  # type: ignore[assignment]
        async with http_client(env) as http:
            r = await call(http, base + "/mcp", env.token("bug-finder", ["operator"]), "list_nodes")
            assert r.status_code == 200
            error = r.json()["error"]
            assert "Traceback" not in r.text and "secret-path" not in r.text
            rid = error["message"].removeprefix("Internal error (request ").removesuffix(")")
            assert len(rid) == 32, error

            # outside tools/call: the ASGI error boundary
            def boom() -> Any:
                raise RuntimeError("readiness bug /srv/secret-path")

            assert gw.components.health is not None
            gw.components.health.readiness = boom  # type: ignore[method-assign]
            r2 = await http.get(base + "/readyz")
            assert r2.status_code == 500 and "Traceback" not in r2.text and "secret-path" not in r2.text
            rid2 = r2.json()["request_id"]
    finally:
        gw.stop()
    docs = [json.loads(ln) for ln in captured.getvalue().splitlines() if ln.strip()]
    (bug,) = [d for d in docs if d.get("request_id") == rid and "exc" in d]
    assert bug["principal"] == "bug-finder" and bug["tool"] == "list_nodes"
    assert "RuntimeError: bug with internal detail" in bug["exc"]
    (bug2,) = [d for d in docs if d.get("request_id") == rid2 and "exc" in d]
    assert "GET /readyz" in bug2["msg"] and "readiness bug" in bug2["exc"]
