"""A real, throw-away Keycloak (OpenID Connect provider) for the tests and `pvegate demo --idp`: loopback only.

`start_keycloak()` runs the Keycloak that `scripts/provision-keycloak.sh` (`make tools`) put in
.tools/keycloak-<KEYCLOAK_VERSION> with the JDK it recorded there (Keycloak 26 needs Java 21+),
as `kc.sh start --optimized` on 127.0.0.1:<free port> with an in-memory H2 database. The shared
install was built once by the provisioning script; each server gets its own home folder in a
temp dir (its own bin/ and conf/, the install's lib/, themes/, providers/ linked), so concurrent
sessions never write to the install or to each other's data.

Then `provision_realm()` creates realm `pvegate` through the admin REST API, as an operator
would (see docs/identity.md), with:
  users   alice (realm role approver, group sre-leads), bob (realm role viewer, no group)
  clients pvegate-agent   confidential, client credentials only (service account, role operator)
          pvegate-console public, authorization code + PKCE (S256) only, loopback redirect URIs
          pvegate-tests   public, password grant only: for non-browser tests, never a recipe
and the two mappers a plain realm needs for pvegate: an audience mapper (the gateway's audience)
in client scope `pvegate:tools`, a default scope of every client, and on every client the
standard group-membership mapper (`groups`, full paths such as `/sre-leads`). Nothing else is
custom: roles come from Keycloak's own `realm_access.roles`, the client id from `azp`, a human
from the login session's `sid`.

No orphans: the JVM gets PR_SET_PDEATHSIG(SIGTERM) (kc.sh execs java, the setting survives
exec), so a test process killed even by SIGKILL takes its Keycloak with it; `stop()` does the
same on purpose and removes the folder.

`python -m gateway.dev.keycloak` (or `python -m tests.kcserver`) starts one for a browser by hand and
prints what to use; `pvegate demo --idp` starts one with the simulator, OPA and a gateway trusting it.
It lives in the dev layer (not tests/) because the demo uses it; tests/kcserver.py re-exports it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gateway.core import processes
from gateway.dev.devenv import AUDIENCE
from gateway.dev.procs import StartFailed, spawn_logged, start_on_free_port

KEYCLOAK_VERSION = "26.5.6"  # pinned with its SHA-512 in scripts/provision-keycloak.sh
REALM = "pvegate"
AGENT_CLIENT = "pvegate-agent"
CONSOLE_CLIENT = "pvegate-console"
TESTS_CLIENT = "pvegate-tests"
SCOPE = "pvegate:tools"  # the client scope that puts the gateway's audience in tokens
DEFAULT_AUDIENCE = AUDIENCE  # make_env gateways accept these tokens
# Keycloak matches a redirect URI ending in `*` as a prefix: any loopback port and path.
CONSOLE_REDIRECT_URIS = ("http://127.0.0.1:*", "https://127.0.0.1:*", "http://localhost:*", "https://localhost:*")
_ROOT = Path(__file__).resolve().parents[2]  # the repo: .tools/ is provisioned there


class KeycloakUnavailable(RuntimeError):
    """Keycloak is not provisioned (run `make tools`) or did not start."""


def install_dir() -> Path:
    home = _ROOT / ".tools" / f"keycloak-{KEYCLOAK_VERSION}"
    if not (home / ".pvegate-built").is_file():
        raise KeycloakUnavailable(f"Keycloak {KEYCLOAK_VERSION} is not provisioned in {home}: run `make tools`")
    return home


def java_home(install: Path) -> Path:
    recorded = Path((install / ".java_home").read_text().strip())
    if not (recorded / "bin" / "java").is_file():
        raise KeycloakUnavailable(f"the JDK recorded for Keycloak ({recorded}) is gone: run `make tools`")
    return recorded


@dataclass(frozen=True)
class User:
    username: str
    password: str
    roles: tuple[str, ...]
    groups: tuple[str, ...]


@dataclass
class KeycloakServer:
    root: Path
    port: int
    proc: subprocess.Popen[bytes]
    admin_password: str
    started_in: float  # seconds from launch to the first answered discovery request
    admin_user: str = "admin"
    realm: str = REALM
    audience: str = DEFAULT_AUDIENCE
    agent_secret: str = ""
    users: dict[str, User] = field(default_factory=dict)
    provisioned_in: float = 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def issuer(self) -> str:
        return f"{self.base_url}/realms/{self.realm}"

    @property
    def jwks_url(self) -> str:
        return f"{self.issuer}/protocol/openid-connect/certs"

    @property
    def token_url(self) -> str:
        return f"{self.issuer}/protocol/openid-connect/token"

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    @property
    def admin_url(self) -> str:
        return f"{self.base_url}/admin/realms/{self.realm}"

    def auth_config(self) -> dict[str, Any]:
        """The gateway's `auth` section for tokens of this realm (e.g. make_env(extra={"auth": ...}))."""
        return {"issuer": self.issuer, "audience": self.audience, "jwks_url": self.jwks_url, "algorithms": ["RS256"]}

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "keycloak.log").read_text(errors="replace")
        return ""

    def stop(self) -> None:
        processes.stop(self.proc, grace=20)
        shutil.rmtree(self.root, ignore_errors=True)

    # ---- tokens -------------------------------------------------------------------------------

    def _token(self, form: dict[str, str]) -> dict[str, Any]:
        r = httpx.post(self.token_url, data=form, timeout=30)
        if r.status_code != 200:
            raise AssertionError(f"token request refused ({r.status_code}): {r.text[:500]}")
        doc: dict[str, Any] = r.json()
        return doc

    def client_credentials_token(self, client_id: str = AGENT_CLIENT, secret: str | None = None) -> str:
        """An agent's access token: the client credentials grant of a confidential client."""
        form = {"grant_type": "client_credentials", "client_id": client_id}
        form["client_secret"] = secret or self.agent_secret
        return str(self._token(form)["access_token"])

    def password_token(self, username: str, password: str | None = None) -> str:
        """A human's access token through the test-only password-grant client (non-browser tests only;
        the real human path, authorization code + PKCE through the login form, is the browser test's)."""
        pw = password if password is not None else self.users[username].password
        form = {"grant_type": "password", "client_id": TESTS_CLIENT, "username": username, "password": pw}
        form["scope"] = "openid"
        return str(self._token(form)["access_token"])

    # ---- admin REST API -----------------------------------------------------------------------

    def admin_token(self) -> str:
        form = {
            "grant_type": "password",
            "client_id": "admin-cli",
            "username": self.admin_user,
            "password": self.admin_password,
        }
        r = httpx.post(f"{self.base_url}/realms/master/protocol/openid-connect/token", data=form, timeout=30)
        r.raise_for_status()
        return str(r.json()["access_token"])

    def admin(self) -> httpx.Client:
        """An httpx client authorised for the admin REST API, based at /admin/realms/<realm>."""
        return httpx.Client(
            base_url=self.admin_url, headers={"authorization": f"Bearer {self.admin_token()}"}, timeout=30
        )

    def client_uuid(self, admin: httpx.Client, client_id: str) -> str:
        r = admin.get("/clients", params={"clientId": client_id})
        r.raise_for_status()
        return str(r.json()[0]["id"])

    def other_realm(self, realm: str) -> KeycloakServer:
        """The same server seen through another realm (provision it with provision_realm): tests
        that change a realm's keys or clients do it in their own, not in the session's."""
        return dataclasses.replace(self, realm=realm, users={}, agent_secret="")

    def signing_keys(self) -> list[dict[str, Any]]:
        """The realm's RSA signing key providers (admin API components), highest priority first."""
        with self.admin() as admin:
            realm_id = admin.get("").json()["id"]
            r = admin.get("/components", params={"type": "org.keycloak.keys.KeyProvider", "parent": realm_id})
            r.raise_for_status()
        keys = [c for c in r.json() if c.get("providerId") == "rsa-generated"]
        return sorted(keys, key=lambda c: -int(c["config"].get("priority", ["0"])[0]))

    def add_signing_key(self, name: str, priority: int) -> str:
        """A new generated RS256 key; with the highest priority, the realm signs with it from now on."""
        with self.admin() as admin:
            realm_id = admin.get("").json()["id"]
            component = {
                "name": name,
                "providerId": "rsa-generated",
                "providerType": "org.keycloak.keys.KeyProvider",
                "parentId": realm_id,
                "config": {
                    "priority": [str(priority)],
                    "enabled": ["true"],
                    "active": ["true"],
                    "algorithm": ["RS256"],
                    "keySize": ["2048"],
                },
            }
            r = admin.post("/components", json=component)
            r.raise_for_status()
            return str(r.headers["location"].rsplit("/", 1)[-1])

    def remove_signing_key(self, component_id: str) -> None:
        with self.admin() as admin:
            admin.delete(f"/components/{component_id}").raise_for_status()

    def set_redirect_uris(self, client_id: str, uris: list[str]) -> None:
        """Replace a client's allowed redirect URIs (e.g. the console's exact callback)."""
        with self.admin() as admin:
            cid = self.client_uuid(admin, client_id)
            rep = admin.get(f"/clients/{cid}").json()
            rep["redirectUris"] = uris
            admin.put(f"/clients/{cid}", json=rep).raise_for_status()


