"""What goes into a signed bundle, and who can hold the server that hands a watched one to OPA.

- `pvegate bundle build` signs the policy tree it was given: a link in it that leads out of the
  tree (or nowhere) would sign content no commit of the policy repository holds (the manifest's
  `git_commit` and `git_dirty` would vouch for it all the same), or drop a file silently. Refused.
- The loopback server of a watched bundle file (`opa.watch_bundle`) is open to every local
  process: a connection that never finishes its request must not hold a server thread for ever
  (each one is a thread of the gateway's process). Real opa, real server.
"""

from __future__ import annotations

import json
import shutil
import socket
import tarfile
import time
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from gateway.cli import main
from gateway.policy.bundle_status import BundleFileServer
from gateway.policy.bundles import BundleError, build
from gateway.policy.opa_sidecar import REPO_ROOT


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "policies"
    shutil.copytree(REPO_ROOT / "policies", tree)
    return tree


def _names(bundle: Path) -> list[str]:
    with tarfile.open(bundle) as tar:
        return [n.lstrip("/") for n in tar.getnames()]


def test_a_link_out_of_the_policy_tree_is_not_signed(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "extra.rego").write_text("package pvegate.extra\n\nimport rego.v1\n\nbackdoor := true\n")
    (tree / "pvegate" / "extra.rego").symlink_to(outside / "extra.rego")
    out = tmp_path / "b.tar.gz"
    with pytest.raises(BundleError, match=r"extra\.rego.*outside the policy directory"):
        build(tree, out, None, unsigned=True, checks=False, optimize=False)
    assert not out.exists()


def test_a_linked_directory_out_of_the_tree_is_not_signed(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    outside = tmp_path / "other-data"
    outside.mkdir()
    (outside / "data.yaml").write_text("extra: {}\n")
    (tree / "extra").symlink_to(outside, target_is_directory=True)
    with pytest.raises(BundleError, match="outside the policy directory"):
        build(tree, tmp_path / "b.tar.gz", None, unsigned=True, checks=False, optimize=False)


def test_a_dangling_link_is_refused_not_dropped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A data file whose link leads nowhere was left out of the copy without a word."""
    tree = _tree(tmp_path)
    (tree / "pvegate" / "gone.rego").symlink_to(tmp_path / "missing.rego")
    out = tmp_path / "b.tar.gz"
    code = main(["bundle", "build", "--policies", str(tree), "-o", str(out), "--unsigned"])
    err = capsys.readouterr().err
    assert code == 1 and "gone.rego" in err and "Traceback" not in err
    assert not out.exists()


def _data(bundle: Path) -> dict[str, Any]:
    with tarfile.open(bundle) as tar:
        (member,) = [m for m in tar.getmembers() if m.name.lstrip("/") == "data.json"]
        f = tar.extractfile(member)
        assert f is not None
        return cast(dict[str, Any], json.load(f))


def test_a_relative_link_inside_the_tree_is_followed_not_dropped(tmp_path: Path) -> None:
    """Links as git stores them, relative: the copy judged them dangling from the working directory and
    left them out without a word (review of stop 48), so a data file reached through one (a deny list
    kept once for several trees) was missing from the signed bundle."""
    tree = _tree(tmp_path)
    (tree / "lists" / "prod").mkdir(parents=True)
    (tree / "lists" / "prod" / "data.yaml").write_text("denied: [vm_destroy]\n")
    (tree / "denylist").mkdir()
    (tree / "denylist" / "data.yaml").symlink_to(Path("..") / "lists" / "prod" / "data.yaml")
    out = tmp_path / "b.tar.gz"
    build(tree, out, None, unsigned=True, checks=False, optimize=False)
    assert _data(out).get("denylist") == {"denied": ["vm_destroy"]}


def test_links_that_lead_to_each_other_are_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    (tree / "a").mkdir()
    (tree / "b").mkdir()
    (tree / "a" / "x").symlink_to(Path("..") / "b", target_is_directory=True)
    (tree / "b" / "y").symlink_to(Path("..") / "a", target_is_directory=True)
    with pytest.raises(BundleError, match="a loop of links"):
        build(tree, tmp_path / "b.tar.gz", None, unsigned=True, checks=False, optimize=False)


def test_an_idle_connection_does_not_hold_the_bundle_file_server(tmp_path: Path) -> None:
    live = tmp_path / "pvegate.tar.gz"
    live.write_bytes(b"not a bundle, only served")
    server = BundleFileServer(live)
    server.idle_timeout = 1.0
    server.start()
    held: list[socket.socket] = []
    try:
        for _ in range(3):  # a local process: connects, sends half a request line, then nothing
            s = socket.create_connection(("127.0.0.1", int(server.host.rsplit(":", 1)[1])), timeout=6)
            s.sendall(b"GET /bundle.tar.gz HT")
            held.append(s)
        t0 = time.monotonic()
        for s in held:
            try:
                assert s.recv(1024) == b""  # closed by the server
            except TimeoutError:
                pytest.fail("the server still holds a connection that sent nothing for 6 s")
        assert time.monotonic() - t0 < 5
        # and OPA's own request is still answered
        with httpx.Client(trust_env=False, timeout=5) as c:
            r = c.get(f"{server.url}/{server.resource}", headers={"Authorization": f"Bearer {server.new_token()}"})
        assert r.status_code == 200 and r.content == live.read_bytes()
    finally:
        for s in held:
            s.close()
        server.stop()


def test_half_open_connections_neither_take_threads_without_bound_nor_keep_opa_out(tmp_path: Path) -> None:
    """Beyond `max_connections` waiting for their token, a new connection closes the oldest of them instead
    of getting one more thread of the gateway for good; OPA's request, which shows the token at once, is
    answered however many a local process holds half-open (review of stop 48: a first bound closed the
    newcomer, so 16 trickling connections kept every bundle update from OPA)."""
    live = tmp_path / "pvegate.tar.gz"
    live.write_bytes(b"served")
    server = BundleFileServer(live).start()
    port = int(server.host.rsplit(":", 1)[1])
    limit = BundleFileServer.max_connections
    held: list[socket.socket] = []
    try:
        for _ in range(limit + 4):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /bundle.tar.gz HT")  # and then nothing
            held.append(s)
            time.sleep(0.02)  # in order: the first ones are the oldest
        time.sleep(0.3)
        with httpx.Client(trust_env=False, timeout=5) as c:
            r = c.get(f"{server.url}/{server.resource}", headers={"Authorization": f"Bearer {server.new_token()}"})
        assert r.status_code == 200 and r.content == b"served"
        for s in held[:5]:  # the four over the limit and OPA's each closed one of the oldest
            s.settimeout(3)
            assert s.recv(1024) == b"", "an old half-open connection still holds its thread"
    finally:
        for s in held:
            s.close()
        server.stop()
