"""`pvegate bundle keygen --out FILE`, where FILE exists and is no directory.

It said `error: [Errno 17] File exists: 'FILE'`: nothing named the option or what was expected. Now:
`--out FILE is a file, not a directory`, in one line, exit 1 as for an existing key pair; the file is left
as it was (keygen never overwrites, and `--force` replaces a key pair, never a file named as the directory).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.conftest import run_pvegate


@pytest.mark.parametrize("force", [False, True])
def test_an_out_that_is_a_file_is_said_so(tmp_path: Path, force: bool) -> None:
    out = tmp_path / "keys"
    out.write_text("not a directory\n")
    r = run_pvegate("bundle", "keygen", "--out", str(out), *(["--force"] if force else []))
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr == (
        f"error: --out {out} is a file, not a directory: the key pair is written into a directory "
        "(keygen never replaces a file)\n"
    ), r.stderr
    assert out.read_text() == "not a directory\n"


def test_an_out_below_a_file_is_said_so(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "keys"
    r = run_pvegate("bundle", "keygen", "--out", str(out))
    assert r.returncode == 1 and r.stdout == "", r
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"error: cannot create the directory {out}: ") and "Errno" not in line, line


def test_an_existing_pair_is_still_kept(tmp_path: Path) -> None:
    assert run_pvegate("bundle", "keygen", "--out", str(tmp_path)).returncode == 0
    before = (tmp_path / "bundle-signing.pem").read_bytes()
    r = run_pvegate("bundle", "keygen", "--out", str(tmp_path))
    assert r.returncode == 1 and "already exists: give --force" in r.stderr, r
    assert (tmp_path / "bundle-signing.pem").read_bytes() == before
