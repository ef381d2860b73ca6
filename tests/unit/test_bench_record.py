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
