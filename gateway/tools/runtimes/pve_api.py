"""The pve_api runtime: declared method + path template → one HTTPS request to Proxmox.

The API token is read from the cluster's secret reference and sent only in the
Authorization header; it never comes from a tool call and is never logged. Only
the fields a connector declares (query/body allow-list) are ever sent.

Whatever Proxmox (or a proxy in front of it) writes into an error reaches the client only
through `Scrub`: the token's id and secret taken out, cut to UPSTREAM_TEXT_MAX characters.
A mutation whose answer does not say what happened (a proxy status after forwarding, a
redirect, a malformed or oversized answer, a lost task status) is AnswerLost: it is
recorded interrupted and its outcome read back from Proxmox, never assumed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import signal
import ssl
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

from gateway.core.config import ClusterConfig
from gateway.core.redaction import strip_userinfo
from gateway.core.text import cut
from gateway.tools.runtimes.base import (
    AnswerLost,
    CallContext,
    GuestLocator,
    Refused,
    TaskFailed,
    ToolError,
    ToolOutput,
    UpstreamError,
    freeze_for_test,
    test_fault,
)
from gateway.tools.runtimes.breaker import CircuitBreaker, CircuitOpen, is_outage
from gateway.tools.runtimes.reducers import TRANSFORMS
from gateway.tools.runtimes.transport import AnswerMissing, AnswerTooLarge, NotSent, PveHttp, Reply
from gateway.tools.tool import PLACEHOLDER, Tool

log = logging.getLogger("pvegate.pve_api")
READ_RETRIES = 2  # extra attempts, GET only: a retried mutation could run twice
PERM_RE = re.compile(r"Permission check failed \(([^,]+), ([^)]+)\)")
# pve-common PVE/UPID.pm's decoder, matched whole
UPID_RE = re.compile(
    r"UPID:(?P<node>[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?):(?P<pid>[0-9A-Fa-f]{8}):(?P<pstart>[0-9A-Fa-f]{8,9}):"
    r"(?P<starttime>[0-9A-Fa-f]{8}):(?P<type>[^:\s/]+):(?P<id>[^:\s/]*):(?P<user>[^:\s/]+):"
)
UPSTREAM_TEXT_MAX = 400  # characters of any upstream text (message, reason, errors) in a client's error
# AnyEvent::HTTP statuses pveproxy passes on when forwarding to the target node failed after the
# request went out (596: sending it or reading the headers, 597: reading the body, 599: other), and a
# reverse proxy's bad gateway / gateway timeout: the node may have run it. Only 595 (no connection
# to the node) says nothing was sent.
SENT_OUTCOME_UNKNOWN = frozenset({502, 504, 596, 597, 599})


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _normalize_fp(fp: str) -> str:
    return fp.replace(":", "").strip().lower()


def _pinned_context(cluster: ClusterConfig) -> ssl.SSLContext:
    """Trust exactly the certificate whose SHA-256 fingerprint is configured.

    The server's certificate is fetched once, compared with the pin, and made the
    only trust anchor: every later handshake with another certificate fails before
    the token is sent.
    """
    assert cluster.fingerprint is not None
    parts = urlsplit(cluster.api_url)
    pem = ssl.get_server_certificate((parts.hostname or "", parts.port or 8006), timeout=cluster.timeout)
    got = hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()
    if got != _normalize_fp(cluster.fingerprint):
        raise UpstreamError(
            f"TLS verification of Proxmox cluster {cluster.name} failed: its certificate does not match "
            "the pinned fingerprint",
            "tls",
        )
    ctx = ssl.create_default_context(cadata=pem)
    ctx.check_hostname = False  # the pin identifies the server; PVE self-signed certs rarely name the URL host
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return ctx


def _ssl_context(cluster: ClusterConfig) -> ssl.SSLContext | bool:
    if not cluster.verify_tls:
        log.warning("TLS verification is OFF for cluster %s (verify_tls: false in the configuration)", cluster.name)
        return False
    if cluster.fingerprint:
        return _pinned_context(cluster)
    return ssl.create_default_context(cafile=str(cluster.ca_file) if cluster.ca_file else None)


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in out:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


class Scrub:
    """Upstream text made fit for a client's error: the token taken out (whole header value, the
    token, its id, its secret, also percent-encoded, and the start of a secret cut short), every
    URL's userinfo taken out, and the rest cut to UPSTREAM_TEXT_MAX characters. An upstream that
    echoes request headers (a WAF, a debugging proxy) would otherwise hand the gateway's token to
    the agent, and a failed task's exit status quotes the URL it was given (a mirror's password)."""

    def __init__(self, token: str) -> None:
        token_id, _, secret = token.strip().partition("=")
        literals = {v for v in (token.strip(), token_id, secret) if len(v) >= 6}
        literals |= {quote(v, safe="") for v in literals}
        parts = [r"PVEAPIToken\s*[=:]?\s*[^\s\"',;]*"]
        if len(secret) >= 8:  # an echo cut short still gives the secret's beginning away
            parts.append(re.escape(secret[:8]) + r"[\w-]*")
        parts += [re.escape(v) for v in sorted(literals, key=len, reverse=True)]
        self._re = re.compile("|".join(parts), re.IGNORECASE)

    def __call__(self, text: str, limit: int = UPSTREAM_TEXT_MAX) -> str:
        text = strip_userinfo(self._re.sub("[redacted]", text))
        return cut(text, limit)


def _no_task(data: Any, values: dict[str, Any], clean: Callable[[str, int], str]) -> str:
    """The error of a `task` tool Proxmox answered without a task id: what it said, where."""
    shown = "null" if data is None else f"'{data}'" if isinstance(data, str) else json.dumps(data, default=str)
    shown = clean(" ".join(shown.split()), 80)  # one short line, the token never in it
    where = ""
    if values.get("vmid") is not None and values.get("node"):
        where = f" (guest {values['vmid']} may no longer be on node {values['node']})"
    elif values.get("node"):
        where = f" (node {values['node']})"
    return f"Proxmox started no task: it answered {shown} instead of a task id{where}; nothing was done"


def _cut(text: str) -> str:
    return cut(text, UPSTREAM_TEXT_MAX)


def _connect_failure(exc: BaseException, cluster: ClusterConfig, clean: Callable[[str], str] = _cut) -> UpstreamError:
    """Name why a connection to the API failed: TLS verification, the endpoint not reachable, or the
    gateway's own connections to it all busy (nothing is known of the API then)."""
    where = urlsplit(cluster.api_url).netloc
    if isinstance(exc, NotSent) and exc.own:  # the caller's own requests, not anyone else's
        return UpstreamError(
            f"this principal's other calls hold all the connections to Proxmox cluster {cluster.name} ({where}) "
            f"one principal may use ({clean(str(exc))}); nothing was sent, retry when one has finished",
            "busy",
        )
    if isinstance(exc, NotSent) and exc.busy:
        return UpstreamError(
            f"the gateway's connections to Proxmox cluster {cluster.name} ({where}) are all busy with other calls "
            f"({clean(str(exc))}); nothing was sent, retry",
            "busy",
        )
    for e in _chain(exc):
        if isinstance(e, ssl.SSLCertVerificationError):
            trust = "the configured CA file" if cluster.ca_file else "the system CA store"
            return UpstreamError(
                f"TLS verification of Proxmox cluster {cluster.name} ({where}) failed: "
                f"{clean(str(e.verify_message or e.reason))} (the certificate is not trusted by {trust})",
                "tls",
            )
        if isinstance(e, ssl.SSLError):
            return UpstreamError(
                f"TLS handshake with Proxmox cluster {cluster.name} ({where}) failed "
                f"({clean(str(e.reason or type(e).__name__))})",
                "tls",
            )
    # asyncio words a refusal "Connect call failed (...)": the errno's own text says it plainer
    why = next(
        (
            os.strerror(e.errno) if isinstance(e, ConnectionError) and e.errno else e.strerror
            for e in _chain(exc)
            if isinstance(e, OSError) and e.strerror
        ),
        None,
    )
    if why is None:
        why = "no connection within the timeout" if isinstance(exc, NotSent) and exc.timeout else type(exc).__name__
    return UpstreamError(f"Proxmox cluster {cluster.name} is unreachable at {where} ({clean(why)})", "unreachable")


