"""The catalog as data: format, strictness, PVE schema membership, simulator coverage, CLI."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.pve_schema import SHIPPED_DIR, schema_file
from gateway.tools.catalog import Catalog, CatalogError
from gateway.tools.pveschema import PveSchema, check_catalog, expansions, least_privilege, privileges
from gateway.tools.tool import ArgumentError

CONNECTORS = REPO_ROOT / "connectors"
TWELVE = [
    "list_nodes",
    "get_node_capacity",
    "list_guests",
    "get_guest_config",
    "get_guest_status",
    "list_storage",
    "list_snapshots",
    "list_backups",
    "check_ip_availability",
    "list_guest_containers",
    "inspect_compose_stack",
    "guest_health_summary",
]
MUTATIONS = [
    *(f"{k}_{op}" for k in ("vm", "lxc") for op in ("start", "stop", "shutdown", "reboot", "suspend", "resume")),
    "snapshot_create",
    "snapshot_delete",
    "snapshot_rollback",
    "backup_now",
    "guest_migrate",
    "guest_clone",
    "guest_config_update",
    "guest_delete",
]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(CONNECTORS)


@pytest.fixture(scope="module", params=["8.4", "9.1"])
def pve_schema(request: pytest.FixtureRequest) -> PveSchema:
    return PveSchema.load(schema_file(request.param, SHIPPED_DIR))


def test_catalog_size_and_required_tools(catalog: Catalog) -> None:
    assert len(catalog) >= 60
    names = {t.name for t in catalog}
    assert set(TWELVE) <= names
    assert set(MUTATIONS) <= names
    more = {
        "get_cluster_status",
        "get_cluster_resources",
        "list_tasks",
        "get_task_status",
        "get_task_log",
        "get_ha_status",
        "get_ceph_status",
        "list_firewall_rules",
        "get_node_network",
        "get_token_permissions",
    }
    assert more <= names


def test_every_pve_api_endpoint_is_in_the_pve_schema(catalog: Catalog, pve_schema: PveSchema) -> None:
    assert check_catalog(catalog, pve_schema) == []


def test_schema_check_catches_a_wrong_endpoint(catalog: Catalog, pve_schema: PveSchema, tmp_path: Path) -> None:
    doc = yaml.safe_load((CONNECTORS / "nodes.yaml").read_text())
    doc["tools"] = [t for t in doc["tools"] if "composite" not in t]  # their leaves live in other files
    doc["tools"][0]["pve_api"]["path"] = "/nodes/{node}/execute-anything"
    doc["tools"][0]["params"] = {"node": "required"}
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "params.yaml").write_text((CONNECTORS / "params.yaml").read_text())
    problems = check_catalog(Catalog.load(tmp_path), pve_schema)
    assert any("execute-anything" in p and "not in" in p for p in problems)


def test_every_pve_api_endpoint_is_served_by_the_simulator(catalog: Catalog) -> None:
    import gateway.sim.api  # noqa: F401  (registers the simulator's handlers)
    from gateway.sim.routes import ROUTES

    missing = [
        f"{t.name}: {m} {p}"
        for t in catalog
        if t.connector == "pve_api"
        for m, p, _ in expansions(t)
        if (m, p) not in ROUTES
    ]
    assert missing == [], "the simulator would answer 501 for these"


def test_annotations_follow_effect(catalog: Catalog) -> None:
    for t in catalog:
        a = t.annotations
        assert a["readOnlyHint"] is (t.effect == "read")
        assert a["destructiveHint"] is (t.effect in ("destroy", "exec"))
        assert t.mcp_view["annotations"] == a


def test_parameters_are_strict(catalog: Catalog) -> None:
    for t in catalog:
        p = t.parameters
        assert p["additionalProperties"] is False, t.name
        assert "cluster" in p["properties"], t.name
        for name, s in p["properties"].items():
            if s.get("type") == "string":
                assert "maxLength" in s or "enum" in s, (t.name, name)
            if s.get("type") == "integer":
                assert "minimum" in s and "maximum" in s, (t.name, name)
            assert "\\d" not in str(s.get("pattern", "")), (t.name, name)
        if "vmid" in p["properties"]:
            assert p["properties"]["vmid"]["minimum"] == 100 and p["properties"]["vmid"]["maximum"] == 999999999


def test_policy_library_globs_cover_the_mutations(catalog: Catalog) -> None:
    """The operator role's write/destroy globs match the guest-level mutation names (policies/data/data.yaml);
    node, cluster, storage and other families' writes belong to their own roles."""
    data = yaml.safe_load((REPO_ROOT / "policies" / "data" / "data.yaml").read_text())
    op = data["roles"]["operator"]
    write_globs = [g for rule in op["allow"] if "write" in rule.get("effects", []) for g in rule.get("tools", [])]
    # firewall and SDN writes are the network-admin role's (by domain), HA changes the admin's
    net = data["roles"]["network-admin"]
    net_domains = {d for rule in net["allow"] if "write" in rule.get("effects", []) for d in rule.get("domains", [])}
    for t in catalog:
        if t.effect == "write" and t.domain in ("guest", "container", "snapshot", "backup"):
            assert any(fnmatch.fnmatchcase(t.name, g) for g in write_globs), t.name
    assert {"firewall", "sdn"} <= net_domains
    deny = [g for rule in op["deny"] for g in rule["tools"]]
    assert any(fnmatch.fnmatchcase("guest_delete", g) for g in deny)
    assert any(fnmatch.fnmatchcase("guest_migrate", g) for g in deny)


