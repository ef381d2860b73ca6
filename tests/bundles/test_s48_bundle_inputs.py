"""What goes into a signed bundle, and who can hold the server that hands a watched one to OPA.

- `pvegate bundle build` signs the policy tree it was given: a link in it that leads out of the
  tree (or nowhere) would sign content no commit of the policy repository holds (the manifest's
  `git_commit` and `git_dirty` would vouch for it all the same), or drop a file silently. Refused.
- The loopback server of a watched bundle file (`opa.watch_bundle`) is open to every local
  process: a connection that never finishes its request must not hold a server thread for ever
  (each one is a thread of the gateway's process). Real opa, real server.
"""

from __future__ import annotations

import shutil
import socket
import tarfile
import time
from pathlib import Path

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


def test_a_link_inside_the_tree_still_builds(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    (tree / "shared").mkdir()
    (tree / "pvegate" / "decision.rego").rename(tree / "shared" / "decision.rego")
    (tree / "pvegate" / "decision.rego").symlink_to(Path("..") / "shared" / "decision.rego")
    out = tmp_path / "b.tar.gz"
    build(tree, out, None, unsigned=True, checks=False, optimize=False)
    assert any(n.endswith("/decision.rego") for n in _names(out))  # (opa keeps one of two equal modules)


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


def test_the_bundle_file_server_serves_a_bounded_number_of_connections(tmp_path: Path) -> None:
    """Beyond `max_connections` at once, a connection is closed unanswered instead of getting one more
    thread of the gateway; once the others go, OPA's request is answered again."""
    live = tmp_path / "pvegate.tar.gz"
    live.write_bytes(b"served")
    server = BundleFileServer(live).start()
    port = int(server.host.rsplit(":", 1)[1])
    limit = getattr(BundleFileServer, "max_connections", 16)
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(limit)]
    try:
        time.sleep(0.3)  # each accepted and waiting in a handler
        extra = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            assert extra.recv(1024) == b""  # closed at once (it would otherwise wait for a request)
        finally:
            extra.close()
    finally:
        for s in held:
            s.close()
    try:
        token = server.new_token()
        deadline = time.monotonic() + 5
        while True:
            try:
                with httpx.Client(trust_env=False, timeout=5) as c:
                    r = c.get(f"{server.url}/{server.resource}", headers={"Authorization": f"Bearer {token}"})
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert r.status_code == 200 and r.content == b"served"
    finally:
        server.stop()
