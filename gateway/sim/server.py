"""Run one simulator: HTTPS API, plain-HTTP admin API, one SSH server per node."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from gateway.sim.admin import admin_app
from gateway.sim.api import ApiApp, dropped_filter
from gateway.sim.runtime import Runtime, build_runtime
from gateway.sim.scenario import load_scenario
from gateway.sim.ssh import host_key_fingerprint, make_keys, start_node_server
from gateway.sim.tls import make_tls

log = logging.getLogger("pvegate.sim")


@dataclass
class Options:
    scenario: str
    workdir: Path
    ready_file: Path | None = None
    api_port: int = 0
    admin_port: int = 0
    ssh_port_base: int = 0
    ssh: bool = True
    schema_dir: Path | None = None


class _QuietServer(uvicorn.Server):
    """The simulator owns signal handling (several uvicorn servers share one loop)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # inherited by accepted sockets on Linux: without it, header+body writes hit Nagle/delayed-ACK (40 ms)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.bind(("127.0.0.1", port))
    s.listen(1024)
    s.setblocking(False)
    return s


def _uvicorn(app: Any, tls: tuple[Path, Path] | None) -> _QuietServer:
    cfg = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        http="h11",
        lifespan="off",
        ws="none",
        ssl_certfile=str(tls[0]) if tls else None,
        ssl_keyfile=str(tls[1]) if tls else None,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=1,
        server_header=False,
        date_header=True,
    )
    return _QuietServer(cfg)


async def serve(opts: Options, on_ready: Any = None) -> None:
    scenario = load_scenario(opts.scenario)
    rt: Runtime = build_runtime(scenario, opts.schema_dir)
    cl = rt.cluster
    tls = make_tls(opts.workdir, cl.name)
    api_sock = _bind(opts.api_port)
    admin_sock = _bind(opts.admin_port)
    api_port = api_sock.getsockname()[1]
    admin_port = admin_sock.getsockname()[1]
    logging.getLogger("uvicorn.error").addFilter(dropped_filter)
    api = _uvicorn(ApiApp(rt), (tls.cert_file, tls.key_file))
    admin = _uvicorn(admin_app(rt), None)
    ssh_servers: list[Any] = []
    ssh_nodes: dict[str, dict[str, Any]] = {}
    client_key = ""
    if opts.ssh:
        keys = make_keys(opts.workdir, list(cl.nodes))
        client_key = str(keys.client_key)
        for i, name in enumerate(cl.nodes):
            port = opts.ssh_port_base + i if opts.ssh_port_base else 0
            srv, real = await start_node_server(rt, name, keys, port)
            ssh_servers.append(srv)
            ssh_nodes[name] = {
                "name": name,
                "ssh_host": "127.0.0.1",
                "ssh_port": real,
                "host_key": keys.host_pub[name],
                "host_key_fingerprint": host_key_fingerprint(keys.host_pub[name]),
            }
    api_task = asyncio.create_task(api.serve(sockets=[api_sock]))
    admin_task = asyncio.create_task(admin.serve(sockets=[admin_sock]))
    while not (api.started and admin.started):
        if api_task.done() or admin_task.done():
            await asyncio.gather(api_task, admin_task)
            raise RuntimeError("simulator HTTP servers failed to start")
        await asyncio.sleep(0.01)
    info = {
        "pid": os.getpid(),
        "cluster": cl.name,
        "version": cl.version,
        "api_url": f"https://127.0.0.1:{api_port}/api2/json",
        "ca_file": str(tls.ca_file),
        "fingerprint": tls.fingerprint,
        "tokens": {t.name: f"{t.tokenid}={t.secret}" for t in cl.tokens.values()},
        "ssh_nodes": ssh_nodes,
        "ssh_user": "root",
        "ssh_client_key": client_key,
        "admin_url": f"http://127.0.0.1:{admin_port}/_sim",
        "schema": rt.schema.source,
        "scenario": scenario.source,
    }
    if opts.ready_file:
        tmp = opts.ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2))
        tmp.replace(opts.ready_file)  # atomic: the harness never reads half a file
    if on_ready:
        on_ready(info)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    api.should_exit = True
    admin.should_exit = True
    for s in ssh_servers:
        s.close()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(api_task, admin_task, return_exceptions=True), timeout=3)