def _audience_mapper(audience: str) -> dict[str, Any]:
    return {
        "name": "pvegate-audience",
        "protocol": "openid-connect",
        "protocolMapper": "oidc-audience-mapper",
        "config": {
            "included.custom.audience": audience,
            "access.token.claim": "true",
            "id.token.claim": "false",
            "introspection.token.claim": "true",
        },
    }


def _mappers() -> list[dict[str, Any]]:
    return [
        {
            "name": "groups",
            "protocol": "openid-connect",
            "protocolMapper": "oidc-group-membership-mapper",
            "config": {
                "claim.name": "groups",
                "full.path": "true",
                "access.token.claim": "true",
                "id.token.claim": "true",
                "userinfo.token.claim": "true",
                "introspection.token.claim": "true",
            },
        },
    ]


def realm_representation(
    audience: str, agent_secret: str, users: dict[str, User], redirect_uris: tuple[str, ...], realm: str = REALM
) -> dict[str, Any]:
    roles = sorted({r for u in users.values() for r in u.roles} | {"operator"})
    groups = sorted({g for u in users.values() for g in u.groups} | {"ops-approvers", "team-web"})
    return {
        "realm": realm,
        "enabled": True,
        "accessTokenLifespan": 600,
        "ssoSessionIdleTimeout": 1800,
        "roles": {"realm": [{"name": r} for r in roles]},
        "groups": [{"name": g} for g in groups],
        "users": [
            {
                "username": u.username,
                "enabled": True,
                "email": f"{u.username}@example.test",
                "emailVerified": True,
                "firstName": u.username.capitalize(),
                "lastName": "Example",
                "credentials": [{"type": "password", "value": u.password, "temporary": False}],
                "realmRoles": [f"default-roles-{realm}", *u.roles],
                "groups": [f"/{g}" for g in u.groups],
            }
            for u in users.values()
        ]
        + [
            {
                "username": f"service-account-{AGENT_CLIENT}",
                "enabled": True,
                "serviceAccountClientId": AGENT_CLIENT,
                "realmRoles": [f"default-roles-{realm}", "operator"],
            }
        ],
        "clients": [
            {
                "clientId": AGENT_CLIENT,
                "name": "pvegate test agent",
                "enabled": True,
                "publicClient": False,
                "clientAuthenticatorType": "client-secret",
                "secret": agent_secret,
                "serviceAccountsEnabled": True,
                "standardFlowEnabled": False,
                "directAccessGrantsEnabled": False,
                "protocolMappers": _mappers(),
            },
            {
                "clientId": CONSOLE_CLIENT,
                "name": "pvegate admin console",
                "enabled": True,
                "publicClient": True,
                "standardFlowEnabled": True,
                "directAccessGrantsEnabled": False,
                "redirectUris": list(redirect_uris),
                "webOrigins": ["+"],
                "attributes": {"pkce.code.challenge.method": "S256", "post.logout.redirect.uris": "+"},
                "protocolMappers": _mappers(),
            },
            {
                "clientId": TESTS_CLIENT,
                "name": "pvegate non-browser tests (password grant)",
                "enabled": True,
                "publicClient": True,
                "standardFlowEnabled": False,
                "directAccessGrantsEnabled": True,
                "protocolMappers": _mappers(),
            },
        ],
    }