def test_privileges_come_from_the_schema(catalog: Catalog, pve_schema: PveSchema) -> None:
    privs, _ = privileges(catalog.tools["vm_start"], pve_schema)
    assert [(p.path, p.privs) for p in privs] == [("/vms/{vmid}", ("VM.PowerMgmt",))]
    privs, _ = privileges(catalog.tools["snapshot_rollback"], pve_schema)
    assert privs[0].any_of and "VM.Snapshot.Rollback" in privs[0].privs
    need = least_privilege(catalog, pve_schema, ("read",))
    assert "VM.Audit" in need and "VM.PowerMgmt" not in need


BAD = [
    ("duplicate", lambda d: d["tools"].append(dict(d["tools"][0])), "duplicate tool name"),
    ("placeholder", lambda d: d["tools"][0]["pve_api"].update(path="/nodes/{nodename}"), "placeholder {nodename}"),
    ("free string", lambda d: d["tools"][0].update(params={"xx": {"type": "string"}}), "needs maxLength"),
    (
        "backslash d",
        lambda d: d["tools"][0].update(params={"xx": {"type": "string", "maxLength": 3, "pattern": "^\\d+$"}}),
        "not \\d",
    ),
    ("unknown key", lambda d: d["tools"][0].update(shell="rm -rf /"), "Additional properties"),
]


@pytest.mark.parametrize(("label", "mutate", "message"), BAD, ids=[b[0] for b in BAD])
def test_loader_refuses_bad_files(tmp_path: Path, label: str, mutate: object, message: str) -> None:
    doc = yaml.safe_load((CONNECTORS / "nodes.yaml").read_text())
    mutate(doc)  # type: ignore[operator]
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "params.yaml").write_text((CONNECTORS / "params.yaml").read_text())
    with pytest.raises(CatalogError) as exc:
        Catalog.load(tmp_path)
    assert message in str(exc.value)


def test_ssh_tool_must_use_whole_placeholders(tmp_path: Path) -> None:
    params = (CONNECTORS / "params.yaml").read_text()
    (tmp_path / "params.yaml").write_text(params)
    tool = {
        "name": "bad_ssh",
        "title": "x",
        "description": "a command with a shell string in it",
        "domain": "node",
        "effect": "exec",
        "scope": "node",
        "params": {"node": "required"},
        "ssh": {"node": "node", "argv": ["sh", "-c", "ls {node}"], "parse": "text"},
    }
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"tools": [tool]}))
    with pytest.raises(CatalogError, match="read-only"):
        Catalog.load(tmp_path)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60
    )


def test_cli_check_show_and_least_privilege() -> None:
    r = _cli(
        "check",
        "--pve-schema",
        str(schema_file("8.4", SHIPPED_DIR)),
        "--pve-schema",
        str(schema_file("9.1", SHIPPED_DIR)),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK" in r.stdout
    r = _cli("tools", "show", "snapshot_create", "--pve-schema", str(schema_file("9.1", SHIPPED_DIR)))
    assert r.returncode == 0
    assert (
        "POST /nodes/{node}/qemu/{vmid}/snapshot" in r.stdout and "POST /nodes/{node}/lxc/{vmid}/snapshot" in r.stdout
    )
    assert "VM.Snapshot on /vms/{vmid}" in r.stdout
    r = _cli("tools", "least-privilege", "--pve-schema", str(schema_file("9.1", SHIPPED_DIR)), "--effects", "read")
    assert r.returncode == 0 and "pveum role add PVEGate" in r.stdout and "VM.PowerMgmt" not in r.stdout
    r = _cli("tools", "list")
    assert r.returncode == 0 and len(r.stdout.splitlines()) >= 60


def _tool(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in doc["tools"] if t["name"] == name)


def _counts_no_default(d: dict[str, Any]) -> None:
    _tool(d, "lxc_create")["params"]["cores"].pop("default")


def _bad_default(d: dict[str, Any]) -> None:
    _tool(d, "lxc_create")["params"]["cores"]["default"] = 0


def _resize_with_guests(d: dict[str, Any]) -> None:
    _tool(d, "vm_create")["allocates"] = {"resize_of": "vmid", "guests": 1, "cores": {"param": "cores"}}


def _backup_with_sizes(d: dict[str, Any]) -> None:
    _tool(d, "vm_create")["allocates"] = {"guests": 1, "copy_of_backup": "name", "cores": {"param": "cores"}}


def _backup_in_place_with_guests(d: dict[str, Any]) -> None:
    _tool(d, "vm_create")["allocates"] = {"resize_of": "vmid", "copy_of_backup": "name", "guests": 1}


ALLOCATES_BAD = [
    # what the quota counts must be what is sent: no size is left to Proxmox's own default
    ("counted optional without default", _counts_no_default, "optional parameter cores, which has no default"),
    ("default breaks its schema", _bad_default, "default of parameter cores does not satisfy its own schema"),
    ("resize with more", _resize_with_guests, "resize_of takes only cores and memory_mib"),
    # a restore counts the size its backup records: nothing declared beside it would be counted
    ("backup with sizes", _backup_with_sizes, "copy_of_backup takes only guests, pool beside it"),
    ("backup in place with guests", _backup_in_place_with_guests, "copy_of_backup takes only resize_of beside it"),
]


def _refusal(tmp_path: Path, source: str, mutate: Any) -> str:
    """The loader's refusal of a shipped connector file changed by `mutate` (with the shared parameters)."""
    doc = yaml.safe_load((CONNECTORS / source).read_text())
    mutate(doc)
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "params.yaml").write_text((CONNECTORS / "params.yaml").read_text())
    with pytest.raises(CatalogError) as exc:
        Catalog.load(tmp_path)
    return str(exc.value)


