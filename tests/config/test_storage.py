"""storage.url: SQLite by default (today's files), or PostgreSQL once every shared store is in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import ConfigError, parse
from gateway.core.config_schema import problems
from gateway.store import backend
from tests.config.conftest import run_pvegate, write

PG = "postgresql://pvegate@db.example:5432/pvegate"


def test_default_keeps_the_audit_database_file(base: dict[str, Any], tmp_path: Path) -> None:
    cfg = parse(base, tmp_path)
    assert cfg.storage.backend == "sqlite" and cfg.storage.url is None
    assert cfg.audit_path == tmp_path / "state" / "audit.db"


def test_a_sqlite_url_names_the_database_file(base: dict[str, Any], tmp_path: Path) -> None:
    base["storage"] = {"url": "sqlite:///var/lib/pvegate/pvegate.db"}
    assert parse(base, tmp_path).audit_path == Path("/var/lib/pvegate/pvegate.db")
    base["storage"] = {"url": "sqlite://data/pvegate.db"}  # relative to the configuration file
    assert parse(base, tmp_path).audit_path == tmp_path / "data" / "pvegate.db"
    base["audit"] = {"path": "data/pvegate.db"}  # the same file named twice is fine
    assert parse(base, tmp_path).audit_path == tmp_path / "data" / "pvegate.db"


def test_a_postgresql_url_is_parsed_without_touching_the_audit_file(base: dict[str, Any], tmp_path: Path) -> None:
    base["storage"] = {"url": PG + "?sslmode=verify-full", "password": {"env": "PGPW"}, "pool_max_size": 4}
    cfg = parse(base, tmp_path)
    assert cfg.storage.postgresql and cfg.storage.url == PG + "?sslmode=verify-full"
    assert cfg.storage.password is not None and cfg.storage.password.env == "PGPW"
    assert cfg.storage.pool_max_size == 4


@pytest.mark.parametrize(
    ("storage", "expected"),
    [
        ({"url": "mysql://x/y"}, "storage.url: expected sqlite://PATH or postgresql://USER@HOST:PORT/DATABASE"),
        ({"url": "postgresql://"}, "storage.url: expected sqlite://PATH or postgresql://"),
        ({"pool_max_size": 0}, "storage.pool_max_size: must be at least 1, got 0"),
        ({"uri": PG}, "storage.uri: unknown setting; did you mean storage.url?"),
    ],
)
def test_schema_problems(base: dict[str, Any], storage: dict[str, Any], expected: str) -> None:
    base["storage"] = storage
    found = problems(base)
    assert len(found) == 1 and found[0].startswith(expected), found


@pytest.mark.parametrize(
    ("storage", "audit", "expected"),
    [
        ({"url": "postgresql://u:hunter2@db/p"}, None, "storage.url: holds a password; secrets are not kept"),
        # libpq's query form of the same secret (it would also show in /admin/health's audit.path)
        ({"url": "postgresql://u@db/p?password=hunter2"}, None, "storage.url: holds a password query parameter"),
        (
            {"url": "postgresql://u@db/p?sslmode=verify-full&SSLPassword=hunter2"},
            None,
            "storage.url: holds a sslpassword",
        ),
        ({"url": "postgresql://u@db:port/p"}, None, "storage.url: not a valid PostgreSQL URL"),
        ({"url": "postgresql://u@/p"}, None, "storage.url: names no host"),
        ({"url": "postgresql://u@/p?host=run/pg"}, None, "storage.url: names no host"),  # a socket dir is absolute
        # the driver parses the query strictly: refused here, not as a traceback at the first connection
        ({"url": "postgresql://u@db/p?sslmode"}, None, "storage.url: its query is not NAME=VALUE pairs"),
        ({"url": "postgresql://u@db/p?sslmode=require&&x"}, None, "storage.url: its query is not NAME=VALUE"),
        ({"url": "sqlite:///a.db"}, {"path": "/b.db"}, "storage.url names the SQLite file /a.db but audit.path"),
        ({"password": {"env": "X"}}, None, "storage.password: only used with a postgresql:// storage.url"),
        ({"url": "sqlite:///a.db", "pool_max_size": 3}, None, "storage.pool_max_size: only used with a postgresql"),
    ],
)
def test_contradictions(
    base: dict[str, Any], tmp_path: Path, storage: dict[str, Any], audit: dict[str, Any] | None, expected: str
) -> None:
    base["storage"] = storage
    if audit:
        base["audit"] = audit
    with pytest.raises(ConfigError) as err:
        parse(base, tmp_path)
    assert err.value.problems[0].startswith(expected), err.value.problems
    assert "hunter2" not in str(err.value)


def test_every_shared_store_is_ported() -> None:
    """Audit, approvals, quotas and the signing key all live in PostgreSQL: nothing is refused."""
    assert backend.NOT_YET_SHARED == ()


def test_a_store_not_yet_shared_is_refused_in_one_line(
    base: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never per-process state the operator believes shared: whatever is added next and not yet
    ported is named, in one line, before anything starts (serve and the approvals CLI call this)."""
    base["storage"] = {"url": PG}
    cfg = parse(base, tmp_path)
    backend.refuse_unshared(cfg)  # today: nothing to refuse
    monkeypatch.setattr(backend, "NOT_YET_SHARED", ("the widget cache",))
    with pytest.raises(ConfigError) as err:
        backend.refuse_unshared(cfg)
    assert str(err.value).startswith("storage.url: PostgreSQL is not supported yet: the widget cache"), err.value
    backend.refuse_unshared(parse({**base, "storage": {}}, tmp_path))  # SQLite: never refused


def test_serve_says_when_postgresql_cannot_be_reached(base: dict[str, Any], tmp_path: Path) -> None:
    base["storage"] = {"url": "postgresql://pvegate@127.0.0.1:9/pvegate"}
    r = run_pvegate("serve", "--config", str(write(tmp_path, base)))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("pvegate: cannot start: storage.url: PostgreSQL cannot be reached"), line


def test_a_unix_socket_directory_names_the_host(base: dict[str, Any], tmp_path: Path) -> None:
    """libpq's form for a server on this host: no host in the authority, its socket directory in `host`."""
    url = "postgresql://pvegate@/pvegate?host=/run/postgresql&port=5433"
    base["storage"] = {"url": url}
    cfg = parse(base, tmp_path)
    assert cfg.storage.postgresql and cfg.storage.url == url
