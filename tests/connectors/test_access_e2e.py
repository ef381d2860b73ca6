"""Identity and access end to end: HTTPS -> JWT -> real OPA with the example organisation's
policy -> pve_api runtime -> simulator.

Every identity write is critical in the example policy: the call is held, two approvers
(alice, bob) vote, the requester presents the approval and it runs; the simulator's log
must then show exactly the request the tool's YAML declares, and its state the effect.
A new API token's secret reaches the (human) caller once and nowhere else: not the
audit database, the approvals, any file of the gateway, or its logs.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.dev.devenv import DevEnv
from gateway.observability.logs import JsonFormatter
from gateway.pve_schema import SHIPPED_DIR, schema_file
from gateway.tools.catalog import Catalog
from gateway.tools.pveschema import PveSchema, check_catalog, least_privilege, privileges
from gateway.tools.shaping import WITHHELD, shape
from tests.approvals.conftest import Api, outcome, text
from tests.connectors.test_catalog import CONNECTORS
from tests.connectors.test_provision_e2e import sent
from tests.support import GatewayThread, audit_bytes, kept_input

USER = "e2e-user@pve"
USER_PASSWORD = "Initial-Secret-Pw-5c31e"
ACCESS_WRITES = {
    "user_create", "user_update", "user_delete", "token_create", "token_update", "token_delete", "group_create",
    "group_update", "group_delete", "role_create", "role_update", "role_delete", "acl_set", "acl_remove",
}  # fmt: skip
ACCESS_READS = {
    "list_users", "get_user", "list_groups", "get_group", "list_roles", "list_acl", "list_user_tokens",
    "list_realms", "list_tfa",
}  # fmt: skip
SECRETS: dict[str, str] = {}  # what the token test saw, for the secret search after it


@pytest.fixture(scope="module")
def api(gateway: GatewayThread, env: DevEnv) -> Api:
    return Api(env)


class Captured(logging.Handler):
    """Every log record of the gateway process, formatted as the JSON log would write it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.formatter_ = JsonFormatter()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.formatter_.format(record) + " " + repr(record.__dict__))


@pytest.fixture(scope="module")
def logs() -> Iterator[Captured]:
    root = logging.getLogger()
    handler, level = Captured(), root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


def requester(env: DevEnv) -> str:
    return env.token("iam-requester", [], groups=["pve-admins"], kind="human")


async def read(api: Api, name: str, args: dict[str, Any]) -> dict[str, Any]:
    res = await api.call(api.env.token("iam-reader", ["auditor"], kind="human"), name, args)
    assert not res.get("isError"), text(res)
    return dict(res["structuredContent"])


async def approved_run(
    api: Api,
    sim: Any,
    name: str,
    args: dict[str, Any],
    want: tuple[str, str, dict[str, str] | None],
    approvals: int = 2,
    level: str = "critical",
    token: str | None = None,
    codes: tuple[str, ...] = ("approval.risk_level",),
) -> dict[str, Any]:
    """The example policy's verdict: held for `approvals` approvers (alice, then bob); nothing is
    sent until they voted; then the requester presents the approval and it runs, once."""
    sim.clear_logs()
    tok = token or requester(api.env)
    held = await api.call(tok, name, args)
    assert outcome(held) == "pending_approval", f"{name}: {text(held)}"
    info = held["structuredContent"]["approval"]
    assert set(codes) <= set(info["codes"]), info
    assert info["min_approvals"] == approvals and f"risk {level}" in text(held), (info, text(held))
    assert sent(sim) == [], f"{name} was held but sent {sent(sim)}"
    vote = await api.vote(info["id"], api.human("alice", ["sre-leads"]))
    if approvals == 2:
        assert vote.status_code == 200 and vote.json()["state"] == "pending", vote.text
        early = await api.call(tok, name, args)  # one approval is not enough: still held, nothing sent
        assert outcome(early) == "pending_approval" and sent(sim) == []
        vote = await api.vote(info["id"], api.human("bob"))
    assert vote.status_code == 200 and vote.json()["state"] == "approved", vote.text
    done = await api.call(tok, name, args, approval=vote.json()["token"])
    assert outcome(done) == "allowed", f"{name}: {text(done)}"
    assert sent(sim) == [want], f"{name}: {sent(sim)}"
    return done


async def four_eyes(
    api: Api, sim: Any, name: str, args: dict[str, Any], want: tuple[str, str, dict[str, str] | None]
) -> dict[str, Any]:
    """An identity write: critical, so two approvers."""
    return await approved_run(api, sim, name, args, want)


