"""Decision logs (opa.decision_logs, opa.decision_logs_upload) only with a policy whose
`data.system.log.mask` removes the tool arguments: else OPA would log every call's arguments,
passwords included. A managed OPA of such a policy is stopped and the start refused; `pvegate
serve` says so in one line. Real opa throughout."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar, OPAUnavailable, masks_arguments
from tests.config.conftest import PVEGATE, write
from tests.support import free_port

PREFIX = "pvegate: cannot start: "


@contextmanager
def _refused_start(sidecar: OPASidecar, match: str) -> Iterator[pytest.ExceptionInfo[OPAUnavailable]]:
    """The start refused with `match`; an OPA that did start anyway (the bug) is stopped, not leaked."""
    try:
        with pytest.raises(OPAUnavailable, match=match) as err:
            sidecar.start(timeout=30)
        yield err
    finally:
        sidecar.stop()


def _without_mask(tmp_path: Path) -> Path:
    tree = tmp_path / "nolog"
    shutil.copytree(REPO_ROOT / "policies", tree)
    shutil.rmtree(tree / "system" / "log")
    return tree


def _secret_call() -> dict[str, Any]:
    return {"contract_version": 1, "kind": "call", "arguments": {"password": "HUNTER2-SECRET-ARG"}}


def test_decision_logs_without_the_mask_refuse_the_start(tmp_path: Path) -> None:
    log = tmp_path / "opa.log"
    sidecar = OPASidecar(policies=(_without_mask(tmp_path),), decision_logs=True, log_file=log)
    socket_dir = sidecar.socket_dir
    with _refused_start(sidecar, r"system\.log\.mask") as err:
        assert sidecar.process is None and not socket_dir.exists()  # OPA stopped, nothing left
    message = str(err.value)
    assert message.startswith("opa.decision_logs is on but the policy's data.system.log.mask"), message
    assert '"/input/arguments"' in message and "\n" not in message
    assert "HUNTER2" not in log.read_text()


def test_an_upload_without_the_mask_refuses_the_start_too(tmp_path: Path) -> None:
    sidecar = OPASidecar(
        policies=(_without_mask(tmp_path),),
        services={"siem": {"url": "http://127.0.0.1:1"}},
        decision_logs_upload={"service": "siem"},
    )
    with _refused_start(sidecar, r"^opa\.decision_logs_upload is on but .*system\.log\.mask"):
        assert sidecar.process is None


def test_a_mask_that_leaves_the_arguments_is_refused(tmp_path: Path) -> None:
    tree = _without_mask(tmp_path)
    (tree / "system" / "log").mkdir()
    (tree / "system" / "log" / "log.rego").write_text('package system.log\n\nmask contains "/input/approval/token"\n')
    with _refused_start(OPASidecar(policies=(tree,), decision_logs=True), r"system\.log\.mask"):
        pass


def test_control_the_repo_policies_start_and_mask_the_arguments(tmp_path: Path) -> None:
    log = tmp_path / "opa.log"
    sidecar = OPASidecar(policies=(REPO_ROOT / "policies",), decision_logs=True, log_file=log)
    sidecar.start(timeout=30)
    try:
        with sidecar.client(timeout=10) as c:
            assert c.post("/v1/data/pvegate/decision", json={"input": _secret_call()}).status_code == 200
    finally:
        sidecar.stop()
    assert "HUNTER2-SECRET-ARG" not in log.read_text()
    # without decision logs a tree without the mask is nobody's concern
    plain = OPASidecar(policies=(_without_mask(tmp_path),), decision_logs=False)
    try:
        plain.start(timeout=30)
    finally:
        plain.stop()


@pytest.mark.parametrize(
    ("mask", "masked"),
    [
        (None, False),
        ([], False),
        ({"/input/arguments": True}, False),
        (["/input/approval/token"], False),
        (["/input/arguments/password"], False),
        (["/input/arguments"], True),
        (["/input"], True),
        ([{"op": "remove", "path": "/input/arguments"}], True),
        ([{"op": "upsert", "path": "/input/arguments", "value": "x"}], False),
    ],
)
def test_what_counts_as_masking_the_arguments(mask: Any, masked: bool) -> None:
    assert masks_arguments(mask) is masked


def test_serve_refuses_in_one_line(base: dict[str, Any], tmp_path: Path) -> None:
    base["opa"] = {"policies": [str(_without_mask(tmp_path))], "decision_logs": True}
    base["listen"]["port"] = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PVEGATE_")}
    cmd = [*PVEGATE, "serve", "--config", str(write(tmp_path, base))]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=env)
    try:
        _, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # it started (the bug): stopped cleanly, its OPA with it
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        pytest.fail(f"pvegate serve started: {stderr}")
    assert proc.returncode == 2, (proc.returncode, stderr)
    assert "Traceback" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(PREFIX + "opa.decision_logs is on but the policy's data.system.log.mask"), stderr