DEFAULT_USERS = {
    "alice": User("alice", "alice-password", ("approver",), ("sre-leads",)),
    "bob": User("bob", "bob-password", ("viewer",), ()),
}


def provision_realm(
    kc: KeycloakServer,
    *,
    audience: str = DEFAULT_AUDIENCE,
    users: dict[str, User] | None = None,
    redirect_uris: tuple[str, ...] = CONSOLE_REDIRECT_URIS,
) -> None:
    """Create realm `kc.realm` through the admin REST API (one POST of the realm representation)."""
    t0 = time.monotonic()
    kc.audience = audience
    kc.users = dict(users or DEFAULT_USERS)
    kc.agent_secret = secrets.token_urlsafe(24)
    rep = realm_representation(audience, kc.agent_secret, kc.users, redirect_uris, kc.realm)
    r = httpx.post(
        f"{kc.base_url}/admin/realms",
        json=rep,
        headers={"authorization": f"Bearer {kc.admin_token()}"},
        timeout=60,
    )
    if r.status_code != 201:
        raise KeycloakUnavailable(f"creating realm {kc.realm} failed ({r.status_code}): {r.text[:500]}")
    # The gateway's scope, a default scope of every client: it carries the audience mapper, and an
    # OAuth client that asks for what pvegate's metadata lists (scopes_supported) is granted it.
    scope = {
        "name": SCOPE,
        "protocol": "openid-connect",
        "attributes": {"include.in.token.scope": "true", "display.on.consent.screen": "false"},
        "protocolMappers": [_audience_mapper(audience)],
    }
    with kc.admin() as admin:
        created = admin.post("/client-scopes", json=scope)
        created.raise_for_status()
        scope_id = created.headers["location"].rsplit("/", 1)[-1]
        for client in (AGENT_CLIENT, CONSOLE_CLIENT, TESTS_CLIENT):
            cid = kc.client_uuid(admin, client)
            admin.put(f"/clients/{cid}/default-client-scopes/{scope_id}").raise_for_status()
    kc.provisioned_in = time.monotonic() - t0


