"""The user's private cache directory (core/usercache.py): where derived files are trusted from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.core import usercache


def test_the_directory_is_made_private_under_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    d = usercache.private_dir("catalog")
    assert d == tmp_path / "xdg" / "pvegate" / "catalog" and d.stat().st_mode & 0o777 == 0o700


def test_a_directory_others_may_write_to_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    d = usercache.private_dir("catalog")
    assert d is not None
    d.parent.chmod(0o777)  # pvegate/ above it: someone could swap catalog/ for their own
    assert usercache.private_dir("catalog") is None
    d.parent.chmod(0o700)
    d.chmod(0o775)
    assert usercache.private_dir("catalog") is None


def test_no_home_and_a_relative_xdg_cache_home_mean_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never a folder relative to the working directory (`./~/.cache`, `./rel/pvegate`)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", "rel")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert usercache.private_dir("catalog") == tmp_path / "home" / ".cache" / "pvegate" / "catalog"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("HOME")
    monkeypatch.setattr(os.path, "expanduser", lambda p: p)  # no passwd entry either: `~` stays `~`
    assert usercache.private_dir("catalog") is None
    assert not any(tmp_path.glob("rel")) and not any(tmp_path.glob("~"))


def test_kept_digests_round_trip_and_only_in_a_private_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    a, b = usercache.digest("x", "1"), usercache.digest("x", "2")
    assert a != b and usercache.digest("x1") != usercache.digest("x", "1")  # parts are length-prefixed
    kept = usercache.KeptDigests("t", "kept.txt")
    kept.add(a)
    kept.save()
    again = usercache.KeptDigests("t", "kept.txt")  # another process
    assert a in again and b not in again
    (tmp_path / "xdg" / "pvegate" / "t").chmod(0o777)
    assert a not in usercache.KeptDigests("t", "kept.txt")
