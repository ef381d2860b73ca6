"""Gateway configuration: one YAML file, loaded into frozen dataclasses.

Secrets (Proxmox tokens, the JWT signing secret, SSH keys) are never inlined here:
the file names where to read them from (a file path or an environment variable).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.core import yamlread


class ConfigError(Exception):
    """The configuration file is missing, malformed or inconsistent: `problems` has one line each."""

    def __init__(self, *problems: str, source: Path | None = None) -> None:
        self.problems: tuple[str, ...] = problems
        self.source = source  # the file the problems are in, when known
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class SecretRef:
    """Where a secret lives: a file or an environment variable, never the config itself."""

    file: Path | None = None
    env: str | None = None
    setting: str = field(default="secret", compare=False)  # its path in the file, for messages

    def read(self) -> str:
        if self.file is not None:
            try:
                return self.file.read_text().strip()
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                if _looks_like_a_secret(self.file):  # the secret itself pasted as `file:`: not repeated
                    raise ConfigError(
                        f"{self.setting}: cannot read secret file ({reason}); the name is not shown: it does "
                        f"not look like a file path (the secret itself?): `file:` names the file that holds it"
                    ) from None
                raise ConfigError(f"{self.setting}: cannot read secret file {self.file}: {reason}") from exc
        if self.env is not None:
            if not ENV_NAME.fullmatch(self.env):  # the schema says so too; refs in opa.services are not its
                raise ConfigError(
                    f"{self.setting}: env: not a valid environment variable name (letters, digits and '_', not "
                    "starting with a digit); not shown: it may be the secret itself, `env:` names its variable"
                )
            value = os.environ.get(self.env)
            if value is None:
                raise ConfigError(f"{self.setting}: environment variable {self.env} is not set")
            return value.strip()
        raise ConfigError(f"{self.setting}: names neither a file nor an environment variable")

    def unavailable(self) -> str | None:
        """Why read() would fail or give an empty secret, which `pvegate serve` refuses
        (`pvegate config check --files`): the file opened and read only to find it blank, the
        variable looked up; None when it is there. Never says what the secret is."""
        empty = f"{self.setting}: the secret is empty"
        if self.file is not None:
            try:
                if not os.access(self.file, os.R_OK):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
                with self.file.open("rb") as fh:
                    # blank as read() sees it (it strips): serve's start refuses it
                    if not fh.read().strip():
                        return empty
            except OSError as exc:
                reason = exc.strerror or str(exc)
                if _looks_like_a_secret(self.file):
                    return (
                        f"{self.setting}: cannot read secret file ({reason}); "
                        "the name is not shown: it may be the secret"
                    )
                return f"{self.setting}: cannot read secret file {self.file}: {reason}"
            return None
        if self.env is not None:
            try:
                value = self.read()
            except ConfigError as exc:  # the variable's name only, never its value
                return str(exc)
            return None if value else empty
        return f"{self.setting}: names neither a file nor an environment variable"

    def exposed(self) -> str | None:
        """Why a secret file is open to other users (any group or other permission bit), or None. A warning,
        not a refusal: a Kubernetes secret volume is 0644 unless its defaultMode says otherwise."""
        if self.file is None:
            return None
        try:
            mode = self.file.stat().st_mode
        except OSError:
            return None  # unavailable() says why
        if not mode & 0o077:
            return None
        return (
            f"{self.setting}: {self.file} is open to other users (mode {stat.S_IMODE(mode):o}): chmod 600 it "
            "(a Kubernetes secret: defaultMode 0400)"
        )

    def __repr__(self) -> str:  # never print secret material, only where it is (not a secret pasted there)
        file = "<not shown>" if self.file is not None and _looks_like_a_secret(self.file) else self.file
        env = "<not shown>" if self.env is not None and not ENV_NAME.fullmatch(self.env) else self.env
        return f"SecretRef(file={file}, env={env})"


# the schema's $defs.secret.env pattern
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# a Proxmox token's secret (a UUID), or a character seen in a token (`user@realm!id=uuid`) or a
# password rather than in a path
_SECRET_LIKE = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[=!\s\"'`$&;|<>]"
)


def _looks_like_a_secret(path: Path) -> bool:
    """A secret file's name that is more likely the secret: worth an error that does not repeat it."""
    return bool(_SECRET_LIKE.search(str(path))) or any(len(part) > 80 for part in path.parts)