def _home(install: Path) -> Path:
    """A per-server Keycloak home: own bin/ (kc.sh finds its home from its own path), conf/ and
    data/; the built lib/ and the static themes/ and providers/ of the shared install linked."""
    root = Path(tempfile.mkdtemp(prefix="pvegate-kc-"))
    (root / "bin").mkdir()
    shutil.copy2(install / "bin" / "kc.sh", root / "bin" / "kc.sh")
    shutil.copytree(install / "conf", root / "conf")
    for name in ("lib", "themes", "providers"):
        (root / name).symlink_to(install / name)
    return root


def start_keycloak(timeout: float = 180.0) -> KeycloakServer:
    """Start Keycloak on 127.0.0.1:<free port>; returns once its discovery document answers."""
    t0 = time.monotonic()
    install = install_dir()
    jdk = java_home(install)
    root = _home(install)
    admin_password = secrets.token_urlsafe(18)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "JAVA_HOME": str(jdk),
        "KC_BOOTSTRAP_ADMIN_USERNAME": "admin",
        "KC_BOOTSTRAP_ADMIN_PASSWORD": admin_password,
        # a small, quickly started JVM: the tests need seconds to first token, not peak throughput
        "JAVA_OPTS_KC_HEAP": "-Xms64m -Xmx512m",
        "JAVA_OPTS_APPEND": "-XX:TieredStopAtLevel=1",
        "TZ": "UTC",
    }

    def spawn(port: int) -> subprocess.Popen[bytes]:
        argv = [
            str(root / "bin" / "kc.sh"),
            "start",
            "--optimized",
            "--http-enabled=true",
            "--http-host=127.0.0.1",
            f"--http-port={port}",
            f"--hostname=http://127.0.0.1:{port}",
            "--log-level=warn",
        ]
        return spawn_logged(argv, log=root / "keycloak.log", cwd=root, env=env, death_signal=signal.SIGTERM)

    def ready(port: int) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"http://127.0.0.1:{port}/realms/master", timeout=2).status_code == 200
        return False

    def log() -> str:
        with contextlib.suppress(OSError):
            return (root / "keycloak.log").read_text(errors="replace")
        return ""

    try:
        port, proc = start_on_free_port(
            "Keycloak",
            spawn,
            ready,
            log,
            attempts=3,
            timeout=timeout,
            poll=0.2,
            bind_errors=("Address already in use", "Port already bound"),
        )
    except StartFailed as exc:
        shutil.rmtree(root, ignore_errors=True)
        raise KeycloakUnavailable(str(exc)) from None
    return KeycloakServer(root, port, proc, admin_password, time.monotonic() - t0)


def main() -> int:  # pragma: no cover - manual use (the demo against Keycloak, the login page by hand)
    import yaml

    kc = start_keycloak()
    provision_realm(kc, audience=sys.argv[1] if len(sys.argv) > 1 else DEFAULT_AUDIENCE)
    print(f"Keycloak {KEYCLOAK_VERSION} up in {kc.started_in:.1f}s (+{kc.provisioned_in:.1f}s realm)")
    print(f"  issuer:   {kc.issuer}\n  admin:    {kc.base_url}/admin/ admin / {kc.admin_password}")
    print(f"  agent:    {AGENT_CLIENT} / {kc.agent_secret}  (client credentials)")
    print(f"  console:  {CONSOLE_CLIENT} (public, code + PKCE S256, any loopback redirect URI)")
    for u in kc.users.values():
        print(f"  user:     {u.username} / {u.password}  roles={list(u.roles)} groups={list(u.groups)}")
    auth = {**kc.auth_config(), "required_scopes": [SCOPE], "kind": {"agent_clients": [AGENT_CLIENT]}}
    print("\nthe gateway's auth section for this realm:\n")
    print(yaml.safe_dump({"auth": auth}, sort_keys=False))
    print("Ctrl-C stops it.", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop() below removes its folder too
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        kc.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