def _upstream_texts(r: Reply, clean: Callable[[str], str]) -> tuple[str, str]:
    """(message, reason) of an error answer, each scrubbed and cut; a body of any shape is read."""
    message = ""
    try:
        body = r.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        message = str(body.get("message") or "").strip()
        errors = body.get("errors")
        if isinstance(errors, dict) and errors:
            errs = "; ".join(f"{k}: {str(v).strip()}" for k, v in sorted(errors.items()))
            message = f"{message} ({errs})" if message else errs
    return clean(message), clean(r.reason.strip())


def _error_message(r: Reply, cluster: str, clean: Callable[[str], str] = _cut) -> str:
    message, reason = _upstream_texts(r, clean)
    if r.status == 403:
        m = PERM_RE.search(reason) or PERM_RE.search(message)
        if m:
            return f"the gateway's Proxmox token lacks {m.group(2)} on {m.group(1)} (cluster {cluster})"
        return f"Proxmox refused the gateway's token: {message or reason}"
    if r.status in (595, 596, 597, 599):
        return f"a node of cluster {cluster} is unreachable from the API node ({reason or message})"
    if r.status == 501:
        return f"this Proxmox version does not implement the endpoint ({message or reason})"
    if 300 <= r.status < 400:
        return f"Proxmox answered {r.status} (a redirect; the gateway follows none): {reason or message}"
    return f"Proxmox answered {r.status}: {message or reason}"


