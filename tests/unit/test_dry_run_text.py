"""A dry run's sentence never shows a literal {placeholder}: an optional parameter the call did not give
reads "(not given)" (found by a review: lxc_create said "in pool {pool} when given", pool_members_add
"Add guests {vmids}" for a call naming storages only)."""

from __future__ import annotations

from pathlib import Path

from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.pve_api import dry_run_text
from gateway.tools.tool import PLACEHOLDER

CATALOG = Catalog.load(Path(__file__).resolve().parents[2] / "connectors")
LOCATED = {"type": "qemu", "node": "pve1"}  # what the runtime finds before a dry run: always there


def test_no_dry_run_sentence_keeps_a_placeholder() -> None:
    left = {
        t.name: PLACEHOLDER.findall(dry_run_text(t, LOCATED)) for t in CATALOG if t.connector == "pve_api" and t.dry_run
    }
    assert {name: names for name, names in left.items() if names} == {}


def test_a_given_value_is_shown_and_a_missing_one_says_so() -> None:
    tool = CATALOG.get("pool_members_add")
    assert tool is not None
    text = dry_run_text(tool, {"poolid": "dev", "storages": "local"})
    assert text.startswith("Add guests (not given) and storages local to resource pool dev"), text
