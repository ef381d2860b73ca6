"""The wheel alone carries what `pvegate check` and `pvegate sim` need: built from the tracked files,
installed into a fresh virtualenv outside the checkout, run from a temporary directory.

Only pvegate's own code and data come from the wheel. Its dependencies (starlette, httpx, ...) are
not what is under test and a download would make the test slow and network-bound, so the new
virtualenv sees this venv's site-packages through a path file. That path is appended after the
venv's own site-packages and its `.pth` files (the editable install's import hook among them) are not
run, so the checkout cannot leak in: the test asserts where `gateway` was imported from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

from gateway.core import processes
from gateway.policy.opa_sidecar import REPO_ROOT

SCHEMA_FILES = ("pve-8.4-apidata.json.gz", "pve-9.1-apidata.json.gz", "LICENSE-AGPL-3.0", "README.md")


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload, no-any-return]


def _fresh_clone(dest: Path) -> None:
    """The files git would give a fresh clone (tracked, plus new ones not ignored), as they are now."""
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT, timeout=30)
    assert listed.returncode == 0, listed.stderr
    for name in filter(None, listed.stdout.split("\0")):
        src = REPO_ROOT / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def test_an_installed_wheel_finds_the_pve_schema(tmp_path: Path) -> None:
    started = time.monotonic()
    clone, wheels, venv, work = (tmp_path / d for d in ("clone", "wheels", "venv", "cwd"))
    for d in (clone, wheels, work):
        d.mkdir()
    _fresh_clone(clone)
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(clone)], timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.glob("pvegate-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert {f"gateway/pve_schema/{f}" for f in SCHEMA_FILES} <= names

    made = _run([sys.executable, "-m", "venv", str(venv)], timeout=120)
    assert made.returncode == 0, made.stderr
    py = venv / "bin" / "python"
    inst = _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], timeout=120)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    site = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    (Path(site) / "pvegate-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PVEGATE_", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    where = _run([str(py), "-c", "import gateway.pve_schema as m; print(m.__file__)"], cwd=work, env=env, timeout=60)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the wheel's copy, not the checkout

    # `pvegate check` (the wheel carries no connectors/: point it at the clone's)
    pvegate = str(venv / "bin" / "pvegate")
    r = _run([pvegate, "check", "--connectors", str(clone / "connectors")], cwd=work, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    shipped = Path(site).resolve() / "gateway" / "pve_schema"
    assert f"{shipped / 'pve-8.4-apidata.json.gz'}, {shipped / 'pve-9.1-apidata.json.gz'}: OK" in r.stdout

    # `pvegate sim` starts with the shipped schema, answers, and stops
    ready = work / "ready.json"
    cmd = [pvegate, "sim", "--scenario", "small", "--no-ssh", "--quiet", "--workdir", str(work / "sim")]
    proc = subprocess.Popen(
        [*cmd, "--ready-file", str(ready), "--exit-with-parent", str(os.getpid())],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), f"simulator not ready (exit {proc.poll()})"
        info = json.loads(ready.read_text())
        assert info["schema"] == str(shipped / "pve-8.4-apidata.json.gz")  # the small scenario is PVE 8.4
    finally:
        processes.stop(proc, grace=10)
    assert time.monotonic() - started < 120


# -- the image: docker/Dockerfile's final stage, laid out in a directory -------------------------------


def _image(clone: Path, root: Path) -> tuple[Path, dict[str, str], list[str]]:
    """The Dockerfile's final stage laid out under `root` (an image path /x is root/x): its COPY, WORKDIR
    and ENV as Docker applies them; a tool copied from a build stage is this checkout's build of the
    same pinned binary. Returns (WORKDIR, ENV with image paths mapped, `pip install` arguments)."""
    text = (clone / "docker" / "Dockerfile").read_text().replace("\\\n", " ")
    final = text.split("\nFROM ")[-1].splitlines()[1:]

    def at(path: str, workdir: Path) -> Path:
        return root / path.lstrip("/") if path.startswith("/") else workdir / path

    workdir, env, pip = root, {}, []
    for line in final:
        word, _, rest = line.strip().partition(" ")
        if word == "WORKDIR":
            workdir = at(rest.strip(), workdir)
            workdir.mkdir(parents=True, exist_ok=True)
        elif word == "COPY":
            *sources, dest = rest.split()
            if sources[0].startswith("--from="):
                built = [REPO_ROOT / ".tools" / "bin" / Path(s).name for s in sources[1:]]
            else:
                built = [clone / s for s in sources]
            target = at(dest, workdir)
            for src in built:
                if src.is_dir():  # a directory's contents go into dest
                    shutil.copytree(src, target, dirs_exist_ok=True)
                else:
                    into = target / src.name if dest.endswith("/") or len(built) > 1 else target
                    into.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, into)
        elif word == "ENV":
            for pair in rest.split():
                name, _, value = pair.partition("=")
                env[name] = str(at(value, workdir)) if value.startswith("/") else value
        elif word == "RUN" and "pip install" in rest:
            pip = rest.split("pip install", 1)[1].split("&&")[0].split()
    assert pip, "the Dockerfile's final stage has no `pip install`"
    return workdir, env, pip


def test_the_image_layout_runs_config_check_and_bundle_build(tmp_path: Path) -> None:
    """What the image runs: `pvegate config check` and `pvegate bundle build` (its policy checks, OPA,
    Regal, the policies/ it builds by default) from the package as the Dockerfile installs it."""
    clone, image, venv, out = (tmp_path / d for d in ("clone", "image", "venv", "out"))
    for d in (clone, image, out):
        d.mkdir()
    _fresh_clone(clone)
    workdir, image_env, pip_args = _image(clone, image)
    made = _run([sys.executable, "-m", "venv", str(venv)], timeout=120)
    assert made.returncode == 0, made.stderr
    py = venv / "bin" / "python"
    inst = _run([str(py), "-m", "pip", "install", "-q", "--no-deps", *pip_args], cwd=workdir, timeout=300)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    site = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    (Path(site) / "pvegate-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PVEGATE_", "PYTHON", "VIRTUAL_ENV", "OPA", "REGAL"))
    }
    env |= image_env
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{image / 'usr/local/bin'}{os.pathsep}{env.get('PATH', '')}"
    where = _run([str(py), "-c", "import gateway; print(gateway.__file__)"], cwd=out, env=env, timeout=60)
    assert not Path(where.stdout.strip()).is_relative_to(REPO_ROOT), where.stdout  # never this checkout

    pvegate = str(venv / "bin" / "pvegate")
    # the configuration the image is documented with (docker/config.example), and a managed one with --files
    r = _run(
        [pvegate, "config", "check", str(clone / "docker" / "config.example" / "pvegate.yaml")],
        cwd=workdir,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (out / "jwt").write_text("a-test-signing-secret-of-some-length-0123456789\n")
    (out / "pve").write_text("pvegate@pve!gw=00000000-0000-0000-0000-000000000000\n")
    (out / "pvegate.yaml").write_text(
        "tls: {insecure_http: true}\n"
        "auth: {issuer: test, audience: pvegate, hs256_secret: {file: jwt}}\n"
        "clusters: [{name: prod, api_url: 'https://127.0.0.1:9/api2/json', token: {file: pve}}]\n"
        f"connectors_dir: {workdir / 'connectors'}\n"
        f"state_dir: {out / 'state'}\n"
    )
    r = _run([pvegate, "config", "check", "--files", str(out / "pvegate.yaml")], cwd=workdir, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr

    r = _run([pvegate, "bundle", "keygen", "--out", str(out / "keys")], cwd=workdir, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    bundle = out / "pvegate.tar.gz"
    build = [pvegate, "bundle", "build", "--signing-key", str(out / "keys" / "bundle-signing.pem"), "-o", str(bundle)]
    r = _run(build, cwd=workdir, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "policy checks passed" in r.stdout and bundle.exists(), r.stdout
    verify = [pvegate, "bundle", "verify", str(bundle), "--verification-key", str(out / "keys" / "bundle-verify.pem")]
    r = _run(verify, cwd=workdir, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_image_pins_the_tools_the_tests_run() -> None:
    """The image's OPA and Regal are the versions `make tools` provisions (the ones the tests ran)."""
    dockerfile = (REPO_ROOT / "docker" / "Dockerfile").read_text()
    for name, script in (("OPA_VERSION", "provision-tools.sh"), ("REGAL_VERSION", "provision-regal.sh")):
        pinned = (REPO_ROOT / "scripts" / script).read_text().split(f'{name}="${{{name}:-', 1)[1].split("}", 1)[0]
        assert f"ARG {name}={pinned}\n" in dockerfile, (name, pinned)
