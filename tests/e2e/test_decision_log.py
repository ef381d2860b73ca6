"""With opa.decision_logs on, OPA logs each decision under the id the audit keeps, arguments masked."""

from __future__ import annotations

import dataclasses
import json
import secrets
import time

from gateway.core.config import OPAConfig
from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv
from tests.support import GatewayThread, audit_rows, free_port


async def test_decision_log_correlates_and_masks_arguments(env: DevEnv) -> None:
    cfg = dataclasses.replace(
        env.config,
        port=free_port(),
        opa=OPAConfig(mode="managed", decision_logs=True),
        audit_path=env.config.audit_path.with_name("audit-decision-log.db"),
        state_dir=env.config.state_dir.with_name("state-decision-log"),
    )
    marker = f"mask_{secrets.token_hex(6)}"
    gw = GatewayThread(cfg).start()
    try:
        url = f"https://127.0.0.1:{cfg.port}/mcp"
        async with mcp_client(url, env.token("decision-log-viewer", ["viewer"]), env.ca_file) as client:
            res = await client.call_tool("snapshot_create", {"vmid": 100, "snapname": marker})
        assert res.is_error  # a viewer may not; the decision is logged all the same
        request_id = str((res.meta or {})["pvegate/request_id"])
        rows = audit_rows(cfg.audit_path, request_id)
        decision = json.loads(next(r for r in rows if r["kind"] == "decision")["body"])
        assert decision["decision_id"]
        log_file = cfg.state_dir / "opa.log"
        deadline = time.monotonic() + 10
        entry = None
        while entry is None and time.monotonic() < deadline:  # OPA writes its log line after answering
            for line in log_file.read_text().splitlines():
                if decision["decision_id"] in line:
                    entry = json.loads(line)
            time.sleep(0.05)
        assert entry is not None, "OPA logged no decision under the audited decision_id"
        assert entry["erased"] == ["/input/arguments"] and "arguments" not in entry["input"]
        assert entry["input"]["tool"]["name"] == "snapshot_create"
        assert marker not in log_file.read_text()
    finally:
        gw.stop()
