"""What an approval token is bound to about its target (store/approvals.target_key): beside the
cluster, node, guest and storage, the data a destroy is decided on. The approvers were checked
against the guest a volume belongs to and the guests a prune deletes backups of; a retry that would
reach other guests (another guest's backups now due for pruning) is not the call they approved."""

from __future__ import annotations

from typing import Any

from gateway.store.approvals import target_key

NODE = {"cluster": "default", "node": "pve1", "vmid": None, "storage": "local", "pool": None, "tags": []}


def prune(*guests: tuple[int, str]) -> dict[str, Any]:
    rows = [{"vmid": v, "node": n, "pool": None, "tags": [], "exists": True} for v, n in guests]
    return {**NODE, "prune_removes": {"known": True, "guests": rows}}


def volume(vmid: int | None, node: str | None) -> dict[str, Any]:
    owner = {"cluster": "default", "volume": "local:backup/x", "content": "backup", "vmid": vmid, "node": node}
    return {**NODE, "volume_of": {**owner, "pool": None, "tags": [], "exists": node is not None}}


def test_a_prune_is_bound_to_the_guests_whose_backups_it_deletes() -> None:
    approved = target_key(prune((205, "pve1"), (103, "pve2")))
    assert target_key(prune((103, "pve2"), (205, "pve1"))) == approved  # the same guests, in any order
    assert target_key(prune((205, "pve1"), (103, "pve2"), (101, "pve1"))) != approved  # one more guest's
    assert target_key(prune((205, "pve1"))) != approved
    assert target_key(prune((205, "pve1"), (103, "pve1"))) != approved  # moved to a node out of scope


def test_a_volume_is_bound_to_its_guest_as_the_target_is() -> None:
    assert target_key(volume(205, "pve1")) == target_key(volume(205, "pve1"))
    assert target_key(volume(205, "pve1")) != target_key(volume(205, "pve2"))
    assert target_key(volume(205, "pve1")) != target_key(volume(205, None))  # gone meanwhile


def test_other_targets_keep_their_key() -> None:
    """Approvals pending across an upgrade stay valid for every tool without these facts."""
    assert target_key(NODE) == '{"cluster":"default","node":"pve1","storage":"local","vmid":null}'