def _outcome_unknown(r: Reply, cluster: str, clean: Callable[[str], str]) -> str:
    """Why a mutation's answer does not say whether it ran (SENT_OUTCOME_UNKNOWN, a redirect)."""
    message, reason = _upstream_texts(r, clean)
    said = f"HTTP {r.status} {reason or message}".strip()
    if r.status in (596, 597, 599):
        return f"the API node of cluster {cluster} lost the target node after forwarding the request ({said})"
    if r.status in (502, 504):
        return f"a proxy in front of cluster {cluster} lost Proxmox's answer ({said})"
    return f"cluster {cluster} answered with no outcome ({said}; redirects are not followed)"


class PveApiClient:
    """One keep-alive HTTPS pool per cluster."""

    def __init__(self, cluster: ClusterConfig) -> None:
        self.cluster = cluster
        token = cluster.token.read()
        self._headers = {"Authorization": f"PVEAPIToken={token}"}
        self.clean = Scrub(token)  # every upstream text on its way into an error
        self._http: PveHttp | None = None
        self._lock = asyncio.Lock()
        # fail fast while the cluster's API is down, as the gateway's own GET /version finds it
        self.breaker = CircuitBreaker(cluster.name, probe=self._answers)

    async def _client(self) -> PveHttp:
        if self._http is None:
            async with self._lock:
                if self._http is None:
                    try:
                        verify = await asyncio.to_thread(_ssl_context, self.cluster)
                    except OSError as exc:
                        raise _connect_failure(exc, self.cluster, self.clean) from exc
                    self._http = PveHttp(self.cluster.api_url, self._headers, verify, self.cluster.timeout)
        return self._http

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        data: dict[str, Any] | None = None,
        envelope: tuple[str, ...] = (),
    ) -> Any:
        """The answer's `data`; with `envelope`, {"data": ..., key: value or None} for those keys too.

        A GET fails with a ToolError; any other method, once sent, with AnswerLost when its answer
        does not say whether it ran (it may have: the call is reconciled, not recorded failed)."""
        http = await self._client()
        mutation = method != "GET"
        attempts = 1 + (READ_RETRIES if not mutation else 0)
        last: ToolError | None = None
        for attempt in range(attempts):
            try:
                r = await self.breaker.call(lambda: http.request(method, path, params=params, data=data))
                break
            except CircuitOpen as exc:
                if last is not None:  # this call's own failures opened it: report their cause
                    raise last from exc
                raise
            except NotSent as exc:
                failure = _connect_failure(exc, self.cluster, self.clean)
                # a connect timeout already waited the whole timeout; TLS won't heal
                if attempt + 1 < attempts and not exc.timeout and failure.cause != "tls":
                    last = failure
                    await asyncio.sleep(0.1 * (attempt + 1))
                    continue
                raise failure from exc
            except AnswerTooLarge as exc:  # sent; the same answer again would be as large
                why = f"Proxmox cluster {self.cluster.name}'s answer was not read: {exc}"
                if mutation:
                    raise AnswerLost(why) from exc
                raise ToolError(why) from exc
            except AnswerMissing as exc:  # sent: only a read is asked again
                if exc.timeout:
                    last = AnswerLost(f"Proxmox cluster {self.cluster.name} did not answer in time ({exc})")
                else:
                    last = AnswerLost(f"Proxmox cluster {self.cluster.name} unreachable ({exc})")
                # a whole deadline spent on a dripping answer is not asked for again
                if attempt + 1 < attempts and not exc.deadline:
                    await asyncio.sleep(0.1 * (attempt + 1))
                    continue
                raise last from exc
        if r.status == 401:
            raise UpstreamError(
                f"Proxmox rejected the gateway's API token for cluster {self.cluster.name} (HTTP 401: "
                "check the token id, its secret and that it has not expired or been removed)",
                "auth",
            )
        if not 200 <= r.status < 300:
            message = _error_message(r, self.cluster.name, self.clean)
            if mutation and (r.status in SENT_OUTCOME_UNKNOWN or r.status < 400):
                raise AnswerLost(_outcome_unknown(r, self.cluster.name, self.clean))
            raise ToolError(message)
        try:
            doc = r.json()
            why = "" if isinstance(doc, dict) and "data" in doc else "JSON other than an object with `data`"
        except ValueError as exc:
            doc, why = None, f"a body that is no valid JSON ({self.clean(str(exc), 100)})"
        if why or not isinstance(doc, dict):
            text = f"Proxmox cluster {self.cluster.name} answered {r.status} with {why}, not the API's envelope"
            if mutation:  # it was accepted, and what it started cannot be read: looked up, not assumed
                raise AnswerLost(text)
            raise ToolError(text)
        if envelope:  # e.g. the network list's pending `changes`, which PVE sends beside data
            return {"data": doc.get("data"), **{k: doc.get(k) for k in envelope}}
        return doc["data"]

    async def ping(self) -> int:
        """GET /version with the gateway's token, past the breaker and without retries (the
        readiness report's reachability probe): the HTTP status. Raises on no answer."""
        http = await self._client()
        return (await http.request("GET", "/version", probe=True)).status

    async def _answers(self) -> bool:
        """The breaker's probe: whether the API answers the gateway's own request."""
        return not is_outage(await self.ping())

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