@dataclass(frozen=True)
class SSHNodeConfig:
    name: str
    host: str
    port: int
    host_key: str  # pinned OpenSSH public key line


@dataclass(frozen=True)
class SSHConfig:
    user: str
    key_file: Path
    nodes: dict[str, SSHNodeConfig]
    command_timeout: float = 10.0
    max_output_bytes: int = 1_048_576
    max_sessions: int = 10  # commands open at once on one node's connection (OpenSSH's MaxSessions)


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    api_url: str
    token: SecretRef
    ca_file: Path | None = None
    fingerprint: str | None = None
    verify_tls: bool = True
    timeout: float = 10.0
    ssh: SSHConfig | None = None


@dataclass(frozen=True)
class KindConfig:
    """How a token's principal kind is decided (schema: auth.kind; tried in this field order)."""

    agent_clients: tuple[str, ...] = ()
    claim: str | None = "pvegate_kind"
    values: dict[str, str] = field(default_factory=lambda: {"agent": "agent", "human": "human", "service": "service"})
    human_clients: tuple[str, ...] = ()
    human_when_claims: tuple[str, ...] = ("sid",)
    default: str = "agent"


@dataclass(frozen=True)
class AuthConfig:
    issuer: str
    audience: str
    hs256_secret: SecretRef | None = None
    jwks_url: str | None = None
    jwks_file: Path | None = None
    jwks_cache_seconds: int = 300
    algorithms: tuple[str, ...] = ("HS256",)
    leeway_seconds: int = 30
    # one dot path or several (their values are joined)
    roles_claim: str | tuple[str, ...] = ("roles", "realm_access.roles")
    groups_claim: str | tuple[str, ...] = ("groups",)
    group_paths: str = "strip_slash"  # strip_slash | full | leaf
    subject_claim: str = "sub"
    client_id_claims: tuple[str, ...] = ("azp", "client_id")
    kind: KindConfig = field(default_factory=KindConfig)
    authorization_servers: tuple[str, ...] | None = None  # None: (issuer,) when it is a URL
    scopes_claim: str = "scope"
    required_scopes: tuple[str, ...] = ()


@dataclass(frozen=True)
class OPAConfig:
    mode: str = "managed"  # managed: start `opa run --server` ourselves; external: connect to url
    url: str | None = None
    # external mode: the bearer token the OPA's system.authz policy admits (managed OPAs get one per start)
    token: SecretRef | None = None
    binary: Path | None = None
    policies: tuple[Path, ...] = ()
    bundle: Path | None = None
    verification_key: Path | None = None
    allow_unsigned: bool = False  # development only: opa.bundle / opa.bundles without a signature check
    timeout_ms: int = 500
    # OPA's console decision log duplicates the audit into state_dir/opa.log (~1.8 KB per
    # call, never rotated by OPA) and costs OPA 0.3-0.5 ms per decision: opt-in.
    decision_logs: bool = False
    # OPA's own `services`, `bundles`, `keys` and `decision_logs` (as decision_logs_upload)
    # sections, passed through to a managed OPA (docs/opa.md)
    services: dict[str, Any] = field(default_factory=dict)
    bundles: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, Any] = field(default_factory=dict)
    decision_logs_upload: dict[str, Any] | None = None
    watch_bundle: bool = False
    bundle_poll_seconds: int = 5


@dataclass(frozen=True)
class TLSConfig:
    cert: Path | None = None
    key: Path | None = None
    insecure_http: bool = False  # plain HTTP: loopback only, logged


@dataclass(frozen=True)
class AdminConfig:
    token: SecretRef | None = None


