"""The HTTPS `/api2/json` ASGI app: auth → schema lookup → validation → ACL → handler → envelope.

Order follows pve-http-server: credentials are checked before the handler
lookup, so an unknown path without a token is still a 401.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any
from urllib.parse import parse_qsl, unquote

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

import gateway.sim.handlers_access  # noqa: F401  (registers the identity routes)
from gateway.sim import (  # noqa: F401  (register routes)
    handlers_backup,
    handlers_certs,
    handlers_cluster,
    handlers_firewall,
    handlers_ha,
    handlers_node,
    handlers_provision,
    handlers_read,
    handlers_sdn,
    handlers_storage,
    handlers_write,
)
from gateway.sim.auth import authenticate
from gateway.sim.errors import ApiError, perm_denied
from gateway.sim.faults import FAULT_MESSAGES
from gateway.sim.routes import ROUTES, Ctx, RawBody, Reply
from gateway.sim.runtime import Runtime
from gateway.sim.schema import Endpoint, ParamError

log = logging.getLogger("pvegate.sim.api")
PREFIX = "/api2/json"
JSON_CT = "application/json;charset=UTF-8"
HEADERS = {"server": "pve-api-daemon/3.0", "cache-control": "max-age=0", "pragma": "no-cache"}


class DroppedConnection(Exception):
    """Raised on purpose after a partial response so the server cuts the connection."""


def _json(status: int, body: dict[str, Any]) -> Response:
    return Response(
        json.dumps(body, separators=(",", ":")),
        status_code=status,
        media_type=None,
        headers={**HEADERS, "content-type": JSON_CT},
    )


def error_response(e: ApiError) -> Response:
    body: dict[str, Any] = {"data": None, "message": e.message + "\n"}
    if e.errors:
        body["errors"] = e.errors
    return _json(e.status, body)


def _subst(template: str, params: dict[str, Any]) -> str:
    return re.sub(r"\{([^}]+)\}", lambda m: str(params.get(m.group(1), m.group(0))), template)


def check_schema_perm(ctx: Ctx, ep: Endpoint) -> None:
    """Evaluate the endpoint's `permissions.check` expression (perm/and/or)."""
    check = ep.permissions.get("check")
    if not check:
        return
    if not _eval(ctx, check):
        raise _denial(ctx, check)


def _eval(ctx: Ctx, expr: list[Any]) -> bool:
    op = expr[0]
    if op == "perm":
        opts = expr[3:]
        if "require_param" in opts:
            # the check only applies when that parameter was passed
            pname = opts[opts.index("require_param") + 1]
            if pname not in ctx.params:
                return False
        path = _subst(expr[1], ctx.params)
        privs = list(expr[2])
        if "any" in opts:
            return ctx.can(path, *privs)
        return all(ctx.can(path, p) for p in privs)
    if op == "and":
        return all(_eval(ctx, e) for e in expr[1:])
    if op == "or":
        return any(_eval(ctx, e) for e in expr[1:])
    return True  # userid-param etc.: not used by implemented endpoints


def _denial(ctx: Ctx, expr: list[Any]) -> ApiError:
    op = expr[0]
    if op == "perm":
        path = _subst(expr[1], ctx.params)
        privs = list(expr[2])
        if "any" in expr[3:]:
            return perm_denied(path, "|".join(privs))
        missing = next(p for p in privs if not ctx.can(path, p))
        return perm_denied(path, missing)
    for e in expr[1:]:
        if not _eval(ctx, e):
            return _denial(ctx, e)
    return perm_denied("/", "?")


