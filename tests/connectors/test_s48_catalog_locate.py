"""A tool's `locate:` names the parameter whose guest the gateway looks up, to run it on that guest's node and
check the guest's type (`types: [lxc]`: `pct exec` never on a VM). A misspelt one (`locate: vmdi`) loaded
without a word; at run time the lookup was skipped (the arguments never hold it), and with it the type and
node checks. The loader refuses it now, naming the tool. Found by a hunt in stop 48."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog, CatalogError

CONNECTORS = REPO_ROOT / "connectors"


@pytest.mark.parametrize(("file", "tool"), [("ssh.yaml", "lxc_docker_inspect"), ("backups.yaml", None)])
def test_a_locate_naming_no_parameter_is_refused(tmp_path: Path, file: str, tool: str | None) -> None:
    doc = yaml.safe_load((CONNECTORS / file).read_text())
    located = [t for t in doc["tools"] if (t.get("ssh") or t.get("pve_api") or {}).get("locate")]
    chosen = next(t for t in located if tool is None or t["name"] == tool)
    spec = chosen.get("ssh") or chosen["pve_api"]
    spec["locate"] = spec["locate"][:-2] + spec["locate"][-1] + spec["locate"][-2]  # vmid -> vmdi
    (tmp_path / file).write_text(yaml.safe_dump(doc))
    (tmp_path / "params.yaml").write_text((CONNECTORS / "params.yaml").read_text())
    with pytest.raises(CatalogError, match=f"{chosen['name']}.*locate names undeclared parameter"):
        Catalog.load(tmp_path)


def test_the_shipped_catalog_still_loads() -> None:
    assert len(Catalog.load(CONNECTORS)) > 0