@dataclass(frozen=True)
class ConsoleConfig:
    """The admin console (gateway/admin/console): OpenID Connect sign-in, signed session cookies."""

    enabled: bool = False
    issuer: str = ""
    client_id: str = ""
    client_secret: SecretRef | None = None
    session_key: SecretRef | None = None  # shared by replicas: any of them reads any session
    scopes: tuple[str, ...] = ("openid", "profile", "email")
    idle_timeout_seconds: int = 900
    max_session_seconds: int = 28800


@dataclass(frozen=True)
class StorageConfig:
    """storage.url: SQLite (one file, the default) or PostgreSQL (state shared by replicas)."""

    backend: str = "sqlite"  # "sqlite" | "postgresql"
    url: str | None = None  # as given (never holds a password); None: SQLite in audit.path
    password: SecretRef | None = None
    pool_max_size: int = 10

    @property
    def postgresql(self) -> bool:
        return self.backend == "postgresql"


@dataclass(frozen=True)
class LocalPrincipal:
    """A principal declared in the configuration for `pvegate stdio` (no token: the process is trusted)."""

    name: str
    kind: str = "agent"
    roles: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class MetricsConfig:
    # a scrape-only credential for GET /metrics (the admin token is accepted too); without
    # either, /metrics is not served: counts, cluster names and the policy revision are not public
    token: SecretRef | None = None


@dataclass(frozen=True)
class HealthConfig:
    """Readiness probes (docs/deployment.md)."""

    opa_probe_interval: float = 2.0  # seconds between decision probes
    audit_probe_interval: float = 5.0  # a probe commit when nothing committed for this long
    audit_probe_timeout: float = 5.0
    cluster_probe_interval: float = 15.0  # 0: no cluster probes
    # seconds OPA may take to answer a query: opa.timeout_ms, set at load (not a `health:` setting)
    opa_timeout: float = 0.5

    @property
    def opa_max_age(self) -> float:
        """A decision older than this means the prober stalled: unready. Three probe intervals and a
        second, plus a probe round's worst case on an OPA that answers slowly but in time: a round asks
        OPA up to three times (the decision, that decision's data check on a new revision, the probe's
        own data check), each just inside opa.timeout_ms; it is never taken for a stalled prober."""
        return 3 * self.opa_probe_interval + 1 + 3 * self.opa_timeout

    @property
    def audit_max_age(self) -> float:
        return 3 * self.audit_probe_interval + self.audit_probe_timeout


@dataclass(frozen=True)
class Config:
    host: str
    port: int
    tls: TLSConfig
    auth: AuthConfig
    opa: OPAConfig
    clusters: dict[str, ClusterConfig]
    connectors_dir: Path
    audit_path: Path
    state_dir: Path
    admin: AdminConfig = field(default_factory=AdminConfig)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    state_key: SecretRef | None = None  # seals requestStates and session ids; None: kept in the database
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    log_format: str = "text"  # text | json (one JSON object per line, with the request id)
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = 1_048_576
    max_inflight_per_client: int = 64  # concurrent requests one client address may have open
    # calls (tools/call, tools/list) one principal may have in flight, from any address (store/principal_limits.py)
    max_inflight_per_principal: int = 32
    # refused calls one principal may have in any 60 s; beyond, its calls are refused at the door
    refused_calls_per_minute_per_principal: int = 120
    target_cache_seconds: float = 5.0
    tools_list_cache_seconds: float = 10.0  # how long a principal's tools/list answer is reused (0: never)
    public_url: str | None = None
    # reverse proxies whose X-Forwarded-For is believed (the audited source address); none by default
    trusted_proxies: tuple[str, ...] = ()
    audit_retention_days: float | None = None  # `pvegate audit archive` default age (None: keep all)
    audit_archive_dir: Path | None = None  # default: audit-archive/ next to the audit database
    # HMAC key authenticating the audit chain's head; generated at first start if missing
    audit_head_key_file: Path | None = None  # default: audit-head.key next to the audit database
    local_principals: dict[str, LocalPrincipal] = field(default_factory=dict)  # for `pvegate stdio`
    # free space (MiB) the audit store must have before a call is run (room for its dispatch and result records)
    audit_min_free_mb: float = 16
    # auth failures audited one row each per client address and minute; beyond, counted and summarised
    audit_auth_failure_rows_per_minute: int = 20
    # SIGTERM: how long calls in flight may finish before they are cut off (None: the longest task_timeout + 15 s)
    shutdown_grace_seconds: float | None = None

    @property
    def default_cluster(self) -> str:
        return next(iter(self.clusters))

    @property
    def audit_key_path(self) -> Path:
        return self.audit_head_key_file or self.audit_path.parent / "audit-head.key"


