"""The `pvegate` command line: serve, sim, demo, token, and the operator tools."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from gateway.core.config import ConfigError, load
from gateway.tools.catalog import CatalogError

Handler = Callable[[argparse.Namespace], int]

MAX_TOKEN_TTL = 30 * 86400  # `token mint --ttl`: a service token for longer than this is a credential to rotate

EXIT_STATUS = (
    "Exit status, every command: 0 done; 2 a usage error (an unknown option, a value out of range) or a "
    "configuration that cannot be loaded (one `error: FILE: problem` line per problem; `serve` and `stdio` say "
    "`pvegate: cannot start: ...`; `config check` exits 1, its finding); 141 the reader of the output went away "
    "(`| head`), quietly; 130 interrupted. Otherwise each command's own, on its page: most exit 1 on an error "
    "said in one `error: ...` line (a database that cannot be read, a file that cannot be written); "
    "`audit verify` exits 1 when the audit does not verify and 2 when it cannot be checked at all "
    "(the PostgreSQL database cannot be connected to); `policy replay` exits 1 only for its gate and 2 "
    "when it could not run; `approvals` exits 2 for a credential error and 4 for no such request."
)


def config_problems(exc: ConfigError) -> list[str]:
    """One line per problem, each saying which file it is in."""
    where = f"{exc.source}: " if exc.source is not None else ""
    return [f"{where}{p}" for p in exc.problems] or [f"{where}invalid configuration"]


def _serve(args: argparse.Namespace) -> int:
    """Run the gateway; if it cannot start, say why in one line (the traceback only with -v)."""
    from gateway.observability.logs import configure
    from gateway.server import StartupError, serve

    try:
        config = load(args.config)
        configure(config.log_format, logging.DEBUG if args.verbose else logging.INFO)
        serve(config)
    except ConfigError as exc:
        lines = config_problems(exc)
        if len(lines) > 1:
            lines.insert(0, f"{len(lines)} problems in the configuration:")
        print(f"pvegate: cannot start: {lines[0]}", *lines[1:], sep="\n", file=sys.stderr)
        return 2
    except StartupError as exc:
        logging.getLogger("pvegate").debug("start-up failed", exc_info=True)
        print(f"pvegate: cannot start: {exc}", file=sys.stderr)
        return 2
    return 0


def _token_mint(args: argparse.Namespace) -> int:
    from gateway.auth.tokens import mint_hs256

    cfg = load(args.config)
    if cfg.auth.hs256_secret is None:
        print("error: auth.hs256_secret is not configured", file=sys.stderr)
        return 2
    secret = cfg.auth.hs256_secret.read()  # a secret that cannot be read: a ConfigError, said by main()
    if not secret:
        print(f"error: {cfg.auth.hs256_secret.setting}: the secret is empty", file=sys.stderr)
        return 2
    print(
        mint_hs256(
            secret,
            issuer=cfg.auth.issuer,
            audience=cfg.auth.audience,
            sub=args.sub,
            roles=args.role or [],
            groups=args.group or [],
            scopes=args.scope or [],
            kind=args.kind,
            ttl_seconds=args.ttl,
        )
    )
    return 0


def _demo(args: argparse.Namespace) -> int:
    from gateway.cli.demo import run_demo

    return run_demo(oneshot=args.oneshot, port=args.port, idp=args.idp)


def _sim(argv: list[str]) -> int:
    from gateway.sim.cli import main as sim_main

    return int(sim_main(argv))


def int_range(low: int, high: int, what: str) -> Callable[[str], int]:
    """An argparse type: an integer from `low` to `high` (a usage error otherwise, exit 2)."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"{what} must be from {low} to {high}: {n}")
        return n

    parse.__name__ = what
    return parse


def not_blank(what: str) -> Callable[[str], str]:
    """An argparse type: text that is not blank (a usage error otherwise, exit 2)."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"a blank {what}: {text!r}")
        return text

    parse.__name__ = what
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pvegate", description="Policy-as-code MCP gateway for Proxmox VE", epilog=EXIT_STATUS
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the gateway")
    s.add_argument(
        "--config",
        "-c",
        type=Path,
        default=Path("pvegate.yaml"),
        help="the gateway configuration file",
    )
    s.set_defaults(func=_serve)

    d = sub.add_parser("demo", help="simulator + OPA sidecar + gateway, with a scripted agent session")
    d.add_argument("--oneshot", action="store_true", help="exit after the scripted session")
    d.add_argument(
        "--port",
        type=int_range(1, 65535, "a port"),
        default=8443,
        help="the gateway's HTTPS port on 127.0.0.1, 1 to 65535 (make demo PORT=...)",
    )
    d.add_argument(
        "--idp",
        action="store_true",
        help="also start Keycloak (make tools provisions it): the gateway trusts its realm and the admin"
        " console is enabled; prints the console URL and the demo users (make demo IDP=1)",
    )
    d.set_defaults(func=_demo)

    sub.add_parser("sim", help="run the Proxmox VE simulator (see `pvegate sim --help`)", add_help=False)

    t = sub.add_parser("token", help="service tokens")
    tsub = t.add_subparsers(dest="token_command", required=True)
    m = tsub.add_parser("mint", help="mint an HS256 service token")
    m.add_argument(
        "--config",
        "-c",
        type=Path,
        default=Path("pvegate.yaml"),
        help="the gateway configuration file",
    )
    # a blank subject mints a token the gateway refuses on every request; a blank role, group or scope is none
    m.add_argument(
        "--sub", required=True, type=not_blank("subject"), help="the subject (principal name) the token is for"
    )
    m.add_argument("--role", action="append", type=not_blank("role"), help="a role claim (repeatable)")
    m.add_argument(
        "--group",
        action="append",
        type=not_blank("group"),
        help="a group claim, e.g. sre-leads for approvers (repeatable)",
    )
    m.add_argument(
        "--scope",
        action="append",
        type=not_blank("scope"),
        help="an OAuth scope (repeatable); auth.required_scopes must all be present",
    )
    m.add_argument(
        "--kind", default="agent", choices=["agent", "human", "service"], help="principal kind; only humans may approve"
    )
    m.add_argument(
        "--ttl",
        type=int_range(1, MAX_TOKEN_TTL, "a lifetime"),
        default=3600,
        help=f"lifetime in seconds, 1 to {MAX_TOKEN_TTL} (30 days)",
    )
    m.set_defaults(func=_token_mint)

    from gateway.cli.commands import register_all

    register_all(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim":  # the simulator owns its own argument parsing
        return _sim(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("httpx", "httpx2", "asyncssh"):  # one line per request is not an operator log
        logging.getLogger(noisy).setLevel(logging.WARNING)
    handler: Handler = args.func
    try:
        rc = handler(args)
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at interpreter exit
        return rc
    except ConfigError as exc:
        for line in config_problems(exc):
            print(f"error: {line}", file=sys.stderr)
        return 2
    except CatalogError as exc:  # a connector file the configuration points at is wrong: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`pvegate tools list | head`): not an error worth a traceback.
        # Point stdout at /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a program killed by the same pipe


if __name__ == "__main__":
    sys.exit(main())