def render_path(template: str, values: dict[str, Any]) -> str:
    """Fill {placeholders} from validated values, each quoted as exactly one path segment."""

    def seg(m: re.Match[str]) -> str:
        if m.group(1) not in values:
            raise ToolError(f"path template {template} has an unfilled placeholder {{{m.group(1)}}}")
        s = quote(str(values[m.group(1)]), safe="")
        if s in ("", ".", ".."):
            raise ToolError(f"refused: empty or dot path segment for {m.group(1)}")
        return s

    return re.sub(r"\{([a-z_][a-z0-9_]*)\}", seg, template)


def _wire(value: Any) -> Any:
    return (1 if value else 0) if isinstance(value, bool) else value


# a value substituted into a PVE property string ("virtio,bridge=vmbr0,tag=20") may not
# carry a separator: otherwise a bridge name could smuggle in another option
PROPERTY_SEPARATORS = re.compile(r"[,=\s]")


def field_name(template: str, args: dict[str, Any]) -> str | None:
    """`net{index}` -> `net3`; None (the field is not sent) when the index is not given."""
    names = PLACEHOLDER.findall(template)
    if any(n not in args for n in names):
        return None
    return PLACEHOLDER.sub(lambda m: str(int(args[m.group(1)])), template)


def _needs(pve_field: str, given: list[str], missing: list[str]) -> Refused:
    """The refusal of a field given only in part: "net0: vlan needs bridge"."""
    verb = "needs" if len(given) == 1 else "need"
    return Refused(f"{pve_field}: {', '.join(given)} {verb} {', '.join(missing)}")


def _placeholders(decl: str | list[str]) -> list[str]:
    """The parameters a query/body entry sends: a plain parameter name, or a template's placeholders."""
    if isinstance(decl, str):
        return [decl]
    return list(dict.fromkeys(n for part in decl for n in PLACEHOLDER.findall(part)))


def field_value(
    pve_field: str, decl: str | list[str], args: dict[str, Any], defaulted: frozenset[str] = frozenset()
) -> tuple[str, Any] | None:
    """(field name, value) of one query/body entry, or None when none of its parameters is given
    (`defaulted`: parameters holding only their declared default, which alone give nothing).

    An entry given only in part is refused (Refused: nothing has been sent), never sent shorter
    or left out: a value without the `{index}` its field name needs ("ipconfig{index}: ip_cidr
    needs index"), a template's optional part without its base ("net0: vlan needs bridge")."""
    index = [n for n in PLACEHOLDER.findall(pve_field) if n not in args]
    if index:
        given = [n for n in _placeholders(decl) if n in args and n not in defaulted]
        if not given:
            return None
        base = [] if isinstance(decl, str) else PLACEHOLDER.findall(decl[0])
        raise _needs(pve_field, given, index + [n for n in base if n not in args])
    value = args.get(decl) if isinstance(decl, str) else template_value(pve_field, decl, args, defaulted)
    if value is None:
        return None
    return field_name(pve_field, args) or pve_field, value


