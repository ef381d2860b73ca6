"""The catalog's metaschema verdicts kept between processes (0.4 s of every start otherwise).

Each case is a fresh `python` process, as a gateway start is: it loads a connectors directory
with $XDG_CACHE_HOME pointed at the test's own folder and reports how many parameter schemas it
had to check against the metaschema. A second start checks none; a schema found wrong is never
kept, so it is refused at every start; a cache directory others may write to is not trusted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gateway.core import usercache
from gateway.policy.opa_sidecar import REPO_ROOT

CONNECTORS = REPO_ROOT / "connectors"
# passes the connector file's schema, fails the metaschema
WRONG = {"type": "string", "maxLength": -1}

LOAD = """
import json, os, sys
from pathlib import Path
import jsonschema, yaml  # (they read sys.version as they load)
sys.version = os.environ.get("FAKE_PYTHON_VERSION", sys.version)  # another Python, for one test
import gateway.pve_schema as pve_schema
import gateway.tools.catalog as catalog
checked, trees, files = [], [], []
check, load_tree, validator = catalog._check_schema, pve_schema.load_tree, catalog.file_validator()
class Counting:
    def iter_errors(self, doc):
        files.append(1)
        return validator.iter_errors(doc)
catalog._check_schema = lambda schema: (checked.append(1), check(schema))[1]
pve_schema.load_tree = lambda path: (trees.append(1), load_tree(path))[1]
catalog.file_validator = Counting
try:
    tools = len(catalog.Catalog.load(Path(sys.argv[1])).tools)
    print(json.dumps({"tools": tools, "checked": len(checked), "trees": len(trees), "files": len(files)}))
except catalog.CatalogError as exc:
    print(json.dumps({"error": str(exc), "checked": len(checked)}))
"""


def _start(connectors: Path, cache: Path, **extra: str) -> dict[str, Any]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), **extra}
    out = subprocess.run(
        [sys.executable, "-c", LOAD, str(connectors)],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


def _with_wrong_schema(conn: Path) -> Path:
    """A connectors directory whose user_create has the WRONG password schema."""
    conn.mkdir()
    doc = yaml.safe_load((CONNECTORS / "access.yaml").read_text())
    (raw,) = [t for t in doc["tools"] if t["name"] == "user_create"]
    raw["params"]["password"] = WRONG
    (conn / "access.yaml").write_text(yaml.safe_dump(doc))
    (conn / "params.yaml").write_text((CONNECTORS / "params.yaml").read_text())
    return conn


def _kept(cache: Path) -> list[Path]:
    return sorted((cache / "pvegate" / "catalog").glob("valid-*.txt"))


def test_a_second_start_checks_no_schema_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _start(CONNECTORS, cache)
    # every distinct schema once, every connector file, both PVE schemas (the names `sensitive` may use)
    assert first["checked"] > 200 and first["tools"] > 200 and first["trees"] == 2
    assert first["files"] == len(list(CONNECTORS.glob("**/*.yaml")))
    (kept,) = _kept(cache)
    assert kept.stat().st_mode & 0o777 == 0o600 and (kept.parent.stat().st_mode & 0o777) == 0o700
    second = _start(CONNECTORS, cache)
    assert second == {"tools": first["tools"], "checked": 0, "trees": 0, "files": 0}
    # a connector file changed: that file is checked again, and only it
    edited = tmp_path / "connectors"
    shutil.copytree(CONNECTORS, edited)
    (edited / "access.yaml").write_text((edited / "access.yaml").read_text() + "\n# edited\n")
    assert _start(edited, cache) == {"tools": first["tools"], "checked": 0, "trees": 0, "files": 1}


def test_a_wrong_schema_is_refused_at_every_start_and_never_kept(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    conn = _with_wrong_schema(tmp_path / "connectors")
    for _ in range(2):
        got = _start(conn, cache)
        assert "bad parameters schema: password: -1 is less than" in got["error"], got
    # the schemas checked before the wrong one were kept only if the load got that far: it did
    # not, so nothing was written, and the next start checks again
    assert _start(conn, cache)["checked"] >= 1


def test_a_cache_others_may_write_to_is_not_trusted(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _start(CONNECTORS, cache)
    (kept,) = _kept(cache)
    # a digest planted for the wrong schema would make it pass, were the file read
    conn = _with_wrong_schema(tmp_path / "connectors")
    planted = usercache.digest("parameters", json.dumps({"properties": {"password": WRONG}}, sort_keys=True))
    kept.write_text(kept.read_text() + planted + "\n")
    assert "error" not in _start(conn, cache)  # the planted verdict is used: the directory is private
    kept.parent.chmod(0o777)  # now others could have planted it
    got = _start(conn, cache)
    assert "bad parameters schema: password" in got.get("error", ""), got


def test_verdicts_kept_by_another_python_are_not_taken(tmp_path: Path) -> None:
    """The metaschema's `regex` format is Python's `re`: 3.12 refuses patterns 3.11 accepts (found
    in review), so a verdict stands only for the Python that reached it."""
    cache = tmp_path / "cache"
    first = _start(CONNECTORS, cache)
    other = _start(CONNECTORS, cache, FAKE_PYTHON_VERSION="3.99.0 (another)")
    assert other["checked"] == first["checked"] > 200 and other["files"] == first["files"]
    assert len(_kept(cache)) == 2