class ApiApp:
    """Raw ASGI app (no router) so the hot path stays short."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        entry: dict[str, Any] = {
            "method": request.method,
            "path": scope["path"],
            "query": scope.get("query_string", b"").decode(),
            "body": None,
            "status": None,
            "token_id": None,
        }
        self.rt.requests.append(entry)
        response = await self.handle(request, entry)
        entry["status"] = response.status_code
        delay = self.rt.faults.answer_delay_for(scope["path"][len(PREFIX) :].rstrip("/") or "/")
        if delay:  # the request was carried out; its answer is late (a client may give up first)
            await asyncio.sleep(delay)
        if entry.get("dropped"):
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", JSON_CT.encode()), (b"content-length", b"4096")],
                }
            )
            await send({"type": "http.response.body", "body": b'{"data":[', "more_body": True})
            raise DroppedConnection("simulated dropped connection")
        await response(scope, receive, send)

    async def handle(self, request: Request, entry: dict[str, Any]) -> Response:
        rt = self.rt
        full = request.url.path
        if not full.startswith(PREFIX + "/") and full != PREFIX:
            return Response(status_code=404)
        path = full[len(PREFIX) :].rstrip("/") or "/"
        method = request.method
        principal = authenticate(rt.cluster, request.headers.get("authorization"))
        if principal is None:
            if rt.cluster.auth_failure_delay:
                await asyncio.sleep(rt.cluster.auth_failure_delay)
            return Response(status_code=401, headers=HEADERS)
        entry["token_id"] = principal.tokenid
        # pve-http-server reads a body for POST and PUT only; any other method carrying content is
        # refused before a handler runs (AnyEvent.pm process_header), never run without its parameters
        if method not in ("POST", "PUT") and request.headers.get("content-length", "0").strip() not in ("", "0"):
            return error_response(ApiError(501, f"Unexpected content for method '{method}'"))
        f = rt.faults
        delay = f.latency_for(path)
        if delay:
            await asyncio.sleep(delay)
        if f.drop_for(path):
            entry["dropped"] = True
            return Response(status_code=200)
        code = f.error_for(path)
        if code is not None:
            return error_response(ApiError(code, FAULT_MESSAGES.get(code, "simulated error")))
        raw = dict(parse_qsl(request.url.query, keep_blank_values=True))
        if method in ("POST", "PUT"):
            raw.update(await _body_params(request))
        entry["body"] = {k: v for k, v in raw.items()} if method in ("POST", "PUT") else None
        ep, path_params, _ = rt.schema.match(method, path)
        raw_path = (request.scope.get("raw_path") or b"").decode("latin-1")
        if ep is None and "%2f" in raw_path.lower():  # a CIDR path segment, e.g. /ipset/x/10.0.0.0%2F24
            ep, path_params, _ = rt.schema.match(method, raw_path.split("?", 1)[0][len(PREFIX) :].rstrip("/"))
            path_params = {k: unquote(v) for k, v in path_params.items()}
        handler = ROUTES.get((method, ep.path)) if ep else None
        try:
            if ep is not None and not ep.info.get("allowtoken", 1):
                raise ApiError(
                    403, f"Permission check failed (URI '{path}' not available with API token, need proper ticket.)"
                )
            if handler is None:
                if ep is not None:
                    raise ApiError(
                        501, f"Method '{method} {path}' is in the PVE API but not implemented by the simulator"
                    )
                raise ApiError(501, f"Method '{method} {path}' not implemented")
            try:
                params = rt.schema.validate(ep, {**raw, **path_params})
            except ParamError as e:
                raise ApiError(400, "Parameter verification failed.", e.errors) from None
            ctx = Ctx(rt=rt, principal=principal, method=method, path=path, params=params)
            if ep is not None:
                check_schema_perm(ctx, ep)
                node = params.get("node")
                if ep.info.get("proxyto") == "node" and isinstance(node, str):
                    _check_node(rt, node)
            result = handler(ctx)
        except ApiError as e:
            return error_response(e)
        except Exception as e:  # a simulator bug: answer like a PVE handler `die`, keep serving
            log.exception("handler for %s %s crashed", method, path)
            return error_response(ApiError(500, f"simulator error: {e}"))
        if isinstance(result, RawBody):
            return Response(result.body, status_code=200, headers={**HEADERS, "content-type": JSON_CT})
        if isinstance(result, Reply):
            body = {"data": result.data, **(result.extra or {})}
        else:
            body = {"data": result}
        return _json(200, body)


def _check_node(rt: Runtime, node: str) -> None:
    if node not in rt.cluster.nodes:
        raise ApiError(
            500, f"hostname lookup '{node}' failed - failed to get address info for: {node}: Name or service not known"
        )
    if not rt.node_online(node):
        raise ApiError(595, "Errors during connection establishment, proxy handshake: No route to host")


async def _body_params(request: Request) -> dict[str, str]:
    raw = await request.body()
    if not raw:
        return {}
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("application/json"):
        try:
            obj = json.loads(raw)
        except ValueError:
            raise ApiError(400, "Parameter verification failed.", {"body": "invalid JSON"}) from None
        if not isinstance(obj, dict):
            return {}
        return {k: (str(int(v)) if isinstance(v, bool) else str(v)) for k, v in obj.items()}
    return dict(parse_qsl(raw.decode(), keep_blank_values=True))


def dropped_filter(record: logging.LogRecord) -> bool:
    """Keep uvicorn from logging our deliberate dropped connections as crashes."""
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, DroppedConnection)


__all__ = ["ApiApp", "dropped_filter", "perm_denied"]
