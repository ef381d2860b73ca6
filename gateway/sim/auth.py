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

    def _tree_privs(self, acls: list[AclEntry], path: str) -> set[str] | None:
        """Privileges from a list of ACL entries for `path`; None if no entry applies."""
        roles = self._roles()
        parts = [p for p in path.split("/") if p]
        result: set[str] | None = None
        for depth in range(len(parts) + 1):
            prefix = "/" + "/".join(parts[:depth])
            exact = depth == len(parts)
            found: set[str] | None = None
            for a in acls:
                if a.path.rstrip("/") == prefix.rstrip("/") or (a.path == "/" and prefix == "/"):
                    if not exact and not a.propagate:
                        continue
                    privs: set[str] = set()
                    for r in a.roles:
                        if r == "NoAccess":
                            privs = set()
                            break
                        privs |= roles.get(r, set())
                    found = privs if found is None else found | privs
            if found is not None:
                result = found  # deeper path overrides shallower
        return result

    def _subject_privs(self, acls: list[AclEntry], path: str) -> set[str]:
        privs = self._tree_privs(acls, path) or set()
        m = path.split("/")
        if len(m) == 3 and m[1] == "vms" and m[2].isdigit():
            pool = self.cluster.pool_of(int(m[2]))
            if pool:
                privs |= self._tree_privs(acls, f"/pool/{pool}") or set()
        if len(m) == 3 and m[1] == "storage":
            for p in self.cluster.pools.values():
                if m[2] in p.storages:
                    privs |= self._tree_privs(acls, f"/pool/{p.id}") or set()
        return privs

    def user_privs(self, userid: str, path: str) -> set[str]:
        if userid == "root@pam":
            return set(all_privileges(self.cluster.major))
        user = self.cluster.users.get(userid)
        if user is None:
            return set()
        acls = list(user.acls)
        for g in user.groups:
            # user ACLs override group ACLs: put group entries first, tree merge keeps the union per level
            acls = list(self.cluster.groups.get(g, [])) + acls
        return self._subject_privs(acls, path)

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

    def permissions_map(self, principal: Principal, path: str | None) -> dict[str, dict[str, int]]:
        """`GET /access/permissions` shape: path -> privilege -> propagate flag."""
        paths = [path] if path else self._interesting_paths(principal)
        out: dict[str, dict[str, int]] = {}
        for p in paths:
            privs = self.privs(principal, p)
            if privs:
                out[p] = {k: 1 for k in sorted(privs)}
        return out

    def _interesting_paths(self, principal: Principal) -> list[str]:
        paths = {"/", "/vms", "/nodes", "/storage", "/access", "/pool", "/sdn", "/mapping"}
        user = self.cluster.users.get(principal.userid)
        for a in principal.token.acls + (user.acls if user else []):
            paths.add(a.path)
        for pool in self.cluster.pools.values():
            if f"/pool/{pool.id}" in paths:
                paths.update(f"/vms/{g.vmid}" for g in self.cluster.guests.values() if g.pool == pool.id)
        return sorted(paths)