def _secret(raw: Any, base: Path, what: str) -> SecretRef:
    if not isinstance(raw, dict) or not ({"file", "env"} & raw.keys()):
        raise ConfigError(f"{what}: expected a mapping with 'file' or 'env'")
    return SecretRef(
        file=_path(raw["file"], base) if raw.get("file") else None,
        env=raw.get("env"),
        setting=what,
    )


# OPA's own field inside an `opa.services` entry (passed through, so not one of our settings)
OPA_SERVICE_CREDENTIALS = "credentials"
# the fields under a service's `credentials` the schema gives as {file:}/{env:} ($defs/secret); any other
# field is OPA's own, passed as written (an oauth2 `additional_parameters: {env: prod}` is a form parameter)
SERVICE_SECRET_FIELDS = {
    ("bearer", "token"),
    ("oauth2", "client_secret"),
    ("oauth2", "client_assertion"),
    ("client_tls", "private_key_passphrase"),
}


def _service_secrets(services: dict[str, Any], base: Path) -> dict[str, Any]:
    """OPA's `services`, with each secret field under a service's `credentials` (SERVICE_SECRET_FIELDS)
    a SecretRef: read when OPA's private config is written, never kept in this file."""
    key = OPA_SERVICE_CREDENTIALS

    def method(name: str, kind: str, fields: Any) -> Any:
        if not isinstance(fields, dict):
            return fields
        return {
            f: _secret(v, base, f"opa.services.{name}.{key}.{kind}.{f}")
            if (kind, f) in SERVICE_SECRET_FIELDS and isinstance(v, dict)
            else v
            for f, v in fields.items()
        }

    return {
        name: {**svc, key: {kind: method(name, kind, fields) for kind, fields in svc[key].items()}}
        if isinstance(svc, dict) and isinstance(svc.get(key), dict)
        else svc
        for name, svc in services.items()
    }


def service_secret_refs(services: dict[str, Any]) -> list[SecretRef]:
    """The SecretRefs in OPA's `services` (see _service_secrets)."""
    out: list[SecretRef] = []
    todo: list[Any] = [services]
    while todo:
        doc = todo.pop()
        if isinstance(doc, SecretRef):
            out.append(doc)
        elif isinstance(doc, dict):
            todo.extend(doc.values())
    return out


def _path(raw: Any, base: Path) -> Path:
    p = Path(str(raw)).expanduser()
    return p if p.is_absolute() else (base / p)


def _opt_path(raw: Any, base: Path) -> Path | None:
    return None if raw in (None, "") else _path(raw, base)


def _opa_key_problems(opa_raw: dict[str, Any], base: Path) -> list[str]:
    """The bundle verification keys that are no PEM public key of their algorithm (core/keys.py): a
    private key (the signing key must not sit on the gateway host), anything else, or a key an
    algorithm of another kind would misread. A verification key file that cannot be read is said by
    `pvegate serve`'s start (server.check_files), as every file the configuration names."""
    from gateway.core.keys import opa_keys_problems, public_key_problem

    out = opa_keys_problems(opa_raw.get("keys") or {})
    path = _opt_path(opa_raw.get("verification_key"), base)
    if path is not None:
        try:
            pem = path.read_bytes()
        except OSError:
            pem = None
        problem = public_key_problem(pem, f"opa.verification_key {path}") if pem is not None else None
        if problem is not None:
            out.append(problem)
    return out


