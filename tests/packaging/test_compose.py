"""docker/compose.yaml works as the docs say, proved without a Docker daemon.

After `make bundle` and `make compose-config` (run here into a temporary copy of docker/ so a
developer's own config is neither used nor touched): every path the compose file mounts or
reads exists, the configuration it mounts loads and points at the OPA service with its token,
`docker-compose config` accepts the file (where docker-compose could be provisioned), and OPA's
command line from the compose file, run with the real OPA binary on loopback, serves the bundle,
passes its health check and refuses anyone without the token.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.core.config import load
from gateway.policy.bundles import bundle_has_authz
from gateway.policy.opa_sidecar import REPO_ROOT, find_opa, free_port
from tests.support import GatewayThread

DOCKER = REPO_ROOT / "docker"
HEALTHCHECK = DOCKER / "healthcheck.py"


@dataclass
class Deployment:
    root: Path  # stands for the checkout: root/docker, root/bundles
    compose: dict[str, Any]

    @property
    def docker(self) -> Path:
        return self.root / "docker"

    def service(self, name: str) -> dict[str, Any]:
        return dict(self.compose["services"][name])

    def host_path(self, source: str) -> Path:
        return (self.docker / source).resolve()


def _bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for v in service.get("volumes", []):
        source, target = str(v).split(":")[:2]
        if source.startswith((".", "/")):  # a host path, not a named volume
            out.append((source, target))
    return out


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Deployment:
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(DOCKER, root / "docker", ignore=shutil.ignore_patterns("config", "__pycache__"))
    env = {
        **os.environ,
        "BUNDLE_DIR": str(root / "bundles"),
        "COMPOSE_CONFIG_DIR": str(root / "docker" / "config"),
        "PVEGATE": str(Path(sys.executable).parent / "pvegate"),
    }
    for script in ("bundle.sh", "compose-config.sh"):  # what `make bundle` and `make compose-config` run
        r = subprocess.run(
            ["bash", str(REPO_ROOT / "scripts" / script)], env=env, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, r.stdout + r.stderr
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "bash scripts/bundle.sh" in makefile and "bash scripts/compose-config.sh" in makefile
    return Deployment(root, yaml.safe_load((root / "docker" / "compose.yaml").read_text()))


def test_every_mounted_and_read_path_exists(deployment: Deployment) -> None:
    for name in ("opa", "pvegate"):
        svc = deployment.service(name)
        for source, target in _bind_mounts(svc):
            host = deployment.host_path(source)
            assert host.exists(), f"{name}: {source} (for {target}) does not exist"
            # a missing file would be bind-mounted as an empty directory: the kind must match
            assert host.is_dir() == (not Path(target).suffix), f"{name}: {source} -> {target}"
        assert deployment.host_path(svc["env_file"]).is_file()
        build = svc["build"]
        # the build context is the checkout: resolve it against the real docker/ folder
        context = (DOCKER / build["context"]).resolve()
        assert context == REPO_ROOT and (context / build["dockerfile"]).is_file()
    sources = [s for s, _ in _bind_mounts(deployment.service("opa"))]
    assert not any("signing" in s for s in sources)  # OPA gets the public key only


def test_the_dockerfile_copies_what_exists_and_probes_readiness() -> None:
    lines = (DOCKER / "Dockerfile").read_text().splitlines()
    copies = [ln.split()[1:-1] for ln in lines if ln.startswith("COPY ") and "--from" not in ln]
    for sources in copies:
        for s in sources:
            assert (REPO_ROOT / s).exists(), s
    assert ["docker/healthcheck.py"] in copies
    health = [ln for ln in lines if ln.startswith("HEALTHCHECK")]
    assert len(health) == 1
    text = "\n".join(lines)
    assert '"python", "/opt/pvegate/docker/healthcheck.py"' in text and "WORKDIR /opt/pvegate" in text


def test_opa_is_healthy_only_as_a_server_and_the_gateway_waits_for_it(deployment: Deployment) -> None:
    opa, gw = deployment.service("opa"), deployment.service("pvegate")
    assert gw["depends_on"]["opa"]["condition"] == "service_healthy"
    test = opa["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "/opt/pvegate/docker/healthcheck.py"]
    assert test[3] == "http://127.0.0.1:8181/health?bundles=true"
    assert opa["entrypoint"] == ["opa"] and opa["image"] == gw["image"]  # the image that has Python


def test_only_the_gateway_reaches_opa_and_only_with_its_token(deployment: Deployment) -> None:
    opa, gw = deployment.service("opa"), deployment.service("pvegate")
    assert "ports" not in opa and opa["networks"] == ["policy"]
    assert deployment.compose["networks"]["policy"]["internal"] is True
    assert "policy" in gw["networks"]
    assert {"--authentication=token", "--authorization=basic"} <= set(opa["command"])
    assert opa["env_file"] == gw["env_file"]
    token = _env_file(deployment.host_path(opa["env_file"]))["PVEGATE_OPA_TOKEN"]
    assert len(token) >= 32

    config_dir = next(deployment.host_path(s) for s, t in _bind_mounts(gw) if t == "/etc/pvegate")
    cfg = load(config_dir / "pvegate.yaml")
    assert cfg.opa.mode == "external" and cfg.opa.url == "http://opa:8181"
    assert "--addr=0.0.0.0:8181" in opa["command"]
    assert cfg.opa.token is not None and cfg.opa.token.env == "PVEGATE_OPA_TOKEN"


def test_the_shipped_config_names_only_files_that_exist_or_the_operator_provides(deployment: Deployment) -> None:
    gw = deployment.service("pvegate")
    config_dir = next(deployment.host_path(s) for s, t in _bind_mounts(gw) if t == "/etc/pvegate")
    cfg = load(config_dir / "pvegate.yaml")
    readme = (DOCKER / "config.example" / "README.md").read_text()
    named = [cfg.tls.cert, cfg.tls.key, cfg.admin.token.file if cfg.admin.token else None]
    for cl in cfg.clusters.values():
        named += [cl.token.file, cl.ca_file]
    for path in filter(None, named):
        assert path.is_relative_to("/etc/pvegate"), path  # inside the mounted folder
        rel = path.relative_to("/etc/pvegate")
        assert (config_dir / rel).is_file() or f"`{rel}`" in readme, rel
    assert (config_dir / "secrets" / "admin-token").stat().st_mode & 0o077 == 0
    assert cfg.connectors_dir == Path("/opt/pvegate/connectors")  # where the Dockerfile copies them


def test_docker_compose_accepts_the_file(deployment: Deployment) -> None:
    if shutil.which("docker-compose") is None:
        if os.geteuid() == 0 and shutil.which("apt-get"):
            pytest.fail("docker-compose is missing: `make tools` installs it (scripts/provision-compose.sh)")
        pytest.skip("docker-compose not installable here (needs root and apt-get); the file is still parsed above")
    r = subprocess.run(
        ["docker-compose", "-f", str(deployment.docker / "compose.yaml"), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=deployment.docker,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (deployment.docker / "config" / "opa.env").rename(deployment.docker / "opa.env.away")  # control: it can fail
    try:
        r = subprocess.run(
            ["docker-compose", "-f", str(deployment.docker / "compose.yaml"), "config", "-q"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=deployment.docker,
        )
        assert r.returncode != 0 and "opa.env" in r.stderr
    finally:
        (deployment.docker / "opa.env.away").rename(deployment.docker / "config" / "opa.env")


@pytest.fixture(scope="module")
def compose_opa(deployment: Deployment) -> Iterator[tuple[str, str]]:
    """OPA run with the compose file's own command line, its mounts mapped to the host files."""
    opa = deployment.service("opa")
    mounts = {target: str(deployment.host_path(source)) for source, target in _bind_mounts(opa)}
    assert bundle_has_authz(Path(mounts["/bundles/pvegate.tar.gz"]))
    port = free_port()
    args = []
    for a in opa["command"]:
        a = a.replace("0.0.0.0:8181", f"127.0.0.1:{port}")  # loopback only, here
        for target, host in mounts.items():
            a = a.replace(target, host)
        args.append(a)
    token = _env_file(deployment.host_path(opa["env_file"]))["PVEGATE_OPA_TOKEN"]
    env = {"PATH": os.environ.get("PATH", ""), "PVEGATE_OPA_TOKEN": token, "GOGC": "400"}
    proc = subprocess.Popen([str(find_opa()), *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            if subprocess.run([sys.executable, str(HEALTHCHECK), f"{url}/health?bundles=true"]).returncode == 0:
                break
            assert proc.poll() is None, "OPA exited"
        else:
            raise AssertionError("OPA never became healthy")
        yield url, token
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_compose_opa_serves_the_signed_bundle_to_the_token_only(compose_opa: tuple[str, str]) -> None:
    url, token = compose_opa
    assert httpx.get(f"{url}/v1/data/data/bindings", timeout=5).status_code == 401
    assert httpx.put(f"{url}/v1/data/elsewhere", json={"x": 1}, timeout=5).status_code == 401
    assert httpx.get(f"{url}/v1/policies", headers={"Authorization": "Bearer guess"}, timeout=5).status_code == 401
    r = httpx.post(
        f"{url}/v1/data/pvegate/decision",
        json={"input": {"contract_version": 1, "kind": "call"}},
        headers={"Authorization": f"Bearer {token}"},
        timeout=5,
    )
    assert r.status_code == 200 and r.json()["result"]["allow"] is False


def test_the_health_probe_answers_for_the_gateway(gateway: GatewayThread) -> None:
    ready = subprocess.run(
        [sys.executable, str(HEALTHCHECK), f"https://127.0.0.1:{gateway.config.port}/readyz"], timeout=30
    )
    assert ready.returncode == 0
    dead = subprocess.run([sys.executable, str(HEALTHCHECK), f"https://127.0.0.1:{free_port()}/readyz"], timeout=30)
    assert dead.returncode == 1
    # the image's default is the readiness path on the port the example configuration listens on
    src = HEALTHCHECK.read_text()
    assert 'READY_PATH = "/readyz"' in src and "https://127.0.0.1:8443{READY_PATH}" in src


def test_the_postgresql_profile_runs_two_replicas_on_one_database(deployment: Deployment) -> None:
    """Two replicas, each with its own OPA (reached as `opa` on a network of its own), one
    PostgreSQL, one schema upgrade before either starts, and one configuration naming the shared
    database, its password and the shared request-state key, all of which make compose-config made."""
    services = deployment.compose["services"]
    profile = {name for name, svc in services.items() if "postgresql" in (svc.get("profiles") or [])}
    assert profile == {"postgres", "db-upgrade", "opa-a", "opa-b", "pvegate-a", "pvegate-b"}
    assert not (services["opa"].get("profiles") or services["pvegate"].get("profiles"))  # the default is unchanged
    for side in ("a", "b"):
        gw, opa = deployment.service(f"pvegate-{side}"), deployment.service(f"opa-{side}")
        assert gw["command"] == ["serve", "--config", "/etc/pvegate/pvegate-pg.yaml"]
        assert gw["depends_on"] == {
            f"opa-{side}": {"condition": "service_healthy"},
            "db-upgrade": {"condition": "service_completed_successfully"},
        }
        assert opa["networks"] == {f"policy-{side}": {"aliases": ["opa"]}}
        assert opa["command"] == deployment.service("opa")["command"]  # the same signed bundle, verified
        assert f"policy-{side}" in gw["networks"] and "state" in gw["networks"] and "policy" not in gw["networks"]
        assert deployment.compose["networks"][f"policy-{side}"]["internal"] is True
        for source, target in _bind_mounts(gw):
            assert deployment.host_path(source).exists(), (side, source, target)
    assert deployment.service("pvegate-a")["ports"] != deployment.service("pvegate-b")["ports"]
    pg = deployment.service("postgres")
    assert "synchronous_commit=on" in pg["command"] and pg["networks"] == ["state"]
    assert deployment.compose["networks"]["state"]["internal"] is True
    assert deployment.service("db-upgrade")["command"][:2] == ["db", "upgrade"]

    config_dir = deployment.docker / "config"
    cfg = load(config_dir / "pvegate-pg.yaml")
    assert cfg.storage.postgresql and cfg.storage.url == "postgresql://pvegate@postgres:5432/pvegate"
    assert cfg.opa.url == "http://opa:8181"
    max_connections = int(next(a for a in pg["command"] if a.startswith("max_connections=")).split("=")[1])
    assert max_connections > 2 * cfg.storage.pool_max_size + 10
    secrets_made = {"pg-password", "state-key"}
    for ref in (cfg.storage.password, cfg.state_key):
        assert ref is not None and ref.file is not None and ref.file.name in secrets_made
        made = config_dir / ref.file.relative_to("/etc/pvegate")
        assert made.stat().st_mode & 0o077 == 0 and len(made.read_text().strip()) >= 32
    env = _env_file(deployment.host_path(pg["env_file"]))
    assert env["POSTGRES_PASSWORD"] == (config_dir / "secrets" / "pg-password").read_text().strip()
    assert env["POSTGRES_USER"] == "pvegate" == env["POSTGRES_DB"]


def test_docker_compose_accepts_the_postgresql_profile(deployment: Deployment) -> None:
    """`docker-compose config` renders the profile (there is no Docker daemon here: nothing is run)."""
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose not installed (test_docker_compose_accepts_the_file says why)")
    cmd = ["docker-compose", "-f", str(deployment.docker / "compose.yaml"), "--profile", "postgresql", "config"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=deployment.docker)
    assert r.returncode == 0, r.stdout + r.stderr
    rendered = yaml.safe_load(r.stdout)["services"]
    assert {"postgres", "pvegate-a", "pvegate-b", "opa-a", "opa-b", "db-upgrade"} <= set(rendered)
    (deployment.docker / "config" / "postgres.env").rename(deployment.docker / "pg.env.away")  # control
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=deployment.docker)
        assert r.returncode != 0 and "postgres.env" in r.stderr
    finally:
        (deployment.docker / "pg.env.away").rename(deployment.docker / "config" / "postgres.env")