def sim_get(sim: Any, path: str, token: str) -> httpx.Response:
    """A request to the simulator with an API token of its own (proves a token works, or not)."""
    ctx = ssl.create_default_context(cafile=str(sim.ca_file))
    return httpx.get(sim.api_url + path, headers={"Authorization": f"PVEAPIToken={token}"}, verify=ctx)


API = "/api2/json/access"


async def test_users_groups_roles_acls_four_eyes(api: Api, sim: Any) -> None:
    await four_eyes(
        api, sim, "group_create", {"groupid": "iam-e2e", "comment": "made by the access e2e"},
        ("POST", f"{API}/groups", {"groupid": "iam-e2e", "comment": "made by the access e2e"}),
    )  # fmt: skip
    assert "iam-e2e" in {g["groupid"] for g in (await read(api, "list_groups", {}))["items"]}
    await four_eyes(
        api, sim, "group_update", {"groupid": "iam-e2e", "comment": "access e2e group"},
        ("PUT", f"{API}/groups/iam-e2e", {"comment": "access e2e group"}),
    )  # fmt: skip

    args = {"userid": USER, "password": USER_PASSWORD, "groups": "iam-e2e", "email": "e2e@example.com",
            "firstname": "Eve", "comment": "access e2e"}  # fmt: skip
    await four_eyes(api, sim, "user_create", args, ("POST", f"{API}/users", {**args}))
    user = await read(api, "get_user", {"userid": USER})
    assert user["groups"] == ["iam-e2e"] and user["email"] == "e2e@example.com" and "password" not in user
    assert (await read(api, "get_group", {"groupid": "iam-e2e"}))["members"] == [USER]
    await four_eyes(
        api, sim, "user_update", {"userid": USER, "comment": "disabled by the e2e", "enable": False},
        ("PUT", f"{API}/users/{USER}", {"comment": "disabled by the e2e", "enable": "0"}),
    )  # fmt: skip
    rows = {u["userid"]: u for u in (await read(api, "list_users", {}))["items"]}
    assert rows[USER]["enable"] == 0 and rows[USER]["realm-type"] == "pve"

    await four_eyes(
        api, sim, "role_create", {"roleid": "E2EAuditor", "privs": "VM.Audit,Sys.Audit"},
        ("POST", f"{API}/roles", {"roleid": "E2EAuditor", "privs": "VM.Audit,Sys.Audit"}),
    )  # fmt: skip
    await four_eyes(
        api, sim, "role_update", {"roleid": "E2EAuditor", "privs": "Datastore.Audit", "append": True},
        ("PUT", f"{API}/roles/E2EAuditor", {"privs": "Datastore.Audit", "append": "1"}),
    )  # fmt: skip
    roles = {r["roleid"]: r for r in (await read(api, "list_roles", {}))["items"]}
    assert roles["E2EAuditor"]["privs"] == "Datastore.Audit,Sys.Audit,VM.Audit" and roles["E2EAuditor"]["special"] == 0

    await four_eyes(
        api, sim, "acl_set", {"path": "/vms", "roles": "E2EAuditor", "groups": "iam-e2e", "propagate": False},
        ("PUT", f"{API}/acl", {"path": "/vms", "roles": "E2EAuditor", "groups": "iam-e2e", "propagate": "0"}),
    )  # fmt: skip
    acl = (await read(api, "list_acl", {}))["items"]
    assert {"path": "/vms", "type": "group", "ugid": "iam-e2e", "roleid": "E2EAuditor", "propagate": 0} in acl
    await four_eyes(
        api, sim, "acl_remove", {"path": "/vms", "roles": "E2EAuditor", "groups": "iam-e2e"},
        ("PUT", f"{API}/acl", {"path": "/vms", "roles": "E2EAuditor", "groups": "iam-e2e", "delete": "1"}),
    )  # fmt: skip
    assert not [a for a in (await read(api, "list_acl", {}))["items"] if a["ugid"] == "iam-e2e"]

    await four_eyes(api, sim, "role_delete", {"roleid": "E2EAuditor"}, ("DELETE", f"{API}/roles/E2EAuditor", None))
    assert "E2EAuditor" not in {r["roleid"] for r in (await read(api, "list_roles", {}))["items"]}
    await four_eyes(api, sim, "user_delete", {"userid": USER}, ("DELETE", f"{API}/users/{USER}", None))
    gone = await api.call(api.env.token("iam-reader", ["auditor"], kind="human"), "get_user", {"userid": USER})
    assert gone["isError"] and f"no such user ('{USER}')" in text(gone), text(gone)
    await four_eyes(api, sim, "group_delete", {"groupid": "iam-e2e"}, ("DELETE", f"{API}/groups/iam-e2e", None))
    assert "iam-e2e" not in {g["groupid"] for g in (await read(api, "list_groups", {}))["items"]}


