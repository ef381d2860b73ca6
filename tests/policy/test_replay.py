"""`pvegate policy replay` on decisions recorded from live calls through the real gateway.

A few hundred calls (varied principals and tools) are recorded by a gateway running a copy of
the shipped policies; then a candidate changes the data (an incident waiver for operators) or
the Rego (a new deny rule), and the replay report must list exactly the decisions that change.
The expected set is computed without the replay code: each recorded input is put to a
separately started candidate OPA one request at a time, and its answer is read by the
contract's rules written out here; the known principals and tools bound it from the other side.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.core.canonical import digest_json
from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv, make_env
from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar
from gateway.store.audit import unpack_input, verify
from gateway.store.replay import Candidate, ReplayError
from tests.support import GatewayThread, free_port

# principal -> (roles, groups, kind)
PRINCIPALS: dict[str, tuple[list[str], list[str], str]] = {
    "rp-ops-a": (["operator"], [], "agent"),
    "rp-ops-b": (["operator"], [], "agent"),
    "rp-viewer": (["viewer"], [], "agent"),
    "rp-web": ([], ["team-web"], "agent"),
    "rp-admin": ([], ["pve-admins"], "human"),
    "rp-auditor": (["auditor"], [], "service"),
}
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("list_nodes", {}),
    ("get_guest_status", {"vmid": 100}),
    ("get_guest_status", {"vmid": 103}),
    ("vm_reboot", {"vmid": 100}),
    ("vm_reboot", {"vmid": 103}),
    ("lxc_reboot", {"vmid": 201}),
    ("snapshot_create", {"vmid": 103, "snapname": "rp"}),
    ("get_node_network", {"node": "pve1"}),
]
# the test tree's approval rule: rebooting prod guests needs an approval (whatever the hour)
PROD_POWER_RULE = """    - name: prod-power-needs-approval
      tools: [vm_reboot, lxc_reboot]
      target_tags: [prod]
      reason: rebooting a production guest needs an approval
"""


def _tree(dst: Path) -> Path:
    shutil.copytree(REPO_ROOT / "policies", dst)
    data = dst / "data" / "data.yaml"
    text = data.read_text()
    assert "  rules:\n" in text and "      active: false\n" in text
    data.write_text(text.replace("  rules:\n", "  rules:\n" + PROD_POWER_RULE, 1))
    return dst


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevEnv, Path]]:
    from gateway.sim.harness import start_simulator

    work = tmp_path_factory.mktemp("replay")
    sim = start_simulator("small", work / "sim")
    tree = _tree(work / "baseline")
    env = make_env(work / "gw", {"default": sim}, port=free_port(), opa={"policies": [str(tree)]})
    gw = GatewayThread(env.config).start()
    try:
        import asyncio

        asyncio.run(_record(env))
    finally:
        gw.stop()
        sim.stop()
    yield env, tree


async def _record(env: DevEnv) -> None:
    url = f"https://127.0.0.1:{env.config.port}/mcp"
    for sub, (roles, groups, kind) in PRINCIPALS.items():
        token = env.token(sub, roles, groups=groups, kind=kind)
        async with mcp_client(url, token, env.ca_file) as client:
            for _ in range(6):  # 6 principals x 6 rounds x 8 calls = 288 calls (quotas kick in too)
                for tool, args in CALLS:
                    await client.call_tool(tool, args)


def _decisions(db: Path) -> list[dict[str, Any]]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        sql = "SELECT * FROM audit WHERE kind = 'decision' AND principal LIKE 'rp-%' ORDER BY seq"
        return [dict(r) for r in con.execute(sql)]
    finally:
        con.close()


def _outcome(result: dict[str, Any]) -> str:
    """The contract's reading of a decision document (docs/policy-contract.md), written out independently."""
    appr = result.get("approval") or {}
    unmet = bool(appr.get("required")) and not appr.get("satisfied")
    if result["allow"] and not result["deny"] and not unmet:
        return "allow"
    return "approval" if not result["deny"] and unmet else "deny"


def _expected(rows: list[dict[str, Any]], candidate: Path) -> dict[str, set[str]]:
    """request_id -> change kinds, asking a separate candidate OPA one recorded input at a time."""
    recorded_as = {"allow": "allow", "pending": "approval", "deny": "deny"}
    opa = OPASidecar(policies=(candidate,))
    opa.start()
    out: dict[str, set[str]] = {}
    try:
        with opa.client(timeout=30) as c:
            for row in rows:
                body = json.loads(row["body"])
                doc = unpack_input(body)
                assert doc is not None
                result = c.post("/v1/data/pvegate/decision", json={"input": doc}).json()["result"]
                kinds = set()
                before = recorded_as[row["outcome"]]
                if _outcome(result) != before:
                    kinds.add(f"{before}-to-{_outcome(result)}")
                if result["risk"]["level"] != body["risk"]["level"]:
                    kinds.add("risk")
                if result["obligations"] != body["obligations"]:
                    kinds.add("obligations")
                if kinds:
                    out[row["request_id"]] = kinds
    finally:
        opa.stop()
    return out