def template_value(
    pve_field: str, parts: list[str], args: dict[str, Any], defaulted: frozenset[str] = frozenset()
) -> str | None:
    """A property string from a base part and optional parts (see docs/connectors.md).

    The base is sent when all its placeholders have values, and omitted (with the whole field)
    when none of the template's has; a part with only some of its values given, or an optional
    part given without its base, is refused, never a silently shorter or missing string. A value
    that is only its parameter's declared default (`defaulted`: firewall true) gives no part alone.
    """
    out: list[str] = []
    for i, part in enumerate(parts):
        names = PLACEHOLDER.findall(part)
        given = [n for n in names if n in args]
        if not given and (i > 0 or names):
            if i == 0:
                later = [n for n in _placeholders(parts[1:]) if n in args and n not in defaulted and n not in names]
                if later:  # "net0: vlan needs bridge": the optional part never goes out alone, nor is dropped
                    raise _needs(pve_field, later, names)
                return None
            continue
        if len(given) != len(names):
            missing = ", ".join(n for n in names if n not in args)
            raise Refused(f"{pve_field}: {', '.join(given)} needs {missing} as well")

        def sub(m: re.Match[str]) -> str:
            v = args[m.group(1)]
            text = str(int(v)) if isinstance(v, bool) else str(v)
            if PROPERTY_SEPARATORS.search(text):
                raise Refused(f"{m.group(1)} may not contain ',', '=' or spaces")
            return text

        out.append(PLACEHOLDER.sub(sub, part))
    return "".join(out)


def _defaulted(tool: Tool, args: dict[str, Any]) -> frozenset[str]:
    """The arguments that hold only their parameter's declared default (Tool.validate fills them in)."""
    props = tool.parameters.get("properties") or {}
    return frozenset(k for k, v in args.items() if "default" in props.get(k, {}) and v == props[k]["default"])


def check_fields(tool: Tool, args: dict[str, Any]) -> None:
    """Refuse (before anything is located or sent) a call whose arguments fill a query/body entry only
    in part, or give a field name's `{index}` that no entry given with it uses ("ipconfig{index}:
    index needs ip_cidr"): each argument a tool takes for the request is sent, or the call refused."""
    defaulted = _defaulted(tool, args)
    numbered: dict[str, tuple[str, str | list[str]]] = {}  # an index parameter -> the first entry it numbers
    filled: set[str] = set()
    for kind in ("query", "body"):
        for pve_field, decl in (tool.spec.get(kind) or {}).items():
            for n in PLACEHOLDER.findall(pve_field):
                numbered.setdefault(n, (pve_field, decl))
            if field_value(pve_field, decl, args, defaulted) is not None:
                filled.update(PLACEHOLDER.findall(pve_field))
    for param, (pve_field, decl) in numbered.items():
        if param in args and param not in defaulted and param not in filled and param not in tool.placeholders():
            raise _needs(pve_field, [param], [decl] if isinstance(decl, str) else PLACEHOLDER.findall(decl[0]))


def dry_run_text(tool: Tool, values: dict[str, Any]) -> str:
    """The tool's `dry_run` sentence with the call's values in its {placeholders}; an optional parameter
    the call did not give reads "(not given)", never a literal "{pool}" shown to the model or a person."""
    params = (tool.parameters.get("properties") or {}).keys()

    def fill(m: re.Match[str]) -> str:
        name = m.group(1)
        if name in values:
            return str(values[name])
        return "(not given)" if name in params else m.group(0)

    return PLACEHOLDER.sub(fill, tool.dry_run or "")


def upid_node(upid: str) -> str:
    """The node a UPID names; ToolError unless it is a whole UPID as Proxmox writes them."""
    m = UPID_RE.fullmatch(upid)
    if m is None:
        raise ToolError("not a Proxmox task id (UPID)")
    return m["node"]


