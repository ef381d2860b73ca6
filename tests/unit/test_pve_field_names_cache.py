"""The PVE field names the catalog's `sensitive` check uses, kept in the user cache: read back only
for the same schema files and the same reading code, and a damaged file is read around."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway import pve_schema


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    pve_schema.field_names.cache_clear()
    yield tmp_path / "xdg" / "pvegate" / "pve-schema"
    pve_schema.field_names.cache_clear()


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    reads: list[Path] = []
    load_tree = pve_schema.load_tree
    monkeypatch.setattr(pve_schema, "load_tree", lambda path: (reads.append(path), load_tree(path))[1])
    return reads


def test_kept_names_are_those_of_the_schemas(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = _reads(monkeypatch)
    names = pve_schema.field_names()
    assert len(reads) == 2 and {"cipassword", "sshkeys", "vmid"} <= names
    (kept,) = cache.glob("field-names-*.json")
    pve_schema.field_names.cache_clear()
    assert pve_schema.field_names() == names and len(reads) == 2  # read back, not recomputed
    # names kept by other reading code (another release) are not taken for this one's
    monkeypatch.setattr(pve_schema, "_NAMES_CODE", "field-names 2")
    pve_schema.field_names.cache_clear()
    assert pve_schema.field_names() == names and len(reads) == 4
    assert len(list(cache.glob("field-names-*.json"))) == 2 and kept.exists()


@pytest.mark.parametrize("content", ["[]", "[" * 200_000, '{"a": 1}', "not json", '["x", 1]'])
def test_a_damaged_kept_file_is_read_around(cache: Path, monkeypatch: pytest.MonkeyPatch, content: str) -> None:
    """An empty list would let no `sensitive` name through (a start refused for nothing), a deep one
    raised RecursionError and failed the start (found in review)."""
    names = pve_schema.field_names()
    (kept,) = cache.glob("field-names-*.json")
    kept.write_text(content)
    pve_schema.field_names.cache_clear()
    reads = _reads(monkeypatch)
    assert pve_schema.field_names() == names and len(reads) == 2