def _replay(env: DevEnv, candidate: Path, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "report.json"
    db = str(env.config.audit_path)
    args = ["policy", "replay", "--db", db, "--principal", "rp-*", "--policies", str(candidate), "--format", "json"]
    rc = main([*args, "-o", str(out), *extra])
    return rc, json.loads(out.read_text())


def test_decisions_keep_their_complete_input(recorded: tuple[DevEnv, Path]) -> None:
    env, _ = recorded
    rows = _decisions(env.config.audit_path)
    assert len(rows) >= 250
    assert {r["principal"] for r in rows} == set(PRINCIPALS)
    assert {r["outcome"] for r in rows} == {"allow", "pending", "deny"}
    for row in rows:
        body = json.loads(row["body"])
        doc = unpack_input(body)
        assert doc is not None and body["input_redacted"] == []
        # the kept input is the very document OPA decided on: its digest is the recorded one
        assert digest_json(doc) == body["input_digest"]
        assert (
            doc["principal"]["sub"] == row["principal"] and doc["principal"]["kind"] == PRINCIPALS[row["principal"]][2]
        )
        assert set(doc["usage"]) == {"all", "tool"}
    assert verify(env.config.audit_path).ok  # the packed inputs are inside the hash chain


def test_replay_lists_exactly_what_an_incident_waiver_changes(recorded: tuple[DevEnv, Path], tmp_path: Path) -> None:
    env, tree = recorded
    cand = tmp_path / "candidate"
    shutil.copytree(tree, cand)
    data = cand / "data" / "data.yaml"
    data.write_text(data.read_text().replace("      active: false\n", "      active: true\n", 1))
    rows = _decisions(env.config.audit_path)
    expected = _expected(rows, cand)
    # from the principals' side: only operators' held calls change, and some do
    assert expected
    ops = {r["request_id"] for r in rows if r["principal"].startswith("rp-ops-")}
    pending = {r["request_id"] for r in rows if r["outcome"] == "pending"}
    assert set(expected) <= ops & pending
    assert all(k <= {"approval-to-allow", "approval-to-deny"} for k in expected.values())

    rc, report = _replay(env, cand, tmp_path, "--fail-on", "approval-waived")
    got = {c["request_id"]: set(c["kinds"]) for c in report["changes"]}
    assert got == expected
    assert report["replayed"] == len(rows) and report["skipped"] == {"no_input": 0, "failed_closed": 0}
    assert rc == 1 and report["failed"] and report["failing"] == len(expected)
    assert {(g["tool"], g["principal"]) for g in report["groups"]} == {
        (c["tool"], c["principal"]) for c in report["changes"]
    }
    assert sum(g["count"] for g in report["groups"]) == len(expected)
    # the CI gate on allow<->deny passes: the waiver opens no denied call and closes no allowed one
    rc, _ = _replay(env, cand, tmp_path, "--fail-on", "allow-to-deny,deny-to-allow")
    assert rc == 0


def test_replay_lists_exactly_what_a_rego_change_changes(recorded: tuple[DevEnv, Path], tmp_path: Path) -> None:
    env, tree = recorded
    cand = tmp_path / "candidate"
    shutil.copytree(tree, cand)
    rego = cand / "pvegate" / "guardrails" / "guardrails.rego"
    rego.write_text(
        rego.read_text()
        + '\ndenials contains lib.reason("guardrail.status_reads", "test", "agents may not read guest status") if {\n'
        + '\tinput.principal.kind == "agent"\n\tinput.tool.name == "get_guest_status"\n}\n'
    )
    rows = _decisions(env.config.audit_path)
    expected = _expected(rows, cand)
    agents_reading = {
        r["request_id"]
        for r in rows
        if r["tool"] == "get_guest_status" and PRINCIPALS[r["principal"]][2] == "agent" and r["outcome"] != "deny"
    }
    assert agents_reading and set(expected) == agents_reading
    rc, report = _replay(env, cand, tmp_path, "--fail-on", "allow-to-deny")
    assert {c["request_id"]: set(c["kinds"]) for c in report["changes"]} == expected
    assert rc == 1 and all("guardrail.status_reads" in c["after"]["deny_codes"] for c in report["changes"])
    # the Markdown and text reports carry the same groups
    md = tmp_path / "report.md"
    db = str(env.config.audit_path)
    main(["policy", "replay", "--db", db, "--principal", "rp-*", "--policies", str(cand), "--format", "markdown",
          "-o", str(md)])  # fmt: skip
    text = md.read_text()
    assert "| `get_guest_status` | `rp-ops-a` |" in text and "allow-to-deny" in text


def test_unchanged_candidate_changes_nothing(recorded: tuple[DevEnv, Path], tmp_path: Path) -> None:
    env, tree = recorded
    rc, report = _replay(env, tree, tmp_path, "--fail-on", "any", "--engine", "eval")
    assert rc == 0 and report["changed"] == 0 and report["replayed"] >= 250


def test_a_verification_key_without_a_bundle_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The candidate would be the unverified policy directory: refused before anything is read."""
    args = ["policy", "replay", "--db", str(tmp_path / "none.db"), "--policies", str(REPO_ROOT / "policies")]
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--verification-key", str(tmp_path / "k.pem")])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert not out and "error: --verification-key needs --bundle" in err
    with pytest.raises(ReplayError, match="needs a bundle"):  # and the library refuses it as well
        Candidate(policies=(REPO_ROOT / "policies",), verification_key=tmp_path / "k.pem")
