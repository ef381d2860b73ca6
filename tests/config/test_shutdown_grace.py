"""The drain the shipped configurations ask for fits inside the stop timeout of what supervises them:
a supervisor that SIGKILLs mid-drain leaves calls without their `interrupted` record."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.components import default_grace
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog

DOCKER = REPO_ROOT / "docker"
DOCS = REPO_ROOT / "docs"
DOCKERFILE_CONFIG = "/etc/pvegate/pvegate.yaml"  # docker/Dockerfile's CMD


def shipped_default() -> float:
    return default_grace(Catalog.load(REPO_ROOT / "connectors"))


def grace_of(raw: dict[str, Any]) -> float:
    explicit = raw.get("shutdown_grace_seconds")
    return float(explicit) if explicit is not None else shipped_default()


def seconds(duration: str) -> float:
    """A compose duration as used there (`930s`, `15m30s`)."""
    units = {"h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|m|s)", duration)
    assert "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def compose_gateways() -> list[tuple[str, dict[str, Any]]]:
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    return [
        (name, s)
        for name, s in services.items()
        if "serve" in (s.get("command") or ["serve"]) and "opa" not in name and name != "postgres"
    ]


def config_of(service: dict[str, Any]) -> Path:
    command = service.get("command") or ["serve", "--config", DOCKERFILE_CONFIG]
    path = command[command.index("--config") + 1]
    assert path.startswith("/etc/pvegate/"), path
    return DOCKER / "config.example" / path.removeprefix("/etc/pvegate/")


def test_every_compose_gateway_is_checked() -> None:
    assert sorted(name for name, _ in compose_gateways()) == ["pvegate", "pvegate-a", "pvegate-b"]


@pytest.mark.parametrize("name", ["pvegate", "pvegate-a", "pvegate-b"])
def test_compose_waits_longer_than_the_example_configs_drain(name: str) -> None:
    service = dict(compose_gateways())[name]
    raw = yaml.safe_load(config_of(service).read_text())
    stop = seconds(str(service["stop_grace_period"]))
    assert grace_of(raw) < stop, f"{name}: drain {grace_of(raw)} s, stop_grace_period {stop} s"


@pytest.mark.parametrize("example", sorted((DOCKER / "config.example").glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_set_their_drain(example: Path) -> None:
    """Explicit: the default follows the longest task_timeout of the connectors (a restore's hour)."""
    assert yaml.safe_load(example.read_text()).get("shutdown_grace_seconds") is not None


def test_the_systemd_unit_in_the_docs_waits_longer_than_the_docs_config() -> None:
    text = (DOCS / "deployment.md").read_text()
    [stop] = re.findall(r"^TimeoutStopSec=(\d+)", text, flags=re.M)
    [grace] = re.findall(r"^shutdown_grace_seconds: (\d+)", text, flags=re.M)
    assert int(grace) < int(stop)


@pytest.mark.parametrize("doc", ["deployment.md", "audit.md"])
def test_the_docs_state_the_shipped_default(doc: str) -> None:
    text = " ".join((DOCS / doc).read_text().split())
    shown = f"{shipped_default():,.0f} s with the shipped connectors"
    assert shown in text, f"{doc} does not say '{shown}'"
