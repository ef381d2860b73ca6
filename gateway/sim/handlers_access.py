"""Users, groups, roles, ACL entries, API tokens, realms and TFA, as pve-access-control does them.

The ACL entries live where `auth.Acl` reads them (`User.acls`, `Cluster.groups`,
`Token.acls`), so a change made here takes effect on the next request. A token's
secret is returned once, by its create call; lists and gets never carry it. A
password is kept only as a hash (PVE keeps it in priv/shadow.cfg).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Any

from gateway.sim.auth import all_privileges, builtin_roles
from gateway.sim.errors import ApiError, perm_denied
from gateway.sim.routes import Ctx, route
from gateway.sim.state import AclEntry, Cluster, Token, User

# ACL paths PVE's check_path accepts (the subset the simulator models)
ACL_PATH = re.compile(
    r"^/(|access|access/groups|access/groups/[^/]+|access/realm|access/realm/[^/]+|nodes|nodes/[^/]+|pool|pool/[^/]+"
    r"|storage|storage/[^/]+|vms|vms/[0-9]+|sdn|sdn/zones(/[^/]+(/[^/]+)?)?|sdn/vnets(/[^/]+)?|mapping(/[a-z]+(/[^/]+)?)?)$"
)


def _list(value: Any) -> list[str]:
    return [x for x in re.split(r"[,;\s]+", str(value or "")) if x]


# ---- permission checks the schema expresses as userid-group / userid-param / perm-modify ----


def _user_group_ok(ctx: Ctx, userid: str, privs: list[str]) -> bool:
    """PVE's `userid-group`: the privileges on /access/groups, or on a group the user is in."""
    if ctx.can("/access/groups", *privs):
        return True
    user = ctx.rt.cluster.users.get(userid)
    return any(ctx.can(f"/access/groups/{g}", *privs) for g in (user.groups if user else []))


def _require_user_group(ctx: Ctx, userid: str, *privs: str) -> None:
    if not _user_group_ok(ctx, userid, list(privs)):
        raise perm_denied("/access/groups", "|".join(privs))


def _require_realm(ctx: Ctx, userid: str) -> None:
    """PVE's `userid-param Realm.AllocateUser`: on /access/realm/<the user's realm>."""
    realm = userid.rsplit("@", 1)[-1]
    ctx.require(f"/access/realm/{realm}", "Realm.AllocateUser")


def _self_or_user_modify(ctx: Ctx, userid: str) -> None:
    if ctx.principal.userid != userid:
        _require_user_group(ctx, userid, "User.Modify")


def _audit_visible(ctx: Ctx, userid: str) -> bool:
    return ctx.principal.userid == userid or _user_group_ok(ctx, userid, ["User.Modify", "Sys.Audit"])


# ---- users --------------------------------------------------------------------------


def _user(cl: Cluster, userid: str, failed: str = "") -> User:
    user = cl.users.get(userid)
    if user is None:
        raise ApiError(500, f"{failed}no such user ('{userid}')")
    return user


def _check_groups(cl: Cluster, groups: list[str], failed: str) -> None:
    for g in groups:
        if g not in cl.groups:
            raise ApiError(500, f"{failed}no such group '{g}'")


def _tokens_of(cl: Cluster, userid: str) -> list[Token]:
    return [t for t in cl.tokens.values() if t.userid == userid]


def _token_row(t: Token) -> dict[str, Any]:
    return {"tokenid": t.tokenid.split("!", 1)[1], "comment": t.comment, "expire": t.expire, "privsep": int(t.privsep)}


def user_view(cl: Cluster, u: User, full: bool = False) -> dict[str, Any]:
    realm = u.userid.rsplit("@", 1)[-1]
    rtype = next((r["type"] for r in cl.realms if r["realm"] == realm), realm)
    row: dict[str, Any] = {
        "userid": u.userid,
        "enable": int(u.enable),
        "expire": u.expire,
        "realm-type": rtype,
        "groups": ",".join(u.groups),
    }
    for k in ("email", "firstname", "lastname", "comment"):
        if getattr(u, k):
            row[k] = getattr(u, k)
    if full:
        row["tokens"] = [_token_row(t) for t in _tokens_of(cl, u.userid)]
    return row


