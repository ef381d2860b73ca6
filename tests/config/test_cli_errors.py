"""The operator's commands on wrong input, a configuration that cannot be loaded, or a database that
cannot be used: one line saying why and a documented exit status, never a traceback nor a hang.

Each runs the real `pvegate` (a subprocess, with a timeout: a hang fails the test, not the suite).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.policy.opa_sidecar import REPO_ROOT
from tests.config.conftest import PVEGATE, minimal, run_pvegate, write
from tests.support import filled_audit

UNREACHABLE_PG = "postgresql://pvegate@127.0.0.1:1/postgres"  # nothing listens on port 1


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PVEGATE_")}


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    """stderr (log lines aside) is exactly one `error: ...` line; that line."""
    lines = [line for line in r.stderr.splitlines() if not line.startswith(("INFO ", "WARNING "))]
    assert "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    """A configuration whose audit database exists (sealed, with its head key), as after a first start."""
    path = write(tmp_path, minimal(tmp_path))
    asyncio.run(filled_audit(tmp_path / "state" / "audit.db"))
    return path


@pytest.fixture
def pg_down(tmp_path: Path) -> Path:
    raw: dict[str, Any] = minimal(tmp_path)
    raw["storage"] = {"url": UNREACHABLE_PG}
    return write(tmp_path, raw, "pg-down.yaml")


# --- 2: console sign-out when the audit cannot be opened -----------------------------------------


def test_console_sign_out_without_the_head_key_says_so_and_exits(cfg: Path) -> None:
    state = cfg.parent / "state"
    for f in ("audit-head.key", "audit-head.key.hwm"):
        (state / f).unlink(missing_ok=True)
    r = run_pvegate("console", "sign-out", "-c", str(cfg), "--sub", "alice", "--force", timeout=30)
    assert r.returncode == 1
    assert "audit head key" in one_error_line(r)


# --- 4: a reader that goes away -----------------------------------------------------------------


@pytest.mark.parametrize(
    "args", [["audit", "tail", "-n", "5"], ["audit", "search"], ["audit", "export", "--jsonl"]], ids=" ".join
)
def test_a_closed_pipe_ends_quietly_with_141(cfg: Path, args: list[str]) -> None:
    r, w = os.pipe()
    os.close(r)  # every write to stdout fails: EPIPE
    try:
        done = subprocess.run(
            [*PVEGATE, *args, "-c", str(cfg)],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            timeout=30,
            cwd=REPO_ROOT,
            env=_env(),
            check=False,
        )
    finally:
        os.close(w)
    assert done.returncode == 141, done.stderr
    assert [line for line in done.stderr.splitlines() if not line.startswith("INFO ")] == []


def test_db_status_into_head_1_ends_quietly(cfg: Path) -> None:
    """`pvegate db status | head -1`: the first line read, the reader gone, the next write fails."""
    proc = subprocess.Popen(
        [*PVEGATE, "db", "status", "-c", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env={**_env(), "PYTHONUNBUFFERED": "1"},  # each line written as printed, as a terminal would get it
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    try:
        err = proc.stderr.read()
        rc = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert first.startswith("database: SQLite")
    assert rc == 141, err
    assert [line for line in err.splitlines() if not line.startswith("INFO ")] == []


# --- 6: approvals --token-file that cannot be read ------------------------------------------------


def test_an_unreadable_token_file_is_a_credential_error(cfg: Path, tmp_path: Path) -> None:
    binary = tmp_path / "binary-token"
    binary.write_bytes(b"\xff\xfe")
    for path, why in ((tmp_path / "missing", "No such file"), (tmp_path, "Is a directory"), (binary, "UTF-8")):
        r = run_pvegate("approvals", "approve", "apr-x", "-c", str(cfg), "--token-file", str(path), timeout=30)
        assert r.returncode == 2, r.stderr
        line = one_error_line(r)
        assert line.startswith(f"error: cannot read --token-file {path}: ") and why in line


# --- 7: approvals on a database that cannot be used -----------------------------------------------


def test_approvals_list_refuses_a_missing_database_and_makes_none(tmp_path: Path) -> None:
    path = write(tmp_path, minimal(tmp_path))
    for args in (["list"], ["show", "apr-x"]):
        r = run_pvegate("approvals", *args, "-c", str(path), timeout=30)
        assert r.returncode == 1, r.stderr
        assert f"no database at {tmp_path / 'state' / 'audit.db'}" in one_error_line(r)
    assert not (tmp_path / "state").exists()  # no database, no head key, no high-water mark made


def test_audit_reconcile_refuses_a_missing_database_and_makes_none(tmp_path: Path) -> None:
    """As `approvals list`: a --config naming a SQLite file that is not there (a typo, another host's
    configuration) is said, exit 1, and no new database, head key or high-water mark is made there."""
    path = write(tmp_path, minimal(tmp_path))
    r = run_pvegate("audit", "reconcile", "-c", str(path), "--min-age", "0s", timeout=60)
    assert r.returncode == 1, r.stderr
    line = one_error_line(r)
    assert line.startswith(f"error: nothing was reconciled: no database at {tmp_path / 'state' / 'audit.db'} "), line
    assert not (tmp_path / "state").exists()


def test_approvals_on_a_file_that_is_no_database_or_without_its_key(cfg: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "audit-head.key").unlink()
    r = run_pvegate("approvals", "list", "-c", str(cfg), timeout=30)
    assert r.returncode == 1
    assert "audit head key" in one_error_line(r)
    for f in state.iterdir():
        f.unlink()
    (state / "audit.db").write_bytes(os.urandom(4096))
    (state / "audit.db").chmod(0o600)
    r = run_pvegate("approvals", "list", "-c", str(cfg), timeout=30)
    assert r.returncode == 1
    assert "not a database" in one_error_line(r)


@pytest.mark.parametrize("args", [["approvals", "list"], ["audit", "reconcile", "--wait", "0s"]], ids=" ".join)
def test_postgresql_unreachable_is_one_line(pg_down: Path, args: list[str]) -> None:
    r = run_pvegate(*args, "-c", str(pg_down), timeout=60)
    assert r.returncode == 1, r.stderr
    assert "PostgreSQL cannot be reached" in one_error_line(r)


# --- 8: a configuration that cannot be loaded: the same line(s), exit 2, in every command ----------


CONFIG_COMMANDS = [
    ["audit", "verify"],
    ["audit", "checkpoint"],
    ["audit", "tail"],
    ["audit", "search"],
    ["audit", "export", "--jsonl"],
    ["audit", "archive", "--older-than", "1d"],
    ["policy", "replay", "--policies", str(REPO_ROOT / "policies")],
    ["approvals", "list"],
    ["db", "status"],
]


@pytest.mark.parametrize("args", CONFIG_COMMANDS, ids=" ".join)
def test_a_configuration_that_cannot_be_loaded_is_exit_2_naming_the_file(tmp_path: Path, args: list[str]) -> None:
    raw = minimal(tmp_path)
    raw["log_format"] = "jsn"
    path = write(tmp_path, raw)
    r = run_pvegate(*args, "-c", str(path), timeout=30)
    assert r.returncode == 2, r.stderr
    assert one_error_line(r) == f"error: {path}: log_format: expected one of text, json, got 'jsn'; did you mean json?"


def test_audit_verify_cannot_check_is_2_and_a_broken_chain_stays_1(cfg: Path, pg_down: Path) -> None:
    r = run_pvegate("audit", "verify", "-c", str(pg_down), timeout=60)
    assert r.returncode == 2, r.stderr
    line = one_error_line(r)
    assert line.startswith("error: cannot verify: ") and "FAILED" not in r.stderr
    missing = run_pvegate("audit", "verify", "-c", str(cfg.parent / "nope.yaml"), timeout=30)
    assert missing.returncode == 2 and "FAILED" not in missing.stderr
    assert one_error_line(missing).endswith("nope.yaml: cannot read the configuration: No such file or directory")
    # tamper-relevant: still a verification failure, exit 1
    (cfg.parent / "state" / "audit-head.key").unlink()
    r = run_pvegate("audit", "verify", "-c", str(cfg), timeout=30)
    assert r.returncode == 1 and r.stderr.startswith("FAILED")
    assert run_pvegate("audit", "verify", "--db", str(cfg.parent / "nope.db"), timeout=30).returncode == 1


# --- 9: wrong input is one line, not a traceback ----------------------------------------------------


def test_output_files_that_cannot_be_written(cfg: Path, tmp_path: Path) -> None:
    nowhere = tmp_path / "no-such-dir" / "out"
    r = run_pvegate("audit", "checkpoint", "-c", str(cfg), "--out", str(nowhere), timeout=30)
    assert r.returncode == 1 and one_error_line(r) == f"error: cannot write {nowhere}: No such file or directory"
    r = run_pvegate("config", "reference", "--output", str(nowhere), timeout=30)
    assert r.returncode == 1 and one_error_line(r) == f"error: cannot write {nowhere}: No such file or directory"
    # replay: said before anything runs (no opa is even needed to say it)
    r = run_pvegate("policy", "replay", "-c", str(cfg), "--no-verify", "--allow-empty", "--out", str(nowhere))
    assert r.returncode == 2
    assert one_error_line(r).startswith(f"error: cannot write the report to {nowhere}: ")
    assert "OPA" not in r.stderr


def test_policy_inputs_that_are_no_object(tmp_path: Path) -> None:
    cases = {"arr.json": "[1, 2]", "null.json": "null", "deep.json": "[" * 100_000 + "]" * 100_000}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        for cmd in ("eval", "explain"):
            r = run_pvegate("policy", cmd, "-i", str(tmp_path / name), timeout=30)
            assert r.returncode == 2, (name, cmd, r.stderr)
            assert one_error_line(r).startswith("error: cannot read input: ")


def test_token_mint_with_an_empty_secret(tmp_path: Path) -> None:
    raw = minimal(tmp_path)
    (tmp_path / "secrets" / "jwt").write_text("\n")
    r = run_pvegate("token", "mint", "-c", str(write(tmp_path, raw)), "--sub", "x", timeout=30)
    assert r.returncode == 2 and r.stdout == ""
    assert one_error_line(r) == "error: auth.hs256_secret: the secret is empty"


def _usage_error(r: subprocess.CompletedProcess[str], option: str) -> None:
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert f"error: argument {option}: " in r.stderr, r.stderr


@pytest.mark.parametrize("port", ["99999", "-1", "0"])
def test_demo_port_out_of_range(port: str) -> None:
    _usage_error(run_pvegate("demo", "--oneshot", "--port", port, timeout=30), "--port")


def test_a_filter_that_is_not_utf8(cfg: Path) -> None:
    done = subprocess.run(
        [*PVEGATE, "audit", "search", "-c", str(cfg), "--principal", os.fsdecode(b"\xff\xfe")],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO_ROOT,
        env={**_env(), "LC_ALL": "C.UTF-8"},
        check=False,
    )
    _usage_error(done, "--principal")


# --- 10: values that were accepted without a word -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["audit", "tail", "-n", "-1"], "-n"),
        (["audit", "tail", "-n", "0"], "-n"),
        (["audit", "search", "--limit", "-1"], "--limit"),
        (["token", "mint", "--sub", "x", "--ttl", "-100"], "--ttl"),
        (["token", "mint", "--sub", "x", "--ttl", "0"], "--ttl"),
        (["token", "mint", "--sub", "x", "--ttl", str(30 * 86400 + 1)], "--ttl"),
        (["tools", "least-privilege", "--role", "PVEGate; rm -rf /"], "--role"),
        (["tools", "least-privilege", "--token-id", "x@pve!gw' ; id ; '"], "--token-id"),
        (["tools", "least-privilege", "--token-id", "no-realm"], "--token-id"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_out_of_range_values_are_usage_errors(args: list[str], option: str) -> None:
    _usage_error(run_pvegate(*args, timeout=30), option)


def test_least_privilege_refuses_unknown_effects() -> None:
    r = run_pvegate("tools", "least-privilege", "--effects", "reed,wirte", timeout=30)
    assert r.returncode == 2 and r.stdout == ""
    line = one_error_line(r)
    assert "unknown effect(s) reed, wirte" in line and "read" in line
    ok = run_pvegate("tools", "least-privilege", "--effects", "read", timeout=30)
    assert ok.returncode == 0 and "pveum acl modify / -token 'pvegate@pve!gateway' -role PVEGate" in ok.stdout


def test_tools_show_with_a_schema_that_cannot_be_read_fails(tmp_path: Path) -> None:
    r = run_pvegate("tools", "show", "vm_stop", "--pve-schema", str(tmp_path / "missing.json"), timeout=30)
    assert r.returncode == 1 and r.stdout == ""
    assert one_error_line(r).startswith(f"error: cannot read PVE schema {tmp_path / 'missing.json'}")


def test_replay_refuses_database_options_with_an_export(tmp_path: Path) -> None:
    export = tmp_path / "export.jsonl"
    export.write_text("")
    args = ["--export", str(export), "--db", str(tmp_path / "x.db"), "--policies", str(REPO_ROOT / "policies")]
    r = run_pvegate("policy", "replay", *args, "--allow-empty", "--engine", "eval", timeout=60)
    assert r.returncode == 2
    assert "--export is not a database: --db cannot be used with it" in r.stderr


def test_an_issued_token_lives_as_long_as_asked(cfg: Path) -> None:
    r = run_pvegate("token", "mint", "-c", str(cfg), "--sub", "x", "--ttl", "60", timeout=30)
    assert r.returncode == 0, r.stderr
    import base64

    payload = r.stdout.strip().split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["exp"] - claims["iat"] == 60


# --- 11: a YAML syntax error ----------------------------------------------------------------------------


def test_a_yaml_syntax_error_is_one_line_without_the_source(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("auth:\n  hs256_secret: TOPSECRET: oops\n")
    r = run_pvegate("serve", "-c", str(bad), timeout=30)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"pvegate: cannot start: {bad}:2:26: cannot read the configuration: mapping values are not allowed here"
    ]
    r = run_pvegate("config", "check", str(bad), timeout=30)
    assert r.returncode == 1 and "TOPSECRET" not in r.stderr and "<unicode string>" not in r.stderr
    assert r.stderr.splitlines() == [f"{bad}:2:26: cannot read the configuration: mapping values are not allowed here"]


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip(reason="pipes and modes as on Linux")


def test_a_broken_connector_file_is_one_line_exit_2(cfg: Path, tmp_path: Path) -> None:
    """`audit reconcile` loads the catalog the configuration names: a tool file with a mistake is said
    in one line naming the file and the tool, not a traceback."""
    connectors = tmp_path / "connectors"
    connectors.mkdir()
    (connectors / "mine.yaml").write_text(
        "tools:\n  - name: node_cache_drop\n    title: Drop a node's page cache\n"
        "    description: Ask the kernel of one node to drop its clean page cache.\n    domain: node\n"
        "    effect: write\n    scope: node\n    params: {node: required}\n    target: {node: node}\n"
        "    ssh: {node: node, argv: [sync], parse: exit_status}\n"
    )
    raw = minimal(tmp_path)
    raw["connectors_dir"] = str(connectors)
    path = write(tmp_path, raw, "broken-connectors.yaml")
    r = run_pvegate("audit", "reconcile", "-c", str(path), "--min-age", "0s", timeout=60)
    assert r.returncode == 2, r.stderr
    line = one_error_line(r)
    assert line.startswith(f"error: {connectors / 'mine.yaml'}: tool node_cache_drop: "), line
