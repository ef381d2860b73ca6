"""A quick `make bench` (any BENCH_ARGS) must not overwrite the recorded results."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_only_a_default_or_explicitly_recorded_run_is_recorded() -> None:
    bench = _bench()
    latest = ROOT / "bench" / "results" / "latest.json"
    assert bench.outputs([], False, "T") == (latest, True)  # make bench
    assert bench.outputs(["--seconds", "5"], True, "T") == (latest, True)  # ... --record
    raw, doc = bench.outputs(["--seconds", "5", "--memory-calls", "30000"], False, "20261130T120000Z")
    assert (raw, doc) == (ROOT / "bench" / "results" / "quick-20261130T120000Z.json", False)


def test_quick_results_are_git_ignored() -> None:
    done = subprocess.run(
        ["git", "check-ignore", "-q", "bench/results/quick-20261130T120000Z.json"], cwd=ROOT, check=False
    )
    assert done.returncode == 0, "bench/results/quick-*.json should be in .gitignore"


def test_the_bench_command_line_documents_record() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--record" in done.stdout


def test_the_constant_policy_answers_the_recorded_decision_within_the_contract(tmp_path: Path) -> None:
    """bench's A0 (A with its decision a constant) must give the gateway exactly what A's policy gave:
    the recorded decision's contract fields, asked of the real OPA, valid against the contract."""
    import json
    import sqlite3

    import jsonschema

    from gateway.policy.opa_sidecar import find_opa

    bench = _bench()
    recorded = {
        "allow": True,
        "deny": [],
        "deny_reasons": [],
        "risk": {"factors": [], "level": "low", "score": 0},
        "approval": {
            "approver_groups": [],
            "min_approvals": 0,
            "reason": "",
            "reasons": [],
            "required": False,
            "satisfied": False,
            "ttl_seconds": 0,
        },
        "obligations": {"dry_run": False, "max_items": 500, "redact": ["arguments.x"], "reveal_secrets": False},
        "quota": None,
        # what the audit adds beside the policy's answer: not part of the constant
        "eval_ns": 1234,
        "input_digest": "sha256:00",
        "failed_closed": False,
    }
    db = tmp_path / "audit.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE audit (seq INTEGER PRIMARY KEY, kind TEXT, tool TEXT, body TEXT)")
    con.execute("INSERT INTO audit (kind, tool, body) VALUES ('decision', 'bench_list_nodes', ?)", (json.dumps({}),))
    con.execute("INSERT INTO audit (kind, tool, body) VALUES ('decision', 'other', ?)", (json.dumps({}),))
    con.execute(
        "INSERT INTO audit (kind, tool, body) VALUES ('decision', 'bench_list_nodes', ?)", (json.dumps(recorded),)
    )
    con.commit()
    con.close()
    policy = bench.constant_policy(db, "bench_list_nodes", tmp_path / "policy")
    done = subprocess.run(
        [str(find_opa()), "eval", "-f", "json", "-d", str(policy), "-I", "data.pvegate.decision"],
        input="{}",
        capture_output=True,
        text=True,
        check=True,
    )
    answer = json.loads(done.stdout)["result"][0]["expressions"][0]["value"]
    schema = json.loads((ROOT / "gateway" / "schemas" / "decision.schema.json").read_text())
    jsonschema.validate(answer, schema)
    assert answer == {k: v for k, v in recorded.items() if k in schema["properties"]} | {"contract_version": 1}


def test_the_host_probe_is_wall_time_so_a_slower_cpu_shows() -> None:
    """The probe stands for the host's speed: CPU taken from it (here two other threads holding the
    GIL two thirds of the time, as a busy neighbour takes a vCPU) must show as a slower probe. (One
    thread and best of three was not enough on a noisy host: a lucky try hid the contention.)"""
    import sys
    import threading

    bench = _bench()
    quiet = bench.host_probe_ms(tries=3)
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    spinners = [threading.Thread(target=spin) for _ in range(2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)  # fine-grained turns, so no try runs alone for long
    for t in spinners:
        t.start()
    try:
        contended = bench.host_probe_ms(tries=3)
    finally:
        stop.set()
        for t in spinners:
            t.join()
        sys.setswitchinterval(interval)
    assert quiet > 0
    assert contended > 1.4 * quiet, (quiet, contended)