async def test_iam_admin_every_change_needs_a_second_approver(api: Api, sim: Any) -> None:
    """The example organisation's iam-admin role is four-eyes: its changes wait for two approvers."""
    iam = api.env.token("iam-ivan", [], groups=["iam-admins"], kind="human")
    both = ("approval.four_eyes_role", "approval.risk_level")
    args = {"groupid": "iam-ivan-team", "comment": "by iam-admin"}
    await approved_run(api, sim, "group_create", args, ("POST", f"{API}/groups", args), token=iam, codes=both)
    await approved_run(
        api, sim, "group_delete", {"groupid": "iam-ivan-team"}, ("DELETE", f"{API}/groups/iam-ivan-team", None),
        token=iam, codes=both,
    )  # fmt: skip
    assert not (await api.call(iam, "list_groups", {})).get("isError")  # reads need nobody
    res = await api.call(iam, "vm_start", {"vmid": 102})  # iam-admin manages identities, not guests
    assert outcome(res) == "denied" and "no role" in text(res)


async def test_api_token_secret_once_to_the_caller(api: Api, sim: Any, logs: Captured) -> None:
    owner = "tok-owner@pve"
    await four_eyes(api, sim, "user_create", {"userid": owner}, ("POST", f"{API}/users", {"userid": owner}))
    done = await four_eyes(
        api, sim, "token_create", {"userid": owner, "tokenid": "deploy", "comment": "ci deploys"},
        ("POST", f"{API}/users/{owner}/token/deploy", {"comment": "ci deploys"}),
    )  # fmt: skip
    made = done["structuredContent"]
    secret = made["value"]
    assert re.fullmatch(r"[0-9a-f-]{36}", secret), made  # revealed: the requester is human
    assert made["full-tokenid"] == f"{owner}!deploy" and made["info"]["privsep"] == 1
    SECRETS["token"] = secret
    assert sim_get(sim, "/version", f"{owner}!deploy={secret}").status_code == 200  # the secret works

    listed = (await read(api, "list_user_tokens", {"userid": owner}))["items"]
    assert listed == [{"tokenid": "deploy", "comment": "ci deploys", "expire": 0, "privsep": 1}]
    assert secret not in json.dumps(await read(api, "get_user", {"userid": owner}))

    await four_eyes(
        api, sim, "acl_set", {"path": "/vms/100", "roles": "PVEAuditor", "users": owner, "tokens": f"{owner}!deploy"},
        ("PUT", f"{API}/acl", {"path": "/vms/100", "roles": "PVEAuditor", "users": owner,
                               "tokens": f"{owner}!deploy"}),
    )  # fmt: skip
    perms = sim_get(sim, "/access/permissions?path=/vms/100", f"{owner}!deploy={secret}").json()["data"]
    assert "VM.Audit" in perms["/vms/100"]  # the grant took effect for the token
    await four_eyes(
        api, sim, "token_update", {"userid": owner, "tokenid": "deploy", "comment": "rotated", "expire": 4102444799},
        ("PUT", f"{API}/users/{owner}/token/deploy", {"comment": "rotated", "expire": "4102444799"}),
    )  # fmt: skip
    await four_eyes(
        api, sim, "token_delete", {"userid": owner, "tokenid": "deploy"},
        ("DELETE", f"{API}/users/{owner}/token/deploy", None),
    )  # fmt: skip
    assert sim_get(sim, "/version", f"{owner}!deploy={secret}").status_code == 401  # revoked
    assert (await read(api, "list_user_tokens", {"userid": owner}))["items"] == []
    gone = await api.call(requester(api.env), "token_update", {"userid": owner, "tokenid": "deploy", "comment": "x"})
    assert outcome(gone) == "pending_approval"  # the policy still asks first; Proxmox would say no such token

    # the secret is in no record, file or log line of the gateway
    env = api.env
    raw, rows = audit_bytes(env.config.audit_path)
    assert secret.encode() not in raw
    for found in subprocess.run(["grep", "-rlaF", secret, str(env.workdir)], capture_output=True, text=True).stdout:
        pytest.fail(f"the token secret is in {found}")
    assert not [line for line in logs.lines if secret in line]
    assert any("token_create" in line for line in logs.lines), "the capture saw the gateway's log lines"
    results = [r for r in rows if r["tool"] == "token_create" and r["kind"] == "result"]
    assert results and all(r["outcome"] == "ok" for r in results)


