"""`task_worker_id`: the id a tool's task carries in its UPID when it is not the guest's vmid (a prune of
guest 103's backups on `local` is PVE's `103@local`). The loader takes it only for a task tool, with
placeholders that are the tool's target fields; reconciliation fills the first form the call's fields fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.core.redaction import REDACTED
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.store.reconcile import OpenCall, worker_id
from gateway.tools.catalog import Catalog, CatalogError

CONNECTORS = REPO_ROOT / "connectors"


def _prune(doc: dict[str, Any]) -> dict[str, Any]:
    return next(t for t in doc["tools"] if t["name"] == "backup_prune")


def _load(tmp_path: Path, mutate: Any) -> Catalog:
    doc = yaml.safe_load((CONNECTORS / "backups.yaml").read_text())
    mutate(doc)
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "params.yaml").write_text((CONNECTORS / "params.yaml").read_text())
    return Catalog.load(tmp_path)


def _not_a_target_field(d: dict[str, Any]) -> None:
    _prune(d)["pve_api"]["task_worker_id"] = ["{vmid}@{store}", "{storage}"]  # a typo: no such target field


def _a_parameter_not_in_target(d: dict[str, Any]) -> None:
    _prune(d)["pve_api"]["task_worker_id"] = "{keep}"  # a parameter, but not one the target records


def _without_task(d: dict[str, Any]) -> None:
    _prune(d)["pve_api"].pop("task")
    _prune(d)["pve_api"].pop("task_type")
    _prune(d)["pve_api"].pop("task_timeout")


def _stray_brace(d: dict[str, Any]) -> None:
    _prune(d)["pve_api"]["task_worker_id"] = "{vmid}@{storage"


def _colon(d: dict[str, Any]) -> None:
    _prune(d)["pve_api"]["task_worker_id"] = "{vmid}:{storage}"  # a UPID's id holds no ':'


BAD = [
    ("not a target field", _not_a_target_field, "backup_prune: task_worker_id '{vmid}@{store}': {store}"),
    ("a parameter the target does not map", _a_parameter_not_in_target, "{keep} is not one of its target fields"),
    ("without task", _without_task, "backup_prune: task_worker_id is for a tool with `task`"),
    ("stray brace", _stray_brace, "a brace that is not a {target field} placeholder"),
    ("colon", _colon, "task_worker_id"),
]


@pytest.mark.parametrize(("label", "mutate", "message"), BAD, ids=[b[0] for b in BAD])
def test_the_loader_refuses_a_bad_task_worker_id(tmp_path: Path, label: str, mutate: Any, message: str) -> None:
    with pytest.raises(CatalogError) as exc:
        _load(tmp_path, mutate)
    assert message in str(exc.value)


def test_the_shipped_prune_declares_pves_worker_ids() -> None:
    catalog = Catalog.load(CONNECTORS)
    prune = catalog.get("backup_prune")
    assert prune is not None and prune.task_worker_ids == ("{vmid}@{storage}", "{storage}")
    assert prune.task_types == ("prunebackups",)
    declared = [t.name for t in catalog if t.task_worker_ids]
    assert declared == ["backup_prune"], declared  # every other task tool's id is its guest's vmid
    start = catalog.get("vm_start")
    assert start is not None and start.task_worker_ids == ()


def _call(target: dict[str, Any], arguments: dict[str, Any]) -> OpenCall:
    call = OpenCall("r", 0.0, "p", "backup_prune", None, target=target)
    call.arguments = arguments
    return call


FORMS = ("{vmid}@{storage}", "{storage}")
PARAMS = {"node": "node", "storage": "storage", "vmid": "vmid", "prune": "keep"}
ARGS = {"node": "pve2", "storage": "local", "keep": "keep-last=1"}


@pytest.mark.parametrize(
    ("target", "arguments", "want"),
    [
        # a listed guest: its target holds the vmid
        ({"vmid": 103, "storage": "local"}, {**ARGS, "vmid": 103}, "103@local"),
        # the whole storage: no vmid, the next form
        ({"vmid": None, "storage": "local"}, ARGS, "local"),
        # a guest the cluster does not list (its backups outlived it): the target has no vmid, the argument has
        ({"vmid": None, "storage": "local", "known": False}, {**ARGS, "vmid": 999}, "999@local"),
        # an argument redacted from the record: which form Proxmox used is unknown, the id is not checked
        ({"vmid": None, "storage": "local"}, {**ARGS, "vmid": REDACTED}, None),
        # nothing fits
        ({}, {}, None),
    ],
)
def test_the_first_form_the_call_fills_is_its_worker_id(
    target: dict[str, Any], arguments: dict[str, Any], want: str | None
) -> None:
    assert worker_id(FORMS, PARAMS, _call(target, arguments)) == want