def _ssh(raw: dict[str, Any] | None, base: Path) -> SSHConfig | None:
    if not raw:
        return None
    nodes = {
        name: SSHNodeConfig(name=name, host=str(n["host"]), port=int(n.get("port", 22)), host_key=n["host_key"])
        for name, n in (raw.get("nodes") or {}).items()
    }
    return SSHConfig(
        user=str(raw.get("user", "root")),
        key_file=_path(raw["key_file"], base),
        nodes=nodes,
        command_timeout=float(raw.get("command_timeout", 10.0)),
        max_output_bytes=int(raw.get("max_output_bytes", 1_048_576)),
        max_sessions=int(raw.get("max_sessions", 10)),
    )


def _storage(raw: dict[str, Any], base: Path, audit_path: Path | None) -> tuple[StorageConfig, Path | None]:
    """storage.* and the SQLite file it names (None: not named by storage.url)."""
    from urllib.parse import parse_qsl, urlsplit

    url = raw.get("url")
    pool = int(raw.get("pool_max_size", 10))
    password = _secret(raw["password"], base, "storage.password") if raw.get("password") else None
    if url is None or str(url).startswith("sqlite://"):
        unused = [f"storage.{k}" for k in ("password", "pool_max_size") if k in raw]
        if unused:
            raise ConfigError(f"{unused[0]}: only used with a postgresql:// storage.url")
        sqlite_file = _path(str(url).removeprefix("sqlite://"), base) if url else None
        if sqlite_file is not None and audit_path is not None and sqlite_file != audit_path:
            raise ConfigError(
                f"storage.url names the SQLite file {sqlite_file} but audit.path names {audit_path}: "
                "they are one database, name it once (storage.url)"
            )
        return StorageConfig("sqlite", url, password, pool), sqlite_file
    moved = "; a password is named in storage.password ({file: PATH} or {env: NAME}), not in the URL"
    try:
        parts = urlsplit(str(url))
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as exc:
        # urlsplit's text quotes the port or the whole user:password@host: never shown
        raise ConfigError(f"storage.url: not a valid PostgreSQL URL: {_urlsplit_reason(exc)}{moved}") from None
    try:  # as strictly as the driver (asyncpg) will: a `?sslmode` without a value is a mistake said here
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True) if parts.query else []
    except ValueError:
        raise ConfigError(
            "storage.url: its query is not NAME=VALUE pairs joined by '&' (e.g. ?sslmode=verify-full)"
        ) from None
    secret_params = sorted({k.lower() for k, _ in query} & {"password", "sslpassword"})
    if secret_params:  # libpq's query form of the same secret
        raise ConfigError(
            f"storage.url: holds a {secret_params[0]} query parameter; secrets are not kept in this file: "
            "remove it from the URL and name it in storage.password ({file: PATH} or {env: NAME})"
        )
    if parts.password is not None:
        raise ConfigError(
            "storage.url: holds a password; secrets are not kept in this file: "
            "remove it from the URL and name it in storage.password ({file: PATH} or {env: NAME})"
        )
    if "@" in f"{parts.path}?{parts.query}#{parts.fragment}":
        # user:pass/word@host splits as host `user`, port `pass` and a path holding the rest of the password
        raise ConfigError(
            "storage.url: has an '@' after the host: a password with '/', '?' or '#' in it would end the "
            f"host part early (write a literal '@' as %40){moved}"
        )
    socket_dir = any(k.lower() == "host" and v.startswith("/") for k, v in query)  # libpq's Unix socket form
    if not parts.hostname and not socket_dir:
        raise ConfigError(
            "storage.url: names no host (postgresql://USER@HOST:PORT/DATABASE, or a Unix socket's directory "
            "as postgresql://USER@/DATABASE?host=/run/postgresql)"
        )
    return StorageConfig("postgresql", str(url), password, pool), None


def _urlsplit_reason(exc: ValueError) -> str:
    """What urlsplit found wrong, in words of our own."""
    text = str(exc)
    if text.startswith("Port"):
        return "the port after ':' is not a number from 0 to 65535"
    if "IPv6" in text:
        return "an unbalanced '[' or ']' in the host part"
    if "NFKC" in text:
        return "characters a host name cannot hold"
    return "it does not split into scheme, user, host, port and path"


