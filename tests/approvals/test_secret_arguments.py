"""Sensitive arguments are redacted by key in the audit, whatever their length or type.

Value scrubbing skips strings under 6 characters (they would blank ordinary words),
so a short password or a numeric PIN is only safe because its *key* is declared
sensitive. Planted in review and not caught before: redaction by key only for long
strings. Checked in the `received` record and in a pending approval's stored
arguments, by searching the raw database files for the secrets.

The shipped catalog has no tool with a sensitive argument, so this gateway loads the
repo's connectors plus one test tool that declares two.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gateway.dev.devenv import DevEnv, make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from tests.approvals.conftest import APPROVAL_RULES, Api, outcome
from tests.support import GatewayThread, audit_rows, database_bytes, free_port

PASSWORD = "Zq9!x"  # 5 characters: below the value scrubber's minimum
PIN = 9081726354  # not a string at all

TEST_TOOL = {
    "tools": [
        {
            "name": "guest_set_test_secret",
            "title": "Set a guest secret (test tool)",
            "description": "Sets the cloud-init password of a guest. Test fixture with sensitive arguments.",
            "domain": "guest",
            "effect": "write",
            "scope": "guest",
            "tags": ["config"],
            "params": {
                "vmid": "required",
                "node": "optional",
                "cipassword": {"type": "string", "maxLength": 64, "description": "The new password."},
                "pin": {"type": "integer", "minimum": 0, "maximum": 99999999999, "description": "A numeric secret."},
            },
            "sensitive": ["cipassword", "pin"],
            "target": {"vmid": "vmid", "node": "node"},
            "pve_api": {
                "method": "PUT",
                "path": "/nodes/{node}/{type}/{vmid}/config",
                "locate": "vmid",
                "body": {"cipassword": "cipassword"},
            },
            "dry_run": "Set the cloud-init password of {type} guest {vmid} on node {node}.",
        }
    ]
}


@pytest.fixture(scope="module")
def senv(asim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    root = tmp_path_factory.mktemp("secretargs")
    connectors = root / "connectors"
    shutil.copytree(REPO_ROOT / "connectors", connectors)
    (connectors / "zz_test_secret.yaml").write_text(yaml.safe_dump(TEST_TOOL, sort_keys=False))
    data = yaml.safe_load((REPO_ROOT / "policies" / "data" / "data.yaml").read_text())
    data["approval"]["required_from_level"] = "critical"
    rule = {
        "name": "test-secret-on-prod",
        "tools": ["guest_set_test_secret"],
        "target_tags": ["prod"],
        "reason": "setting a secret on prod needs an SRE lead",
        "approver_groups": ["sre-leads"],
    }
    data["approval"]["rules"] = [*APPROVAL_RULES, rule]
    data["quotas"] = [{"name": "generous", "counter": "all", "window": "1m", "limit": 100000}]
    (root / "policy" / "data").mkdir(parents=True)
    (root / "policy" / "data" / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    opa = {
        "mode": "managed",
        "policies": [
            str(REPO_ROOT / "policies" / "pvegate"),
            str(REPO_ROOT / "policies" / "system"),
            str(root / "policy"),
        ],
    }
    return make_env(
        root / "gw", {"default": asim}, port=free_port(), opa=opa, extra={"connectors_dir": str(connectors)}
    )


@pytest.fixture(scope="module")
def sgw(senv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(senv.config).start()
    yield gw
    gw.stop()


def raw_database(env: DevEnv) -> bytes:
    return database_bytes(env.config.audit_path)


def assert_no_secret(env: DevEnv) -> None:
    raw = raw_database(env)
    for secret in (PASSWORD, str(PIN)):
        assert secret.encode() not in raw, f"{secret!r} is in the audit database"


async def test_short_and_numeric_secrets_are_redacted_in_a_pending_approval(sgw: GatewayThread, senv: DevEnv) -> None:
    api = Api(senv)
    args = {"vmid": 100, "cipassword": PASSWORD, "pin": PIN}  # vm 100 is tagged prod: approval needed
    res = await api.call(api.agent(), "guest_set_test_secret", args)
    assert outcome(res) == "pending_approval", res
    aid = res["structuredContent"]["approval"]["id"]
    con = sqlite3.connect(senv.config.audit_path)
    try:
        stored = json.loads(con.execute("SELECT arguments FROM approval_requests WHERE id = ?", (aid,)).fetchone()[0])
    finally:
        con.close()
    assert stored == {"vmid": 100, "cipassword": "[redacted]", "pin": "[redacted]"}, stored
    received = [
        r for r in audit_rows(senv.config.audit_path, res["_meta"]["pvegate/request_id"]) if r["kind"] == "received"
    ]
    assert json.loads(received[0]["body"])["arguments"] == stored
    shown = await api.admin("GET", f"/admin/approvals/{aid}", api.admin_token)  # what an approver is shown
    assert PASSWORD not in shown.text and str(PIN) not in shown.text
    assert_no_secret(senv)


async def test_short_and_numeric_secrets_are_redacted_in_an_allowed_call(
    sgw: GatewayThread, senv: DevEnv, asim: Any
) -> None:
    api = Api(senv)
    res = await api.call(api.agent(), "guest_set_test_secret", {"vmid": 103, "cipassword": PASSWORD, "pin": PIN})
    assert outcome(res) in ("allowed", "failed"), res  # decided and dispatched (vm 103 is dev)
    rows = audit_rows(senv.config.audit_path, res["_meta"]["pvegate/request_id"])
    received = json.loads(next(r for r in rows if r["kind"] == "received")["body"])
    assert received["arguments"]["cipassword"] == "[redacted]" and received["arguments"]["pin"] == "[redacted]"
    assert_no_secret(senv)
    assert PASSWORD not in json.dumps(res)
