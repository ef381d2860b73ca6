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


def test_a_cache_root_others_may_write_to_is_not_trusted_unless_sticky(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Others who may write to the directory holding pvegate/ could rename it and put their own
    in its place between the check and the read (found in review: a planted verdict was trusted
    22,027 times in 100,785 reads). Sticky, as /tmp is, they may not move what is ours."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared))
    assert usercache.private_dir("catalog") is None
    shared.chmod(0o1777)
    assert usercache.private_dir("catalog") == shared / "pvegate" / "catalog"
    # and higher up the chain the same
    deep = tmp_path / "open" / "inner"
    deep.mkdir(parents=True)
    (tmp_path / "open").chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(deep))
    assert usercache.private_dir("catalog") is None


def test_symlinks_are_resolved_or_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "link"))
    assert usercache.private_dir("catalog") == real / "pvegate" / "catalog"  # a path without symlinks
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    elsewhere = tmp_path / "xdg"
    elsewhere.mkdir()
    (elsewhere / "pvegate").symlink_to(other)  # pvegate/ itself a symlink: refused
    monkeypatch.setenv("XDG_CACHE_HOME", str(elsewhere))
    assert usercache.private_dir("catalog") is None


def test_made_private_whatever_the_umask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    old = os.umask(0o002)  # Debian's default for a user with a group of their own
    try:
        d = usercache.private_dir("catalog")
    finally:
        os.umask(old)
    assert d is not None and (d.parent.stat().st_mode & 0o777) == 0o700


def test_a_fifo_a_link_or_a_huge_file_is_not_read(tmp_path: Path) -> None:
    """Never blocks, never follows, never reads without bound (a FIFO made a start hang in review)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert usercache.read_text(fifo) is None
    (tmp_path / "zero").symlink_to("/dev/zero")
    assert usercache.read_text(tmp_path / "zero") is None
    big = tmp_path / "big"
    big.write_bytes(b"a" * 101)
    assert usercache.read_text(big, limit=100) is None and usercache.read_text(big, limit=101) == "a" * 101
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    assert usercache.read_text(tmp_path / "bin") is None
