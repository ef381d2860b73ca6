"""API-token authentication and ACL evaluation, modelled on pve-access-control.

Rules implemented (as PVE does them): deeper ACL paths override shallower ones,
`propagate=0` stops inheritance, `NoAccess` cancels, a pool ACL applies to the
pool's guests, privsep tokens get (token ACLs ∩ user permissions), root@pam is
all-powerful as a user (and a privsep=0 root token inherits that).
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass

from gateway.sim.state import AclEntry, Cluster, Token

VM_PRIVS = [
    "VM.Allocate",
    "VM.Audit",
    "VM.Backup",
    "VM.Clone",
    "VM.Config.CDROM",
    "VM.Config.CPU",
    "VM.Config.Cloudinit",
    "VM.Config.Disk",
    "VM.Config.HWType",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",
    "VM.Console",
    "VM.Migrate",
    "VM.PowerMgmt",
    "VM.Snapshot",
    "VM.Snapshot.Rollback",
]
VM_PRIVS_9 = [
    "VM.GuestAgent.Audit",
    "VM.GuestAgent.FileRead",
    "VM.GuestAgent.FileWrite",
    "VM.GuestAgent.FileSystemMgmt",
    "VM.GuestAgent.Unrestricted",
    "VM.Replicate",
]
SYS_PRIVS = [
    "Sys.Audit",
    "Sys.Console",
    "Sys.Syslog",
    "Sys.Modify",
    "Sys.PowerMgmt",
    "Sys.Incoming",
    "Sys.AccessNetwork",
]
DS_PRIVS = ["Datastore.Audit", "Datastore.AllocateSpace", "Datastore.AllocateTemplate", "Datastore.Allocate"]
SDN_PRIVS = ["SDN.Audit", "SDN.Use", "SDN.Allocate"]
OTHER_PRIVS = [
    "Pool.Audit",
    "Pool.Allocate",
    "User.Modify",
    "Group.Allocate",
    "Realm.Allocate",
    "Realm.AllocateUser",
    "Permissions.Modify",
    "Mapping.Audit",
    "Mapping.Use",
    "Mapping.Modify",
]


def all_privileges(major: int) -> list[str]:
    vm = VM_PRIVS + (VM_PRIVS_9 if major >= 9 else ["VM.Monitor"])
    return vm + SYS_PRIVS + DS_PRIVS + SDN_PRIVS + OTHER_PRIVS


def builtin_roles(major: int) -> dict[str, set[str]]:
    allp = set(all_privileges(major))
    audit = {p for p in allp if p.endswith(".Audit")}
    vm_user = {"VM.Audit", "VM.Console", "VM.Backup", "VM.PowerMgmt", "VM.Config.CDROM", "VM.Config.Cloudinit"}
    vm_admin = {p for p in allp if p.startswith("VM.")}
    return {
        "Administrator": allp,
        "NoAccess": set(),
        "PVEAuditor": audit,
        "PVEVMUser": vm_user | audit & {"VM.Audit"},
        "PVEVMAdmin": vm_admin,
        "PVEDatastoreUser": {"Datastore.Audit", "Datastore.AllocateSpace"},
        "PVEDatastoreAdmin": set(DS_PRIVS),
        "PVESysAdmin": {p for p in SYS_PRIVS if p != "Sys.PowerMgmt"} | {"Sys.PowerMgmt"},
        "PVEPoolUser": {"Pool.Audit"},
        "PVEPoolAdmin": {"Pool.Audit", "Pool.Allocate"},
        "PVETemplateUser": {"VM.Clone", "VM.Audit"},
        "PVEAdmin": allp - {"Mapping.Modify", "Permissions.Modify", "Realm.Allocate"},
    }


@dataclass(frozen=True)
class Principal:
    tokenid: str
    token: Token

    @property
    def userid(self) -> str:
        return self.token.userid


def parse_auth_header(value: str | None) -> tuple[str, str] | None:
    """`PVEAPIToken=USER@REALM!TOKENID=SECRET`; the secret follows the last '='."""
    if not value:
        return None
    value = value.strip()
    if not value.startswith("PVEAPIToken="):
        return None
    rest = value[len("PVEAPIToken=") :]
    if "=" not in rest:
        return None
    tokenid, secret = rest.rsplit("=", 1)
    if "!" not in tokenid or "@" not in tokenid:
        return None
    return tokenid, secret


def authenticate(cluster: Cluster, header: str | None) -> Principal | None:
    parsed = parse_auth_header(header)
    if parsed is None:
        return None
    tokenid, secret = parsed
    tok = cluster.tokens.get(tokenid)
    if tok is None or not hmac.compare_digest(tok.secret, secret):
        return None
    if tok.expire and tok.expire < time.time():
        return None
    return Principal(tokenid=tokenid, token=tok)


class Acl:
    """Effective-permission calculator for one cluster (cached per state version)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._cache: dict[tuple[str, str, bool], frozenset[str]] = {}
        self._cache_version = -1
        self._roles_cache: dict[str, set[str]] | None = None

    def _roles(self) -> dict[str, set[str]]:
        if self._roles_cache is None:
            roles = builtin_roles(self.cluster.major)
            roles.update({k: set(v) for k, v in self.cluster.roles.items()})
            self._roles_cache = roles
        return self._roles_cache

    def _tree_flags(self, acls: list[AclEntry], path: str) -> dict[str, int] | None:
        """Privileges from a list of ACL entries for `path`, each with its propagate flag (as
        PVE's permissions() answers it: 1 when a role granting it on the deciding path
        propagates; an inherited one always does); None if no entry applies."""
        roles = self._roles()
        parts = [p for p in path.split("/") if p]
        result: dict[str, int] | None = None
        for depth in range(len(parts) + 1):
            prefix = "/" + "/".join(parts[:depth])
            exact = depth == len(parts)
            found: dict[str, int] | None = None
            for a in acls:
                if a.path.rstrip("/") == prefix.rstrip("/") or (a.path == "/" and prefix == "/"):
                    if not exact and not a.propagate:
                        continue
                    privs: dict[str, int] = {}
                    for r in a.roles:
                        if r == "NoAccess":
                            privs = {}
                            break
                        for priv in roles.get(r, set()):
                            privs[priv] = privs.get(priv, 0) or int(a.propagate)
                    if found is None:
                        found = privs
                    else:
                        for priv, flag in privs.items():
                            found[priv] = found.get(priv, 0) or flag
            if found is not None:
                result = found  # deeper path overrides shallower
        return result

    def _tree_privs(self, acls: list[AclEntry], path: str) -> set[str] | None:
        """Privileges from a list of ACL entries for `path`; None if no entry applies."""
        flags = self._tree_flags(acls, path)
        return None if flags is None else set(flags)

    def _subject_flags(self, acls: list[AclEntry], path: str) -> dict[str, int]:
        flags = dict(self._tree_flags(acls, path) or {})
        pools: list[str] = []
        m = path.split("/")
        if len(m) == 3 and m[1] == "vms" and m[2].isdigit():
            pool = self.cluster.pool_of(int(m[2]))
            if pool:
                pools.append(pool)
        if len(m) == 3 and m[1] == "storage":
            pools += [p.id for p in self.cluster.pools.values() if m[2] in p.storages]
        for pool in pools:
            for priv in self._tree_privs(acls, f"/pool/{pool}") or set():
                flags.setdefault(priv, 0)  # a pool's ACL reaches its members, never propagated (PVE)
        return flags

    def _subject_privs(self, acls: list[AclEntry], path: str) -> set[str]:
        return set(self._subject_flags(acls, path))

    def _user_acls(self, userid: str) -> list[AclEntry] | None:
        user = self.cluster.users.get(userid)
        if user is None:
            return None
        acls = list(user.acls)
        for g in user.groups:
            # user ACLs override group ACLs: put group entries first, tree merge keeps the union per level
            acls = list(self.cluster.groups.get(g, [])) + acls
        return acls

    def user_flags(self, userid: str, path: str) -> dict[str, int]:
        if userid == "root@pam":
            return dict.fromkeys(all_privileges(self.cluster.major), 1)
        acls = self._user_acls(userid)
        return {} if acls is None else self._subject_flags(acls, path)

    def user_privs(self, userid: str, path: str) -> set[str]:
        return set(self.user_flags(userid, path))

    def privs(self, principal: Principal, path: str) -> frozenset[str]:
        if self._cache_version != self.cluster.version_counter:
            self._cache.clear()
            self._cache_version = self.cluster.version_counter
        key = (principal.tokenid, path, principal.token.privsep)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        user = self.user_privs(principal.userid, path)
        if principal.token.privsep:
            eff = self._subject_privs(principal.token.acls, path) & user
        else:
            eff = user
        out = frozenset(eff)
        self._cache[key] = out
        return out

    def has(self, principal: Principal, path: str, priv: str) -> bool:
        return priv in self.privs(principal, path)

    def any(self, principal: Principal, path: str, privs: list[str]) -> bool:
        have = self.privs(principal, path)
        return any(p in have for p in privs)

    def priv_flags(self, principal: Principal, path: str) -> dict[str, int]:
        """The principal's privileges on `path` with their propagate flags (a privsep token's: the
        privileges it shares with its user, propagated where both propagate, as PVE intersects them)."""
        user = self.user_flags(principal.userid, path)
        if not principal.token.privsep:
            return user
        token = self._subject_flags(principal.token.acls, path)
        return {k: int(bool(user[k] and flag)) for k, flag in token.items() if k in user}

    def permissions_map(self, principal: Principal, path: str | None) -> dict[str, dict[str, int]]:
        """`GET /access/permissions` shape: path -> privilege -> propagate flag."""
        paths = [path] if path else self._interesting_paths()
        out: dict[str, dict[str, int]] = {}
        for p in paths:
            flags = self.priv_flags(principal, p)
            if flags:
                out[p] = dict(sorted(flags.items()))
        return out

    def _interesting_paths(self) -> list[str]:
        """The paths PVE's get_effective_permissions answers for: the top-level ones, every ACL path
        of the cluster (anyone's), and the guests and storages of every pool."""
        paths = {"/", "/access", "/access/groups", "/nodes", "/pool", "/sdn", "/storage", "/vms", "/mapping"}
        entries = [a for u in self.cluster.users.values() for a in u.acls]
        entries += [a for acls in self.cluster.groups.values() for a in acls]
        entries += [a for t in self.cluster.tokens.values() for a in t.acls]
        paths.update(a.path for a in entries)
        paths.update(f"/vms/{g.vmid}" for g in self.cluster.guests.values() if g.pool)
        paths.update(f"/storage/{sid}" for p in self.cluster.pools.values() for sid in p.storages)
        return sorted(paths)