@route("GET", "/access/users")
def get_users(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    enabled = ctx.params.get("enabled")
    rows = []
    for u in sorted(cl.users.values(), key=lambda u: u.userid):
        if not _audit_visible(ctx, u.userid):
            continue
        if enabled is not None and int(u.enable) != int(enabled):
            continue
        rows.append(user_view(cl, u, bool(ctx.params.get("full"))))
    return rows


@route("GET", "/access/users/{userid}")
def get_user(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    userid = str(ctx.params["userid"])
    _require_user_group(ctx, userid, "User.Modify", "Sys.Audit")
    u = _user(cl, userid)
    row = user_view(cl, u)
    row.pop("userid")
    row.pop("realm-type")
    row["groups"] = list(u.groups)
    row["tokens"] = {t.tokenid.split("!", 1)[1]: {k: v for k, v in _token_row(t).items() if k != "tokenid"}
                     for t in _tokens_of(cl, userid)}  # fmt: skip
    return row


def _realm_exists(cl: Cluster, userid: str, failed: str) -> None:
    realm = userid.rsplit("@", 1)[-1]
    if not any(r["realm"] == realm for r in cl.realms):
        raise ApiError(500, f"{failed}authentication domain '{realm}' does not exist")


@route("POST", "/access/users")
def post_user(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    p = ctx.params
    userid = str(p["userid"])
    groups = _list(p.get("groups"))
    _require_realm(ctx, userid)
    if groups:
        for g in groups:
            ctx.require(f"/access/groups/{g}", "User.Modify")
    failed = "create user failed: "
    if userid in cl.users:
        raise ApiError(500, f"{failed}user '{userid}' already exists")
    _realm_exists(cl, userid, failed)
    _check_groups(cl, groups, failed)
    user = User(userid=userid, groups=groups)
    _apply_user_fields(user, p)
    if p.get("password") is not None:
        if len(str(p["password"])) < 8:
            raise ApiError(500, f"{failed}minimum password length is 8")
        user.password_hash = hashlib.sha256(str(p["password"]).encode()).hexdigest()
    cl.users[userid] = user
    cl.touch()
    return None


def _apply_user_fields(user: User, p: dict[str, Any]) -> None:
    for k in ("email", "firstname", "lastname", "comment"):
        if k in p:
            setattr(user, k, str(p[k]))
    if "enable" in p:
        user.enable = bool(int(p["enable"]))
    if "expire" in p:
        user.expire = int(p["expire"])


@route("PUT", "/access/users/{userid}")
def put_user(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    p = ctx.params
    userid = str(p["userid"])
    _require_user_group(ctx, userid, "User.Modify")
    failed = "update user failed: "
    user = _user(cl, userid, failed)
    if "groups" in p:
        groups = _list(p["groups"])
        _check_groups(cl, groups, failed)
        user.groups = list(dict.fromkeys(user.groups + groups)) if p.get("append") else groups
    elif p.get("append"):
        raise ApiError(400, "Parameter verification failed.", {"append": "missing groups parameter"})
    _apply_user_fields(user, p)
    cl.touch()
    return None


@route("DELETE", "/access/users/{userid}")
def delete_user(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    userid = str(ctx.params["userid"])
    _require_realm(ctx, userid)
    _require_user_group(ctx, userid, "User.Modify")
    _user(cl, userid, "delete user failed: ")
    del cl.users[userid]
    for tid in [t.tokenid for t in _tokens_of(cl, userid)]:  # its tokens (and their ACLs) go with it
        del cl.tokens[tid]
    cl.tfa.pop(userid, None)
    cl.touch()
    return None


# ---- API tokens -------------------------------------------------------------------------


def _token(cl: Cluster, userid: str, name: str) -> Token:
    _user(cl, userid)
    tok = cl.tokens.get(f"{userid}!{name}")
    if tok is None:
        raise ApiError(500, f"no such token '{name}' for user '{userid}'")
    return tok


@route("GET", "/access/users/{userid}/token")
def get_tokens(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    userid = str(ctx.params["userid"])
    _self_or_user_modify(ctx, userid)
    _user(cl, userid)
    return [_token_row(t) for t in sorted(_tokens_of(cl, userid), key=lambda t: t.tokenid)]


@route("GET", "/access/users/{userid}/token/{tokenid}")
def get_token(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    userid = str(ctx.params["userid"])
    _self_or_user_modify(ctx, userid)
    row = _token_row(_token(cl, userid, str(ctx.params["tokenid"])))
    row.pop("tokenid")
    return row


@route("POST", "/access/users/{userid}/token/{tokenid}")
def post_token(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    p = ctx.params
    userid, name = str(p["userid"]), str(p["tokenid"])
    _self_or_user_modify(ctx, userid)
    user = _user(cl, userid)
    if f"{userid}!{name}" in cl.tokens:
        raise ApiError(500, "Token already exists.")
    expire = int(p["expire"]) if "expire" in p else user.expire  # default: same as the user
    if user.expire and (expire == 0 or expire > user.expire):
        raise ApiError(500, "Token expiration date cannot be after the user's expiration date")
    tok = Token(
        name=name,
        tokenid=f"{userid}!{name}",
        secret=str(uuid.uuid4()),
        privsep=bool(int(p.get("privsep", 1))),
        expire=expire,
        comment=str(p.get("comment", "")),
    )
    cl.tokens[tok.tokenid] = tok
    cl.touch()
    info = {k: v for k, v in _token_row(tok).items() if k != "tokenid"}
    return {"full-tokenid": tok.tokenid, "info": info, "value": tok.secret}


@route("PUT", "/access/users/{userid}/token/{tokenid}")
def put_token(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    p = ctx.params
    userid = str(p["userid"])
    _self_or_user_modify(ctx, userid)
    tok = _token(cl, userid, str(p["tokenid"]))
    if "comment" in p:
        tok.comment = str(p["comment"])
    if "expire" in p:
        tok.expire = int(p["expire"])
    if "privsep" in p:
        tok.privsep = bool(int(p["privsep"]))
    cl.touch()
    row = _token_row(tok)
    row.pop("tokenid")
    return row


@route("DELETE", "/access/users/{userid}/token/{tokenid}")
def delete_token(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    userid = str(ctx.params["userid"])
    _self_or_user_modify(ctx, userid)
    tok = _token(cl, userid, str(ctx.params["tokenid"]))
    del cl.tokens[tok.tokenid]
    cl.touch()
    return None


# ---- groups -------------------------------------------------------------------------------


def _members(cl: Cluster, groupid: str) -> list[str]:
    return sorted(u.userid for u in cl.users.values() if groupid in u.groups)


@route("GET", "/access/groups")
def get_groups(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    rows = []
    for g in sorted(cl.groups):
        if not ctx.can(f"/access/groups/{g}", "User.Modify", "Sys.Audit", "Group.Allocate"):
            continue
        row: dict[str, Any] = {"groupid": g, "users": ",".join(_members(cl, g))}
        if cl.group_comments.get(g):
            row["comment"] = cl.group_comments[g]
        rows.append(row)
    return rows


def _group(cl: Cluster, groupid: str, failed: str = "") -> str:
    if groupid not in cl.groups:
        raise ApiError(500, f"{failed}no such group '{groupid}'")
    return groupid


@route("GET", "/access/groups/{groupid}")
def get_group(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    g = _group(cl, str(ctx.params["groupid"]))
    row: dict[str, Any] = {"members": _members(cl, g)}
    if cl.group_comments.get(g):
        row["comment"] = cl.group_comments[g]
    return row


@route("POST", "/access/groups")
def post_group(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    g = str(ctx.params["groupid"])
    if g in cl.groups:
        raise ApiError(500, f"create group failed: group '{g}' already exists")
    cl.groups[g] = []
    cl.group_comments[g] = str(ctx.params.get("comment", ""))
    cl.touch()
    return None


@route("PUT", "/access/groups/{groupid}")
def put_group(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    g = _group(cl, str(ctx.params["groupid"]), "update group failed: ")
    if "comment" in ctx.params:
        cl.group_comments[g] = str(ctx.params["comment"])
    cl.touch()
    return None


@route("DELETE", "/access/groups/{groupid}")
def delete_group(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    g = _group(cl, str(ctx.params["groupid"]), "delete group failed: ")
    del cl.groups[g]  # its ACL entries go with it
    cl.group_comments.pop(g, None)
    for u in cl.users.values():
        if g in u.groups:
            u.groups.remove(g)
    cl.touch()
    return None


# ---- roles ------------------------------------------------------------------------------------


def _all_roles(cl: Cluster) -> dict[str, tuple[set[str], bool]]:
    """roleid -> (privileges, special): the built-in roles, then the cluster's own."""
    roles = {k: (v, True) for k, v in builtin_roles(cl.major).items()}
    roles.update({k: (set(v), False) for k, v in cl.roles.items()})
    return roles


def _privs(cl: Cluster, spec: Any) -> list[str]:
    known = set(all_privileges(cl.major))
    out = []
    for priv in _list(spec):
        if priv not in known:
            raise ApiError(500, f"invalid privilege '{priv}'")
        out.append(priv)
    return sorted(set(out))


@route("GET", "/access/roles")
def get_roles(ctx: Ctx) -> Any:
    return [
        {"roleid": r, "privs": ",".join(sorted(privs)), "special": int(special)}
        for r, (privs, special) in sorted(_all_roles(ctx.rt.cluster).items())
    ]


@route("GET", "/access/roles/{roleid}")
def get_role(ctx: Ctx) -> Any:
    r = str(ctx.params["roleid"])
    roles = _all_roles(ctx.rt.cluster)
    if r not in roles:
        raise ApiError(500, f"role '{r}' does not exist")
    return {p: 1 for p in sorted(roles[r][0])}


def _custom_role(cl: Cluster, r: str, failed: str) -> list[str]:
    if r in builtin_roles(cl.major):
        raise ApiError(500, f"{failed}cannot modify built-in role '{r}'")
    if r not in cl.roles:
        raise ApiError(500, f"{failed}role '{r}' does not exist")
    return cl.roles[r]


@route("POST", "/access/roles")
def post_role(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    r = str(ctx.params["roleid"])
    failed = "create role failed: "
    if r.startswith("PVE") or r in builtin_roles(cl.major):
        raise ApiError(500, f"{failed}cannot use role ID starting with 'PVE' or of a built-in role ('{r}')")
    if r in cl.roles:
        raise ApiError(500, f"{failed}role '{r}' already exists")
    cl.roles[r] = _privs(cl, ctx.params.get("privs"))
    ctx.rt.acl._roles_cache = None  # the role table changed
    cl.touch()
    return None


@route("PUT", "/access/roles/{roleid}")
def put_role(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    r = str(ctx.params["roleid"])
    failed = "update role failed: "
    current = _custom_role(cl, r, failed)
    new = _privs(cl, ctx.params.get("privs"))
    cl.roles[r] = sorted(set(current) | set(new)) if ctx.params.get("append") else new
    ctx.rt.acl._roles_cache = None
    cl.touch()
    return None


@route("DELETE", "/access/roles/{roleid}")
def delete_role(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    r = str(ctx.params["roleid"])
    _custom_role(cl, r, "delete role failed: ")
    del cl.roles[r]
    for acls in _acl_lists(cl):  # PVE drops the role from every ACL entry
        for a in list(acls):
            if r in a.roles:
                a.roles.remove(r)
                if not a.roles:
                    acls.remove(a)
    ctx.rt.acl._roles_cache = None
    cl.touch()
    return None


# ---- ACL entries -------------------------------------------------------------------------------


def _acl_lists(cl: Cluster) -> list[list[AclEntry]]:
    return [u.acls for u in cl.users.values()] + list(cl.groups.values()) + [t.acls for t in cl.tokens.values()]


@route("GET", "/access/acl")
def get_acl(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    subjects: list[tuple[str, str, list[AclEntry]]] = (
        [("user", u.userid, u.acls) for u in cl.users.values()]
        + [("group", g, acls) for g, acls in cl.groups.items()]
        + [("token", t.tokenid, t.acls) for t in cl.tokens.values()]
    )
    rows = []
    for kind, ugid, acls in subjects:
        for a in acls:
            if not ctx.can(a.path, "Permissions.Modify"):  # PVE: only where you could modify them
                continue
            for role in a.roles:
                rows.append({"path": a.path, "type": kind, "ugid": ugid, "roleid": role, "propagate": int(a.propagate)})
    return sorted(rows, key=lambda r: (r["path"], r["type"], r["ugid"], r["roleid"]))


@route("PUT", "/access/acl")
def put_acl(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    p = ctx.params
    path = str(p["path"])
    if not ACL_PATH.match(path):
        raise ApiError(500, f"invalid ACL path '{path}'")
    ctx.require(path, "Permissions.Modify")
    roles = _list(p["roles"])
    known = _all_roles(cl)
    for r in roles:
        if r not in known:
            raise ApiError(500, f"role '{r}' does not exist")
    targets: list[list[AclEntry]] = []
    for u in _list(p.get("users")):
        if u not in cl.users:
            raise ApiError(500, f"user '{u}' does not exist")
        targets.append(cl.users[u].acls)
    for g in _list(p.get("groups")):
        if g not in cl.groups:
            raise ApiError(500, f"group '{g}' does not exist")
        targets.append(cl.groups[g])
    for t in _list(p.get("tokens")):
        if t not in cl.tokens:
            raise ApiError(500, f"token '{t}' does not exist")
        targets.append(cl.tokens[t].acls)
    if not targets:
        raise ApiError(500, "either 'users', 'groups' or 'tokens' is required")
    propagate = bool(int(p.get("propagate", 1)))
    for acls in targets:
        entry = next((a for a in acls if a.path == path), None)
        if p.get("delete"):
            if entry is not None:
                entry.roles = [r for r in entry.roles if r not in roles]
                if not entry.roles:
                    acls.remove(entry)
        elif entry is None:
            acls.append(AclEntry(path=path, roles=list(roles), propagate=propagate))
        else:
            entry.roles = list(dict.fromkeys(entry.roles + roles))
            entry.propagate = propagate
    cl.touch()
    return None


# ---- realms and second factors ----------------------------------------------------------------


@route("GET", "/access/domains")
def get_domains(ctx: Ctx) -> Any:
    return [dict(r) for r in ctx.rt.cluster.realms]


@route("GET", "/access/tfa")
def get_tfa(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    return [
        {"userid": u, "entries": [dict(e) for e in entries]}
        for u, entries in sorted(cl.tfa.items())
        if u in cl.users and _audit_visible(ctx, u)
    ]


@route("GET", "/access/tfa/{userid}")
def get_user_tfa(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    userid = str(ctx.params["userid"])
    if ctx.principal.userid != userid:
        _require_user_group(ctx, userid, "User.Modify", "Sys.Audit")
    _user(cl, userid)
    return [dict(e) for e in cl.tfa.get(userid, [])]