def test_user_password_never_reaches_audit(gateway: GatewayThread, env: DevEnv) -> None:
    """The initial password sent above: in the Proxmox request, never in the audit or approvals."""
    raw, rows = audit_bytes(env.config.audit_path)
    assert USER_PASSWORD.encode() not in raw
    assert subprocess.run(["grep", "-rlaF", USER_PASSWORD, str(env.workdir)], capture_output=True).stdout == b""
    kept = [kept_input(r) for r in rows if r["tool"] == "user_create"]
    assert any(k and k["arguments"].get("password") == "[redacted]" for k in kept)


def test_withheld_unless_the_decision_reveals() -> None:
    tool = Catalog.load(CONNECTORS).tools["token_create"]
    answer = {"full-tokenid": "a@pve!t", "info": {"privsep": 1}, "value": "0f0e0d0c-aaaa-bbbb-cccc-000000000000"}
    base = {"dry_run": False, "redact": [], "max_items": 100}
    for obligations in (base, {**base, "reveal_secrets": False}):
        doc, warnings = shape(tool, dict(answer), obligations)
        assert doc["value"] == WITHHELD and "withheld by policy" in warnings[0]
        assert answer["value"] not in json.dumps(doc)
    doc, warnings = shape(tool, dict(answer), {**base, "reveal_secrets": True})
    assert doc["value"] == answer["value"] and warnings == []


async def test_reads_and_refusals(api: Api, sim: Any) -> None:
    realms = {r["realm"]: r for r in (await read(api, "list_realms", {}))["items"]}
    assert realms["pve"]["type"] == "pve" and realms["pam"]["type"] == "pam"
    tfa = {r["userid"]: r for r in (await read(api, "list_tfa", {}))["items"]}
    assert [e["type"] for e in tfa["ops@pve"]["entries"]] == ["totp", "recovery"]
    assert (await read(api, "get_user", {"userid": "ops@pve"}))["groups"] == ["operators"]
    # an agent may not change identities (deny rule), whatever role it holds; nothing is sent
    sim.clear_logs()
    agent = api.env.token("iam-agent", ["operator"], groups=["pve-admins"])
    res = await api.call(agent, "user_create", {"userid": "bot@pve"})
    assert outcome(res) == "denied" and "agents may not change users" in text(res)
    # a mistyped argument is refused by the gateway before anything reaches the policy or Proxmox
    res = await api.call(requester(api.env), "acl_set", {"path": "/vms", "roles": "PVEAuditor", "users": "a,b@pve"})
    assert res["isError"] and "users" in text(res)
    assert sent(sim) == []


def test_every_access_tool_is_here() -> None:
    catalog = Catalog.load(CONNECTORS)
    access = {t.name for t in catalog if t.domain == "access"}
    assert ACCESS_WRITES | ACCESS_READS | {"get_token_permissions"} == access
    for name in ACCESS_WRITES:
        tool = catalog.tools[name]
        assert tool.effect == "write" and tool.dry_run, name
    assert catalog.tools["user_create"].sensitive == ("password",)
    assert catalog.tools["token_create"].secret_output == ("value",)


@pytest.mark.parametrize("version", ["8.4", "9.1"])
def test_identity_privileges_come_from_the_schema(version: str) -> None:
    """pve-access-control's own checks (userid-group, userid-param, perm-modify) name privileges too."""
    catalog = Catalog.load(CONNECTORS)
    schema = PveSchema.load(schema_file(version, SHIPPED_DIR))
    assert check_catalog(catalog, schema) == []
    privs, _ = privileges(catalog.tools["token_create"], schema)
    assert [(p.path, p.privs) for p in privs] == [("/access/groups", ("User.Modify",))]
    privs, _ = privileges(catalog.tools["user_create"], schema)
    assert ("/access/realm/{realm}", ("Realm.AllocateUser",)) in [(p.path, p.privs) for p in privs]
    privs, _ = privileges(catalog.tools["acl_set"], schema)
    assert [(p.path, p.privs) for p in privs] == [("{path}", ("Permissions.Modify",))]
    reads = least_privilege(catalog, schema, ("read",))
    assert "get_user" in reads["Sys.Audit"] and "get_user" not in reads.get("User.Modify", [])  # audit suffices
    # user:all lists whose note offers alternatives ("'User.Modify' or 'Sys.Audit'"): the audit one
    assert {"list_users", "list_groups"} <= set(reads["Sys.Audit"]) and "list_groups" not in reads["User.Modify"]
    writes = least_privilege(catalog, schema, ("write",))
    assert {"acl_set", "acl_remove"} <= set(writes["Permissions.Modify"])
    assert "user_create" in writes["Realm.AllocateUser"]
