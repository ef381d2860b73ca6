"""`pvegate sim` / `python -m gateway.sim`: run a simulator in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from gateway.sim.schema import SchemaNotFound
from gateway.sim.server import Options, serve


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pvegate sim", description="Run the Proxmox VE simulator (HTTPS API + SSH).")
    p.add_argument("--scenario", default="default", help="shipped scenario (small, default, second) or a YAML path")
    p.add_argument("--workdir", type=Path, default=None, help="where CA, certs and SSH keys are written")
    p.add_argument("--ready-file", type=Path, default=None, help="write connection info as JSON here when ready")
    p.add_argument("--api-port", type=int, default=0, help="HTTPS API port on 127.0.0.1 (0: ephemeral)")
    p.add_argument("--admin-port", type=int, default=0, help="admin HTTP port on 127.0.0.1 (0: ephemeral)")
    p.add_argument("--ssh-port-base", type=int, default=0, help="first SSH port, one per node (0: ephemeral)")
    p.add_argument("--no-ssh", action="store_true", help="do not start SSH servers")
    p.add_argument(
        "--pve-schema",
        type=Path,
        default=None,
        help="directory with pve-{8.4,9.1}-apidata.json[.gz] "
        "(default: $PVEGATE_PVE_SCHEMA_DIR, else the schema shipped with pvegate)",
    )
    p.add_argument("--quiet", action="store_true", help="do not print connection info")
    p.add_argument("--exit-with-parent", type=int, default=None, metavar="PID", help="exit when process PID is gone")
    return p


def _exit_with(pid: int) -> None:
    """Exit when the launching process is gone (even by SIGKILL, which runs no clean-up of its own)."""

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(0)  # the simulator keeps no state worth a graceful shutdown
            except PermissionError:
                pass  # the pid exists (owned by someone else)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _print_info(info: dict[str, Any]) -> None:
    out = sys.stdout
    out.write(f"pvegate simulator: cluster '{info['cluster']}' (PVE {info['version']})\n")
    out.write(f"  API         {info['api_url']}\n")
    out.write(f"  CA          {info['ca_file']}\n")
    out.write(f"  cert sha256 {info['fingerprint']}\n")
    out.write(f"  admin       {info['admin_url']}\n")
    out.write(f"  schema      {info['schema']}\n")
    out.write("  tokens (Authorization: PVEAPIToken=<value>):\n")
    for name, tok in info["tokens"].items():
        out.write(f"    {name:<10} {tok}\n")
    if info["ssh_nodes"]:
        out.write(f"  SSH (user {info['ssh_user']}, key {info['ssh_client_key']}):\n")
        for name, n in info["ssh_nodes"].items():
            out.write(f"    {name:<8} {n['ssh_host']}:{n['ssh_port']}  {n['host_key_fingerprint']}\n")
            out.write(f"             {n['host_key']}\n")
    out.write("Serving until Ctrl-C.\n")
    out.flush()


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.exit_with_parent:
        _exit_with(args.exit_with_parent)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pvegate-sim-"))
    opts = Options(
        scenario=args.scenario,
        workdir=workdir,
        ready_file=args.ready_file,
        api_port=args.api_port,
        admin_port=args.admin_port,
        ssh_port_base=args.ssh_port_base,
        ssh=not args.no_ssh,
        schema_dir=args.pve_schema,
    )
    try:
        asyncio.run(serve(opts, on_ready=None if args.quiet else _print_info))
    except KeyboardInterrupt:
        pass
    except (FileNotFoundError, SchemaNotFound) as e:
        sys.stderr.write(f"pvegate sim: {e}\n")
        return 2
    return 0