@pytest.mark.parametrize(("label", "mutate", "message"), ALLOCATES_BAD, ids=[b[0] for b in ALLOCATES_BAD])
def test_loader_refuses_uncounted_sizes(tmp_path: Path, label: str, mutate: Any, message: str) -> None:
    assert message in _refusal(tmp_path, "provision.yaml", mutate)


def test_validation_fills_in_the_counted_defaults(catalog: Catalog) -> None:
    """The defaults reach the policy (input.arguments), the digest and the request alike."""
    tool = catalog.get("lxc_create")
    assert tool is not None
    args = {"node": "pve1", "vmid": 190, "template_storage": "local", "template": "d.tar.zst", "disk_storage": "x1"}
    args["disk_gib"] = 8
    # (and the NIC's firewall flag: on unless said off, tests/connectors/test_nic_firewall_e2e.py)
    filled = {"cores": 2, "memory": 512, "swap": 512, "firewall": True}
    assert tool.validate({**args, "cores": 2}) == {**args, **filled}
    assert tool.validate(args)["cores"] == 1
    assert tool.mcp_view["inputSchema"]["properties"]["cores"]["default"] == 1  # clients are told, too


def test_a_key_given_twice_in_a_connector_file_is_refused(tmp_path: Path) -> None:
    """YAML keeps the last of a key given twice without a word: a tool's second `effect:` or
    `sensitive:` would silently replace the first."""
    (tmp_path / "twice.yaml").write_text("tools:\n  - name: t\n    effect: read\n    effect: destroy\n")
    with pytest.raises(CatalogError, match="effect: given twice in the same mapping"):
        Catalog.load(tmp_path)


@pytest.mark.parametrize(
    ("path", "ok"),
    [("/srv/data", True), ("/.hidden", True), ("/srv/..data", True), ("/srv/../etc", False), ("/..", False),
     ("/a/./b", False), ("/srv/", False), ("/a/b/c/d/e/f/g/h/i", False)],
)  # fmt: skip
def test_a_mount_path_has_no_dot_segments(catalog: Catalog, path: str, ok: bool) -> None:
    """lxc_mountpoint_add's path is the gateway's own check, not only Proxmox's: no `.`/`..` segment."""
    tool = catalog.tools["lxc_mountpoint_add"]
    args = {"vmid": 200, "index": 0, "storage": "local-lvm", "disk_gib": 5, "path": path}
    if ok:
        assert tool.validate(args)["path"] == path
    else:
        with pytest.raises(ArgumentError):
            tool.validate(args)


def _pop_task_type(d: dict[str, Any]) -> None:
    _tool(d, "vm_start")["pve_api"].pop("task_type")


def _task_type_without_task(d: dict[str, Any]) -> None:
    _tool(d, "vm_start")["pve_api"].pop("task")


def _task_type_not_a_type(d: dict[str, Any]) -> None:
    _tool(d, "vm_start")["pve_api"]["task_type"] = "qm:start"


TASK_TYPE_BAD = [
    # a call whose UPID was lost is found by its task's type (reconcile): a task tool must say which
    ("task without its type", _pop_task_type, "must declare its task_type"),
    ("type without a task", _task_type_without_task, "task_type is for a tool with `task`"),
    ("not a UPID type", _task_type_not_a_type, "task_type"),
]


@pytest.mark.parametrize(("label", "mutate", "message"), TASK_TYPE_BAD, ids=[b[0] for b in TASK_TYPE_BAD])
def test_loader_refuses_a_task_tool_without_its_task_type(
    tmp_path: Path, label: str, mutate: Any, message: str
) -> None:
    assert message in _refusal(tmp_path, "power.yaml", mutate)


def test_every_task_tool_declares_its_task_types(catalog: Catalog) -> None:
    for tool in catalog:
        assert bool(tool.task_types) == bool(tool.connector == "pve_api" and tool.spec.get("task")), tool.name
    assert catalog.get("vm_start").task_types == ("qmstart", "hastart")  # type: ignore[union-attr]
    assert catalog.get("guest_tags_set").task_types == ()  # type: ignore[union-attr]