def _claim_paths(raw: str | list[str]) -> tuple[str, ...]:
    return (raw,) if isinstance(raw, str) else tuple(raw)


def _kind(raw: dict[str, Any]) -> KindConfig:
    """Types and values are the schema's (auth.kind)."""
    d = KindConfig()
    return KindConfig(
        agent_clients=tuple(raw.get("agent_clients", d.agent_clients)),
        claim=raw.get("claim", d.claim),
        values=dict(raw["values"]) if "values" in raw else d.values,
        human_clients=tuple(raw.get("human_clients", d.human_clients)),
        human_when_claims=tuple(raw.get("human_when_claims", d.human_when_claims)),
        default=str(raw.get("default", d.default)),
    )


def _health(raw: dict[str, Any] | None, opa_timeout_ms: int) -> HealthConfig:
    """Types and ranges are the schema's (schemas/config.schema.json)."""
    raw = raw or {}
    return HealthConfig(
        opa_timeout=opa_timeout_ms / 1000,
        **{k: float(v) for k, v in raw.items()},  # type: ignore[arg-type]
    )


def _console(raw: dict[str, Any] | None, base: Path, public_url: str | None) -> ConsoleConfig:
    """Types and ranges are the schema's; an enabled console needs an issuer it may reach safely."""
    if not raw:
        return ConsoleConfig()
    from urllib.parse import urlsplit

    issuer = str(raw["issuer"]).rstrip("/")
    try:
        parts = urlsplit(issuer)
    except ValueError as exc:
        raise ConfigError(f"console.issuer: not a valid URL: {_urlsplit_reason(exc)}") from None
    if raw.get("enabled") and not (
        parts.scheme == "https" or (parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost", "::1"))
    ):
        raise ConfigError("console.issuer: must be an https URL (plain http only on loopback)")
    if raw.get("enabled") and not public_url:
        raise ConfigError(
            "console.enabled needs public_url: the sign-in's redirect URI (PUBLIC_URL/admin/callback) and the "
            "origin the console's forms are posted from"
        )
    scopes = tuple(raw.get("scopes", ["openid", "profile", "email"]))
    if raw.get("enabled") and "openid" not in scopes:
        raise ConfigError(
            "console.scopes: must include openid while the console is enabled (without it the identity "
            "provider sends no ID token, and every sign-in fails)"
        )
    return ConsoleConfig(
        enabled=bool(raw.get("enabled", False)),
        issuer=issuer,
        client_id=str(raw["client_id"]),
        client_secret=_secret(raw["client_secret"], base, "console.client_secret")
        if raw.get("client_secret")
        else None,
        session_key=_secret(raw["session_key"], base, "console.session_key"),
        scopes=scopes,
        idle_timeout_seconds=int(raw.get("idle_timeout_seconds", 900)),
        max_session_seconds=int(raw.get("max_session_seconds", 28800)),
    )


def parse(raw: dict[str, Any], base: Path) -> Config:
    """Build a Config from a parsed YAML mapping; relative paths resolve against `base`.

    The mapping must satisfy schemas/config.schema.json (an unknown key is a mistake, not
    something to ignore): otherwise ConfigError lists every problem, one line each.
    """
    from gateway.core.config_schema import problems, redact

    found = problems(raw)
    if found:
        raise ConfigError(*found)
    try:
        listen = raw.get("listen", {})
        tls_raw = raw.get("tls", {})
        auth_raw = raw["auth"]
        opa_raw = raw.get("opa", {})
        if key_problems := _opa_key_problems(opa_raw, base):
            raise ConfigError(*key_problems)
        clusters: dict[str, ClusterConfig] = {}
        for c in raw.get("clusters", []):
            clusters[c["name"]] = ClusterConfig(
                name=c["name"],
                api_url=str(c["api_url"]).rstrip("/"),
                token=_secret(c["token"], base, f"clusters.{c['name']}.token"),
                ca_file=_opt_path(c.get("ca_file"), base),
                fingerprint=c.get("fingerprint"),
                verify_tls=bool(c.get("verify_tls", True)),
                timeout=float(c.get("timeout", 10.0)),
                ssh=_ssh(c.get("ssh"), base),
            )
        if not clusters:
            raise ConfigError("at least one cluster must be configured")
        state_dir = _path(raw.get("state_dir", ".state"), base)
        audit_raw = raw.get("audit", {})
        named_audit = _path(audit_raw["path"], base) if audit_raw.get("path") else None
        storage, sqlite_file = _storage(raw.get("storage") or {}, base, named_audit)
        return Config(
            host=str(listen.get("host", "127.0.0.1")),
            port=int(listen.get("port", 8443)),
            tls=TLSConfig(
                cert=_opt_path(tls_raw.get("cert"), base),
                key=_opt_path(tls_raw.get("key"), base),
                insecure_http=bool(tls_raw.get("insecure_http", False)),
            ),
            auth=AuthConfig(
                issuer=str(auth_raw["issuer"]),
                audience=str(auth_raw["audience"]),
                hs256_secret=_secret(auth_raw["hs256_secret"], base, "auth.hs256_secret")
                if auth_raw.get("hs256_secret")
                else None,
                jwks_url=auth_raw.get("jwks_url"),
                jwks_file=_opt_path(auth_raw.get("jwks_file"), base),
                jwks_cache_seconds=int(auth_raw.get("jwks_cache_seconds", 300)),
                algorithms=tuple(auth_raw.get("algorithms", ["HS256"])),
                leeway_seconds=int(auth_raw.get("leeway_seconds", 30)),
                roles_claim=_claim_paths(auth_raw.get("roles_claim", ["roles", "realm_access.roles"])),
                groups_claim=_claim_paths(auth_raw.get("groups_claim", ["groups"])),
                group_paths=str(auth_raw.get("group_paths", "strip_slash")),
                subject_claim=str(auth_raw.get("subject_claim", "sub")),
                client_id_claims=tuple(auth_raw.get("client_id_claims", ["azp", "client_id"])),
                kind=_kind(auth_raw.get("kind") or {}),
                authorization_servers=tuple(auth_raw["authorization_servers"])
                if auth_raw.get("authorization_servers") is not None
                else None,
                scopes_claim=str(auth_raw.get("scopes_claim", "scope")),
                required_scopes=tuple(auth_raw.get("required_scopes", [])),
            ),
            opa=OPAConfig(
                mode=str(opa_raw.get("mode", "managed")),
                url=opa_raw.get("url"),
                token=_secret(opa_raw["token"], base, "opa.token") if opa_raw.get("token") else None,
                binary=_opt_path(opa_raw.get("binary"), base),
                policies=tuple(_path(p, base) for p in opa_raw.get("policies", [])),
                bundle=_opt_path(opa_raw.get("bundle"), base),
                verification_key=_opt_path(opa_raw.get("verification_key"), base),
                allow_unsigned=bool(opa_raw.get("allow_unsigned", False)),
                timeout_ms=int(opa_raw.get("timeout_ms", 500)),
                decision_logs=bool(opa_raw.get("decision_logs", False)),
                services=_service_secrets(dict(opa_raw.get("services") or {}), base),
                bundles=dict(opa_raw.get("bundles") or {}),
                keys=dict(opa_raw.get("keys") or {}),
                decision_logs_upload=opa_raw.get("decision_logs_upload"),
                watch_bundle=bool(opa_raw.get("watch_bundle", False)),
                bundle_poll_seconds=int(opa_raw.get("bundle_poll_seconds", 5)),
            ),
            clusters=clusters,
            connectors_dir=_path(raw.get("connectors_dir", "connectors"), base),
            audit_path=named_audit or sqlite_file or state_dir / "audit.db",
            state_dir=state_dir,
            admin=AdminConfig(
                token=_secret(raw["admin"]["token"], base, "admin.token") if raw.get("admin", {}).get("token") else None
            ),
            console=_console(raw.get("console"), base, raw.get("public_url")),
            storage=storage,
            state_key=_secret(raw["state_key"], base, "state_key") if raw.get("state_key") else None,
            metrics=MetricsConfig(
                token=_secret(raw["metrics"]["token"], base, "metrics.token")
                if (raw.get("metrics") or {}).get("token")
                else None
            ),
            health=_health(raw.get("health"), int(opa_raw.get("timeout_ms", 500))),
            log_format=str(raw.get("log_format", "text")),
            allowed_origins=tuple(raw.get("allowed_origins", [])),
            allowed_hosts=tuple(raw.get("allowed_hosts", [])),
            max_body_bytes=int(raw.get("max_body_bytes", 1_048_576)),
            max_inflight_per_client=int(raw.get("max_inflight_per_client", 64)),
            max_inflight_per_principal=int(raw.get("max_inflight_per_principal", 32)),
            refused_calls_per_minute_per_principal=int(raw.get("refused_calls_per_minute_per_principal", 120)),
            target_cache_seconds=float(raw.get("target_cache_seconds", 5.0)),
            tools_list_cache_seconds=float(raw.get("tools_list_cache_seconds", 10.0)),
            public_url=raw.get("public_url"),
            trusted_proxies=tuple(str(p) for p in raw.get("trusted_proxies", [])),
            audit_retention_days=(
                float(raw["audit"]["retention_days"]) if raw.get("audit", {}).get("retention_days") else None
            ),
            audit_archive_dir=_opt_path(raw.get("audit", {}).get("archive_dir"), base),
            audit_head_key_file=_opt_path(raw.get("audit", {}).get("head_key_file"), base),
            local_principals={
                str(name): LocalPrincipal(
                    name=str(name),
                    kind=str(lp.get("kind", "agent")),
                    roles=tuple(str(r) for r in lp.get("roles", [])),
                    groups=tuple(str(g) for g in lp.get("groups", [])),
                )
                for name, lp in (raw.get("local_principals") or {}).items()
            },
            audit_min_free_mb=float(raw.get("audit", {}).get("min_free_mb", 16)),
            audit_auth_failure_rows_per_minute=int(raw.get("audit", {}).get("auth_failure_rows_per_minute", 20)),
            shutdown_grace_seconds=(
                float(raw["shutdown_grace_seconds"]) if raw.get("shutdown_grace_seconds") is not None else None
            ),
        )
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        # not chained: the exception's own text (logged with -v) might quote a URL's password
        raise ConfigError(redact(f"invalid configuration: {exc!r}")) from None


def read_yaml(text: str) -> Any:
    """The configuration file's YAML, as yaml.safe_load reads it; ConfigError if it would be read
    otherwise than written (a key given twice, a merge PyYAML resolves wrongly: core/yamlread.py)."""
    try:
        return yamlread.load(text)
    except yamlread.YamlProblems as exc:
        raise ConfigError(*exc.problems) from None


def load(path: Path) -> Config:
    """Read and check a configuration file; ConfigError (with `source` set) lists what is wrong."""
    try:
        raw = read_yaml(path.read_text())
    except yaml.MarkedYAMLError as exc:
        # one line, FILE:LINE:COL: what is wrong; never PyYAML's excerpt of the line (it may be a secret
        # typed in the wrong place), nor its "<unicode string>" for the file
        mark = exc.problem_mark or exc.context_mark
        where = Path(f"{path}:{mark.line + 1}:{mark.column + 1}") if mark is not None else path
        what = "; ".join(str(x) for x in (exc.problem, exc.context) if x) or type(exc).__name__
        raise ConfigError(f"cannot read the configuration: {what}", source=where) from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        text = (str(exc).splitlines() or [type(exc).__name__])[0]  # PyYAML's next lines quote the file
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else text
        raise ConfigError(f"cannot read the configuration: {reason}", source=path) from exc
    except ConfigError as exc:
        raise ConfigError(*exc.problems, source=path) from None
    if not isinstance(raw, dict):
        raise ConfigError("the top level must be a mapping of settings", source=path)
    try:
        return parse(raw, path.parent.resolve())
    except ConfigError as exc:
        raise ConfigError(*exc.problems, source=path) from None