class PveApiRuntime:
    def __init__(self, clients: dict[str, PveApiClient], resolver: GuestLocator) -> None:
        self.clients = clients
        self.resolver = resolver

    def client(self, cluster: str) -> PveApiClient:
        client = self.clients.get(cluster)
        if client is None:
            raise ToolError(f"unknown cluster {cluster}")
        return client

    async def locate(self, tool: Tool, args: dict[str, Any], cluster: str) -> dict[str, Any]:
        """Path values: the arguments plus {node} and {type} found from the vmid or UPID."""
        values = dict(args)
        param = tool.spec.get("locate")
        if param is None or param not in args:
            return values
        if param == "upid":
            values["node"] = upid_node(str(args[param]))
            return values
        vmid = int(args[param])
        try:
            row = await self.resolver.guest(cluster, vmid)
        except ToolError:
            raise
        except Exception as exc:  # the lookup itself failed: say so, never guess a node
            raise ToolError(f"cannot locate guest {vmid} in cluster {cluster} ({type(exc).__name__})") from exc
        if row is None:
            raise ToolError(f"guest {vmid} not found in cluster {cluster} (or the gateway's token cannot see it)")
        kind = str(row.get("type"))
        allowed = tool.spec.get("types") or ["qemu", "lxc"]
        if kind not in allowed:
            what = "a container (lxc)" if kind == "lxc" else "a VM (qemu)"
            raise ToolError(f"guest {vmid} is {what}; {tool.name} works on {'/'.join(allowed)} guests only")
        if args.get("node") not in (None, row.get("node")):
            raise ToolError(f"guest {vmid} is on node {row.get('node')}, not {args['node']}")
        values["node"] = row.get("node")
        values["type"] = kind
        return values

    def request_parts(
        self, tool: Tool, args: dict[str, Any], values: dict[str, Any]
    ) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """(path, query, body) with only the declared fields: the allow-list. The arguments were checked
        (check_fields) by call(), which alone builds them: a field given in part is refused here all the same."""
        spec = tool.spec
        defaulted = _defaulted(tool, args)
        only = spec.get("type_only") or {}
        query: dict[str, Any] = {}
        body: dict[str, Any] = {}
        skipped: dict[str, str] = {}
        sent: set[str] = set()
        for target, mapping in ((query, spec.get("query") or {}), (body, spec.get("body") or {})):
            for pve_field, decl in mapping.items():
                field = field_value(pve_field, decl, args, defaulted)
                if field is None:
                    continue
                key, value = field
                param = decl if isinstance(decl, str) else pve_field
                kind = only.get(pve_field)
                if kind is not None and values.get("type") != kind:
                    skipped[param] = kind
                    continue
                target[key] = _wire(value)
                sent.add(param)
        for param, kind in skipped.items():
            if param not in sent:  # e.g. vmstate for a container: refuse rather than drop silently
                raise ToolError(f"{param} applies to {kind} guests only")
        for pve_field in spec.get("encode") or {}:  # only "uri" exists
            for sent_fields in (query, body):
                if pve_field in sent_fields:
                    sent_fields[pve_field] = quote(str(sent_fields[pve_field]), safe="")
        fixed = dict(spec.get("fixed") or {})
        (query if spec["method"] == "GET" else body).update(fixed)
        return render_path(spec["path"], values), query, body

    def check(self, tool: Tool, arguments: dict[str, Any]) -> None:
        check_fields(tool, arguments)

    async def call(self, tool: Tool, arguments: dict[str, Any], ctx: CallContext) -> ToolOutput:
        client = self.client(ctx.cluster)
        spec = tool.spec
        check_fields(tool, arguments)  # an entry given only in part: refused before any request
        if spec.get("fan_out") == "nodes" and "node" not in arguments:
            return await self._fan_out(tool, arguments, ctx, client)
        values = await self.locate(tool, arguments, ctx.cluster)
        path, query, body = self.request_parts(tool, arguments, values)
        if ctx.dry_run and tool.effect != "read":
            return ToolOutput(data=self._dry_run(tool, values, path, query, body))
        envelope = tuple(spec.get("envelope") or ())
        if tool.effect != "read":
            freeze_for_test("stop-before-send")  # tests only: the process freezes after its decision
            if ctx.before_send is not None:  # still this replica's call to make, or it stays unsent
                await ctx.before_send()
        data = await client.request(spec["method"], path, params=query or None, data=body or None, envelope=envelope)
        extra: dict[str, Any] = {}
        if envelope and isinstance(data, dict):
            extra = {k: data.get(k) for k in envelope}
            data = data.get("data")
        if tool.effect != "read":
            if test_fault("kill-after-dispatch-response"):  # tests only: die before the dispatch record
                os.kill(os.getpid(), signal.SIGKILL)
            self.resolver.invalidate(ctx.cluster)  # a mutation may move or change the guest
        if spec.get("fan_out") and isinstance(data, list):  # same row shape as the all-nodes answer
            data = [{**r, "node": r.get("node", values["node"])} if isinstance(r, dict) else r for r in data]
        warnings: list[str] = []
        if spec.get("per_row") and isinstance(data, list):
            data = await self._per_row(client, spec["per_row"], data, warnings)
        task_id = None
        if spec.get("task") and isinstance(data, str) and data.startswith("UPID"):
            if UPID_RE.fullmatch(data) is None:  # accepted, and what it started cannot be followed
                raise AnswerLost(f"Proxmox answered with a malformed task id ({client.clean(data, 120)})")
            task_id = data
            if spec["task"] == "wait":
                if ctx.on_dispatch is not None:  # Proxmox accepted it: durable before we wait on the task
                    await ctx.on_dispatch({"task_id": data, "node": upid_node(data)})
                data = await self.wait_task(client, data, float(spec.get("task_timeout", 60)), warnings)
            else:
                data = {"upid": data, "status": "running"}
        elif spec.get("task") and not (data is None and values.get("type") in (spec.get("no_task_for") or ())):
            # Proxmox's definite answer that it started nothing to follow (vzdump's "OK" for a guest
            # no longer on the node): a failure, never a success. Only an answer the connector
            # declares (`no_task_for`: null for these guest types) is the call's own result
            raise ToolError(_no_task(data, values, client.clean))
        running = task_id is not None and isinstance(data, dict) and data.get("status") == "running"
        data = self.finish(tool, data, arguments)
        if extra:
            data = {**(data if isinstance(data, dict) else {"items": data}), **extra}
        return ToolOutput(data=data, task_id=task_id, warnings=warnings, task_running=running)

    async def _per_row(
        self, client: PveApiClient, spec: dict[str, Any], rows: list[Any], warnings: list[str]
    ) -> list[Any]:
        """One more read per matching row (e.g. each online node's status); a failure is the row's, not the call's."""
        key, when = spec["as"], spec.get("when") or {}
        picked = [r for r in rows if isinstance(r, dict) and all(r.get(k) == v for k, v in when.items())]

        async def one(row: dict[str, Any]) -> Any:
            return await client.request("GET", render_path(spec["path"], row))

        results = await asyncio.gather(*(one(r) for r in picked), return_exceptions=True)
        answers = {id(r): res for r, res in zip(picked, results, strict=True)}
        out: list[Any] = []
        for r in rows:
            if not isinstance(r, dict):
                out.append(r)
            elif id(r) not in answers:
                skipped = ", ".join(f"{k} is not {v}" for k, v in when.items())
                out.append({**r, key: None, f"{key}_error": f"not read: {skipped}"})
            elif isinstance(res := answers[id(r)], BaseException):
                why = str(res) if isinstance(res, ToolError) else type(res).__name__
                warnings.append(f"{spec['as']} of {r.get('node') or r.get('id') or 'a row'}: {why}")
                out.append({**r, key: None, f"{key}_error": why})
            else:
                out.append({**r, key: res})
        return out

    def finish(self, tool: Tool, data: Any, args: dict[str, Any]) -> Any:
        reducer = tool.output.get("reducer")
        if reducer:
            try:
                data = TRANSFORMS[reducer](data, args)
            except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
                # a read's answer of a shape the reducer does not take (a string or number where an object
                # or list belongs): a tool error that says so, never an internal error and a traceback.
                # (No mutation has a reducer; one that ran is not to be recorded failed.)
                if tool.effect != "read":
                    raise
                # logged whole: a reducer's own bug would read the same to the client
                log.warning("%s: reducer %s failed on the answer", tool.name, reducer, exc_info=True)
                got = type(data).__name__
                raise ToolError(
                    f"{tool.name}: Proxmox answered with an unexpected shape ({got}: {type(exc).__name__})"
                ) from exc
        if tool.output.get("wrap"):
            data = {tool.output["wrap"]: data}
        return data

    def _dry_run(
        self, tool: Tool, values: dict[str, Any], path: str, query: dict[str, Any], body: dict[str, Any]
    ) -> dict[str, Any]:
        impact = dry_run_text(tool, values)
        return {
            "dry_run": True,
            "tool": tool.name,
            "would_send": {"method": tool.spec["method"], "path": path, "query": query, "body": body},
            "expected_impact": impact,
            "sent": False,
        }

    async def wait_task(self, client: PveApiClient, upid: str, limit_s: float, warnings: list[str]) -> dict[str, Any]:
        """Poll the task until it stops or `limit_s` passes (then: still running, and a warning).

        Proxmox accepted the request: from here on any failure to read the task's status is
        AnswerLost (the call is reconciled from Proxmox), only a task that ended badly is
        TaskFailed. The whole wait is bounded, a poll under way at `limit_s` gets one timeout more."""
        node = upid_node(upid)
        bound = limit_s + client.cluster.timeout
        try:
            async with asyncio.timeout(bound):
                return await self._poll_task(client, upid, node, limit_s, warnings)
        except TaskFailed:
            raise
        except TimeoutError as exc:
            raise AnswerLost(f"the status of task {upid} was not read within {bound:g}s") from exc
        except Exception as exc:
            why = str(exc) if isinstance(exc, ToolError) else f"an unreadable answer: {type(exc).__name__}"
            raise AnswerLost(f"the status of task {upid} could not be read ({why})") from exc

    async def _poll_task(
        self, client: PveApiClient, upid: str, node: str, limit_s: float, warnings: list[str]
    ) -> dict[str, Any]:
        path = f"/nodes/{quote(node, safe='')}/tasks/{quote(upid, safe='')}/status"
        deadline = time.monotonic() + limit_s
        delay = 0.05
        while True:
            st = await client.request("GET", path)
            if not isinstance(st, dict) or not isinstance(st.get("status"), str):
                raise ToolError(f"Proxmox answered the task status with {type(st).__name__}, not a status object")
            if st["status"] == "stopped":
                exit_status = str(st.get("exitstatus", ""))
                if exit_status != "OK" and not exit_status.startswith("WARNINGS"):
                    raise TaskFailed(f"task {upid} failed: {client.clean(exit_status, 300)}")
                return {"upid": upid, "node": node, "status": "stopped", "exitstatus": exit_status}
            if time.monotonic() + delay > deadline:
                warnings.append(f"task still running after {limit_s:.0f}s; poll get_task_status with the upid")
                return {"upid": upid, "node": node, "status": "running", "exitstatus": None}
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _fan_out(self, tool: Tool, args: dict[str, Any], ctx: CallContext, client: PveApiClient) -> ToolOutput:
        """Per-node list endpoints over every node; offline or failing nodes become warnings."""
        warnings: list[str] = []
        try:
            nodes = await self.resolver.nodes(ctx.cluster)
        except ToolError:
            raise
        except Exception as exc:
            raise ToolError(f"cannot list the nodes of cluster {ctx.cluster} ({type(exc).__name__})") from exc
        online = sorted(n for n, row in nodes.items() if row.get("status") == "online")
        for n in sorted(set(nodes) - set(online)):
            warnings.append(f"node {n} is {nodes[n].get('status') or 'unknown'}: its entries are missing")

        async def one(node: str) -> list[Any]:
            values = {**args, "node": node}
            path, query, _ = self.request_parts(tool, args, values)
            rows = await client.request("GET", path, params=query or None)
            if not isinstance(rows, list | None):
                raise ToolError(f"Proxmox answered with {type(rows).__name__}, not a list")
            return [{**r, "node": r.get("node", node)} if isinstance(r, dict) else r for r in rows or []]

        results = await asyncio.gather(*(one(n) for n in online), return_exceptions=True)
        items: list[Any] = []
        for node, res in zip(online, results, strict=True):
            if isinstance(res, BaseException):
                warnings.append(f"node {node}: {res if isinstance(res, ToolError) else type(res).__name__}")
            else:
                items.extend(res)
        data = self.finish(tool, items, args)
        body = dict(data) if isinstance(data, dict) else {"items": data}  # a reducer may add to the rows
        return ToolOutput(data={**body, "collected_at": now_iso()}, warnings=warnings)

    async def close(self) -> None:
        for c in self.clients.values():
            await c.close()
