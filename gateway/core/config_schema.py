"""The configuration file's schema: validation with readable problems, and the settings reference.

`schemas/config.schema.json` is the single description of every setting: `config.load`
refuses a file that does not satisfy it (an unknown key, a wrong type, a value out of
range), and `docs/configuration.md` is generated from it (`pvegate config reference`).
Each problem names the setting's path, e.g. `clusters.prod.timeout` (a cluster is named
by its `name`), and for an unknown key the nearest known one.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import re
from collections.abc import Iterator, Sequence
from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from gateway.core.redaction import strip_userinfo
from gateway.core.text import cut

SCHEMA_NAME = "config.schema.json"

_TYPE_WORDS = {
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "nothing",
}


@cache
def schema() -> dict[str, Any]:
    text = resources.files("gateway.schemas").joinpath(SCHEMA_NAME).read_text()
    doc: dict[str, Any] = json.loads(text)
    return doc


@cache
def _validator() -> Draft202012Validator:
    Draft202012Validator.check_schema(schema())
    return Draft202012Validator(schema())


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    """A property's schema with a local `$ref` merged in (the referencing keywords win)."""
    ref = node.get("$ref")
    if not isinstance(ref, str):
        return node
    target: Any = schema()
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    merged = {**_resolve(target), **node}
    merged.pop("$ref")
    return merged


def settings() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every setting as (path, schema), in schema order; list items appear as `name[]`."""

    def walk(prefix: str, node: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        node = _resolve(node)
        for key, sub in node.get("properties", {}).items():
            path = f"{prefix}.{key}" if prefix else key
            sub = _resolve(sub)
            yield path, sub
            yield from walk(path, sub)
            items = sub.get("items")
            if isinstance(items, dict) and "properties" in _resolve(items):
                yield from walk(f"{path}[]", items)
            extra = sub.get("additionalProperties")
            if isinstance(extra, dict) and "properties" in _resolve(extra):
                yield from walk(f"{path}.<name>", extra)

    yield from walk("", schema())


# -- problems -------------------------------------------------------------------------------


def redact(text: str) -> str:
    """`text` with the user name and password of every URL in it replaced by `***`: never shown."""
    return strip_userinfo(text)


def _show(value: Any) -> str:
    """A value as the YAML author wrote it, short (a URL without its password)."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"
    if isinstance(value, str) and "://" in value:
        # everything from the scheme to the last '@' (no quote or space stops it here); redact() on the result
        # covers a second URL in the value
        value = re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://).*@", r"\1***@", value, flags=re.S)
        # a query string may be a pre-signed URL's signature or a token: its values are not shown either
        value = re.sub(r"([?&][^=&#\s]*=)[^&#\s]*", r"\1***", value)
    text = redact(repr(value))
    return cut(text, 60)


_NOT_SHOWN = "(not shown: a secret is read from a file or an environment variable, never written here)"


def _kind_of(value: Any) -> str:
    """What a value is, without what it says (a secret given inline)."""
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if value is None or isinstance(value, dict | list):
        return _show(value)  # null, a mapping, a list: nothing of a secret in the words
    # !!binary bytes, a set, a date: their repr would be what was written
    return "a value of another type"


def _display_path(root: Any, path: Sequence[str | int]) -> str:
    """`clusters.prod.ssh.user`: a list item with a unique, plain `name` is shown by it, else `[i]`."""
    out = ""
    node = root
    for part in path:
        if isinstance(part, int):
            names = [i.get("name") if isinstance(i, dict) else None for i in node] if isinstance(node, list) else []
            name = names[part] if part < len(names) else None
            plain = isinstance(name, str) and name.replace("-", "").replace("_", "").isalnum()
            out += f".{name}" if plain and names.count(name) == 1 else f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = None
    return out


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _suggest(key: str, here: Sequence[str], at: str) -> str:
    """'; did you mean X?' for an unknown key: the same name in another section (a misplaced
    setting), else a close name at this level (a typo), else a close name anywhere."""
    leaves: dict[str, str] = {}
    for p, _ in settings():
        leaves.setdefault(p.rsplit(".", 1)[-1].removesuffix("[]"), p)  # several: the first in the schema
    if key in leaves:
        return f"; did you mean {_shown(leaves[key], at)}?"
    close = difflib.get_close_matches(key, here, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {_join(at, close[0])}?"
    close = difflib.get_close_matches(key, list(leaves), n=1, cutoff=0.75)
    if close:
        return f"; did you mean {_shown(leaves[close[0]], at)}?"
    return f" (settings here: {', '.join(here)})" if here else ""


def _shown(template: str, at: str) -> str:
    """A settings() path as the user would write it: inside a cluster, with that cluster's name."""
    cluster = re.match(r"clusters(\.[^.\[]+|\[\d+\])", at)
    if template.startswith("clusters[]") and cluster:
        return cluster.group(0) + template.removeprefix("clusters[]")
    return template.replace("[]", ".<name>")


def _messages(error: ValidationError, root: Any) -> Iterator[tuple[str | None, str, str]]:
    """(key, path, message) for one jsonschema error; key: the setting below the error's path, if any."""
    path = _display_path(root, list(error.absolute_path))
    sub: dict[str, Any] = error.schema if isinstance(error.schema, dict) else {}
    hint = sub.get("x-hint")
    value = error.instance
    kind = error.validator
    if kind in ("type", "pattern") and (sub.get("x-secret") or sub.get("$ref") == "#/$defs/secret"):
        # a secret written where its file or variable belongs (or where a variable's name does): the
        # value is the secret, never shown
        yield None, path, f"{hint or 'expected {file: PATH} or {env: NAME}'}, got {_kind_of(value)} {_NOT_SHOWN}"
    elif kind in ("type", "pattern") and sub.get("x-no-echo"):
        # a value that may carry a credential (an HTTP header's, or a header line pasted where a mapping
        # belongs): said what was expected and what kind it is, never what it says
        expected = hint or (f"expected {_type_words(error.validator_value)}" if kind == "type" else "expected a string")
        yield None, path, f"{expected}, got {_kind_of(value)} (the value is not shown)"
    elif sub.get("x-header-name"):
        yield None, *_header_name(path, str(value))
    elif kind == "additionalProperties" and isinstance(value, dict) and sub.get("x-secret"):
        # a key other than file/env in a secret's mapping is likely the secret itself (`token: {USER@REALM!ID=...}`):
        # said once, the key never shown (nor as a key YAML read as a number: problems() skips it)
        yield None, path, f"{hint or 'expected {file: PATH} or {env: NAME}'}, got another key {_NOT_SHOWN}"
    elif kind == "additionalProperties" and isinstance(value, dict):
        known = list(sub.get("properties", {}))
        refused: dict[str, str] = sub.get("x-refused", {})
        for key in value:
            if key in refused:
                yield key, _join(path, str(key)), refused[key]
            elif key not in known:
                yield key, _join(path, str(key)), f"unknown setting{_suggest(str(key), known, path)}"
    elif kind == "required" and isinstance(value, dict):
        for key in error.validator_value:
            if key not in value:
                yield key, _join(path, key), "required setting is missing"
    elif hint and kind in ("type", "pattern"):
        yield None, path, f"{hint}, got {_show(value)}"
    elif kind in ("minProperties", "maxProperties"):
        options = " or ".join(f"{k}:" for k in sub.get("properties", {}))
        yield None, path, f"expected exactly one of {options}"
    elif kind == "type":
        yield None, path, f"expected {_type_words(error.validator_value)}, got {_show(value)}"
    elif kind == "enum":
        choices = [str(o) for o in error.validator_value]
        close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
        tip = f"; did you mean {close[0]}?" if close else ""
        yield None, path, f"expected one of {', '.join(choices)}, got {_show(value)}{tip}"
    elif kind == "minimum":
        yield None, path, f"must be at least {error.validator_value}, got {_show(value)}"
    elif kind == "exclusiveMinimum":
        yield None, path, f"must be greater than {error.validator_value}, got {_show(value)}"
    elif kind == "maximum":
        yield None, path, f"must be at most {error.validator_value}, got {_show(value)}"
    elif kind == "minLength":
        yield None, path, "must not be empty"
    elif kind == "minItems":
        n = error.validator_value
        yield None, path, f"must list at least {n} entr{'y' if n == 1 else 'ies'}"
    elif kind == "uniqueItems":
        yield None, path, "lists the same value twice"
    elif kind == "pattern":
        yield None, path, f"{_show(value)} does not match the expected form {error.validator_value}"
    else:
        yield None, path, error.message


def _type_words(expected: Any) -> str:
    """A `type` keyword's value in words: `a mapping`, `a string or a list`."""
    types = expected if isinstance(expected, list) else [expected]
    return " or ".join(str(_TYPE_WORDS.get(t, t)) for t in types if t != "null" or len(types) == 1)


_CREDENTIAL_HEADERS = ("authorization", "proxy-authorization")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _header_name(at: str, name: str) -> tuple[str, str]:
    """(path, message) for a refused header name (the only mapping whose key names the schema checks):
    a credential header, shown as it is a known name; anything else not shown, as it may be a whole
    header line pasted in (`Authorization: Bearer ...`)."""
    if _HEADER_NAME.fullmatch(name) and name.lower() in _CREDENTIAL_HEADERS:
        return (
            _join(at, name),
            "credentials are not given as a header (its value would sit in this file): give them in "
            "this service's `credentials` (bearer, oauth2 or client_tls), from a file or an environment variable",
        )
    return at, (
        "a header name is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~, no spaces or ':'); "
        "not shown: it may hold a credential"
    )


def _position(root: Any, path: Sequence[str | int]) -> tuple[int, ...]:
    """Where a problem sits in the file, to list problems in file order."""
    out: list[int] = []
    node = root
    for part in path:
        if isinstance(node, dict):
            keys = list(node)
            out.append(keys.index(part) if part in keys else len(keys))
        elif isinstance(node, list) and isinstance(part, int):
            out.append(part)
        else:
            break
        node = node.get(part) if isinstance(node, dict) else node[part]
    return tuple(out)


def _non_finite(node: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], float]]:
    """Every .nan, .inf and -.inf in the file, passed-through sections included, with its path."""
    if isinstance(node, float) and not math.isfinite(node):
        yield path, node
    elif isinstance(node, dict):
        for key, sub in node.items():
            yield from _non_finite(sub, (*path, key))
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            yield from _non_finite(sub, (*path, i))


def _non_string_keys(node: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """Every mapping key YAML read as something else than a string (`on:` as true, `1:` as a number),
    with the path of its mapping: a setting, a name (a principal, an SSH node, an OPA service) is a string."""
    if isinstance(node, dict):
        for key, sub in node.items():
            if isinstance(key, str):
                yield from _non_string_keys(sub, (*path, key))
            else:
                yield path, key
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            yield from _non_string_keys(sub, (*path, i))


def _key_problem(raw: Any, path: tuple[str | int, ...], key: Any) -> str:
    """A key that is not a string: said as YAML wrote it, with how to keep the name."""
    at = _display_path(raw, list(path)) or "the top level"
    shown = _show(key) if isinstance(key, bool) else "null" if key is None else str(key)
    if isinstance(key, bool):
        why, example = "YAML reads an unquoted yes, no, on, off, true or false as a boolean", "'on'"
    else:
        kind = "a number" if isinstance(key, int | float) else "null" if key is None else f"a {type(key).__name__}"
        why, example = f"YAML reads it as {kind}", f"'{shown}'"
    return f"{at}: the key {shown} is not a string ({why}); quote it as written, e.g. {example}:"


def problems(raw: Any) -> list[str]:
    """Everything wrong with a parsed configuration file, one readable line each; [] if nothing."""
    found: list[tuple[tuple[int, ...], str]] = []
    # JSON Schema takes .nan for a number and never finds it out of range (every comparison with it is
    # false), and .inf is in range wherever there is no maximum: both would be used as given
    non_finite = dict(_non_finite(raw))
    mistyped: set[tuple[str | int, ...]] = set()
    secret_maps: set[tuple[str | int, ...]] = set()  # secrets' mappings with a key of their own: never shown
    for error in _validator().iter_errors(raw):
        at = tuple(error.absolute_path)
        if error.validator == "additionalProperties" and (error.schema if isinstance(error.schema, dict) else {}).get(
            "x-secret"
        ):
            secret_maps.add(at)
        if at in non_finite and error.validator not in ("type", "enum"):
            continue  # a range problem of a non-finite number: said below, once
        if at in non_finite:
            mistyped.add(at)  # `expected a string, got .nan` says more than "finite"
        for key, path, message in _messages(error, raw):
            if key is not None and not isinstance(key, str):
                continue  # a key YAML read as a boolean or a number: said below, once
            where = [*at, *([key] if key is not None else [])]
            found.append((_position(raw, where), redact(f"{path}: {message}")))
    for at, key in _non_string_keys(raw):
        if at in secret_maps:
            continue
        found.append((_position(raw, [*at, key]), redact(_key_problem(raw, at, key))))
    for at, value in non_finite.items():
        if at not in mistyped:
            line = f"{_display_path(raw, list(at))}: must be a finite number, got {_show(value)}"
            found.append((_position(raw, list(at)), redact(line)))
    if not found:
        return [redact(line) for line in _consistency(raw)]
    unique = dict.fromkeys(line for _, line in sorted(found, key=lambda f: f[0]))
    return list(unique)


def is_loopback(host: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1 (a name other than localhost is not resolved: not loopback)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _trusted_proxy(i: int, entry: str) -> list[str]:
    """uvicorn trusts every peer for '*' and keeps an entry it cannot parse as a literal that never matches."""
    if entry == "*":
        return [
            f"trusted_proxies[{i}]: '*' would believe the X-Forwarded-For of every client, so any client "
            "could choose the address the audit and the policy see; list the proxies' addresses or networks"
        ]
    try:
        if "/" in entry:
            ipaddress.ip_network(entry)  # strict: host bits set is a typo of an address or of a network
        else:
            ipaddress.ip_address(entry)
    except ValueError:
        return [f"trusted_proxies[{i}]: {entry!r} is not an IP address or CIDR network (e.g. 10.0.0.5, 10.0.0.0/24)"]
    return []


# a DNS name or an IPv4 address (letters, digits, '-', '.', '_'), or an IPv6 address in brackets,
# then an optional port: the forms a Host header or an origin's host takes
_HOST = r"(?:[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?\.?|\[[0-9A-Fa-f:.]+\])"
_HOST_PORT = re.compile(rf"{_HOST}(?::(?P<port>[0-9]{{1,5}}))?")
_ORIGIN = re.compile(rf"(?P<scheme>[A-Za-z]+)://(?P<host>{_HOST})(?::(?P<port>[0-9]{{1,5}}))?/?")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _bad_port(port: str | None) -> bool:
    return port is not None and not 1 <= int(port) <= 65535


def _allowed_host(i: int, entry: str) -> list[str]:
    """An entry is compared with the whole Host header (lowercased): anything but host[:port] never matches."""
    m = _HOST_PORT.fullmatch(entry)
    if m is None or _bad_port(m.group("port")):
        return [
            f"allowed_hosts[{i}]: {_show(entry)} never matches a Host header: give host or host:port "
            "(e.g. gw.example.net, gw.example.net:8443, [::1]:8443), with no scheme, path or '*'"
        ]
    if entry.startswith("[") and not _is_ipv6(entry[1:].split("]", 1)[0]):
        return [f"allowed_hosts[{i}]: {_show(entry)} holds no IPv6 address between its brackets"]
    return []


def _allowed_origin(i: int, entry: str) -> list[str]:
    """An entry is compared with the whole Origin header (lowercased, a trailing '/' aside): a browser sends
    scheme://host[:port], without a path and without the scheme's default port."""
    if entry.lower() == "null":
        return [f"allowed_origins[{i}]: 'null' is the origin of every sandboxed or file:// page; it is not allowed"]
    m = _ORIGIN.fullmatch(entry)
    scheme = m.group("scheme").lower() if m else ""
    if m is None or scheme not in _DEFAULT_PORTS or _bad_port(m.group("port")):
        return [
            f"allowed_origins[{i}]: {_show(entry)} never matches an Origin header: give scheme://host[:port] "
            "(e.g. https://app.example.net), http or https, with no path or '*'"
        ]
    port = m.group("port")
    if port is not None and int(port) == _DEFAULT_PORTS[scheme]:
        return [
            f"allowed_origins[{i}]: {_show(entry)} never matches: browsers send no default port; "
            f"drop ':{port}' ({entry[: m.start('port') - 1]})"
        ]
    return []


def _is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


def _url_credentials(raw: dict[str, Any]) -> list[str]:
    """A user name or password inside a URL setting: it would be shown wherever the URL is (logs,
    /admin/health, errors); credentials belong in the secret settings made for them."""
    urls: list[tuple[str, Any]] = [
        ("public_url", raw.get("public_url")),
        ("auth.issuer", (raw.get("auth") or {}).get("issuer")),
        ("auth.jwks_url", (raw.get("auth") or {}).get("jwks_url")),
        ("opa.url", (raw.get("opa") or {}).get("url")),
        ("console.issuer", (raw.get("console") or {}).get("issuer")),
    ]
    urls += [
        (f"{_display_path(raw, ['clusters', i])}.api_url", c.get("api_url")) for i, c in enumerate(raw["clusters"])
    ]
    return [
        f"{where}: a user name or password in the URL would be shown wherever the URL is; "
        "give credentials in the settings made for them (a token, a secret reference)"
        for where, url in urls
        if isinstance(url, str) and "@" in _netloc(url)
    ]


def _plain_http_off_host(url: str) -> bool:
    """An http:// URL whose host is not a loopback address (a name other than localhost counts)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return False  # the schema's pattern and the loader say what is wrong with it
    if parts.scheme.lower() != "http":
        return False
    return not is_loopback(host)


# the hosts a JWKS may be fetched from over plain http
JWKS_PLAIN_HTTP_HOSTS = ("127.0.0.1", "localhost", "::1")


def jwks_url_in_clear(url: str) -> bool:
    """Whether the JWKS at `url` would be fetched in the clear: not https, and not from a loopback
    host. The rule of both config loading and the fetcher (gateway/auth/jwks.py). ValueError for a
    URL urlsplit cannot read."""
    parts = urlsplit(url)
    return parts.scheme != "https" and parts.hostname not in JWKS_PLAIN_HTTP_HOSTS


def _jwks_url(url: str) -> list[str]:
    """What the JWKS fetcher refuses at start: a URL that is not https, unless its host is loopback."""
    try:
        in_clear = jwks_url_in_clear(url)
    except ValueError:
        return [f"auth.jwks_url: {_show(url)} is not a URL (an unbalanced '[' or ']' in the host part)"]
    if in_clear:
        return [
            "auth.jwks_url: must be https (plain http only on loopback: 127.0.0.1, localhost or ::1); "
            "the keys that verify every token must not cross the network in the clear"
        ]
    # fetched as given (a query is the server's own): a host and a usable port, else every token is refused
    return _base_url("auth.jwks_url", url, query_ok=True)[1]


def _base_url(at: str, url: str, *, query_ok: bool = False) -> tuple[str | None, list[str]]:
    """(path, problems) of a base URL the gateway appends paths to: it needs a host, a port from 1 to
    65535 if any, and no whitespace, query or fragment (`query_ok`: a URL used as given may have them).
    Path None: nothing more to check (a user name or password in it is _url_credentials' to say)."""
    if not url.isprintable() or any(c.isspace() for c in url):
        return None, [f"{at}: {_show(url)} holds whitespace or a control character; write the URL without it"]
    try:
        parts = urlsplit(url)
    except ValueError:
        return None, [
            f"{at}: {_show(url)} is not a URL: its host in '[' ']' is not an IPv6 address, or one bracket is missing"
        ]
    if "@" in parts.netloc:
        return None, []
    if ("?" in url or "#" in url) and not query_ok:
        return None, [f"{at}: has a query or a fragment ('?' or '#'): paths are appended to it; remove them"]
    if not parts.hostname:
        return None, [f"{at}: names no host (scheme://HOST[:PORT]/...)"]
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        return None, [f"{at}: the port in {_show(parts.netloc)} is not a number from 1 to 65535"]
    if not (_is_ipv6(parts.hostname) or re.fullmatch(r"[\w.-]+", parts.hostname)):
        return None, [f"{at}: {_show(parts.netloc)} is not host or host:port (a DNS name or an IP address)"]
    return parts.path, []


def _api_url(at: str, url: str) -> list[str]:
    """A cluster's api_url: the Proxmox API's base, to which the runtime appends each path (/nodes/...)."""
    path, found = _base_url(at, url)
    if path is not None and path not in ("/api2/json", "/api2/json/"):
        got = f"the path {_show(path)}" if path.strip("/") else f"none (did you mean {url.rstrip('/')}/api2/json?)"
        found.append(
            f"{at}: its path must be /api2/json, the Proxmox API's base "
            f"(e.g. https://pve1.example.net:8006/api2/json); got {got}"
        )
    return found


def _public_url(url: str) -> list[str]:
    """public_url: the gateway's base URL (a path prefix is kept); the MCP endpoint is public_url + /mcp."""
    path, found = _base_url("public_url", url)
    if path is not None and path.rstrip("/").endswith("/mcp"):
        found.append(
            "public_url: is the gateway's base URL, without /mcp (the MCP endpoint is public_url + /mcp); "
            f"did you mean {url.rstrip('/').removesuffix('/mcp')}?"
        )
    return found


def _listen_host(host: str) -> list[str]:
    """listen.host is handed to getaddrinfo as it is: a host with a port, brackets or a scheme only
    failed when `serve` started (cannot resolve). An IPv6 address is written bare (`::1`)."""
    try:
        ipaddress.ip_address(host)
        return []
    except ValueError:
        pass
    if re.fullmatch(r"[\w.-]+", host):
        return []
    return [
        f"listen.host: {_show(host)} is not an address to bind: give a host name or IP address alone "
        "(an IPv6 one without brackets, e.g. ::1); the port goes in listen.port"
    ]


def _opa_delays(at: str, section: Any) -> list[str]:
    """OPA's own rule for a polling or reporting section, which it applies only once the managed OPA
    starts: both delays or neither, and the min not above the max."""
    if not isinstance(section, dict):
        return []
    low, high = section.get("min_delay_seconds"), section.get("max_delay_seconds")
    if (low is None) != (high is None):
        return [f"{at}: give both min_delay_seconds and max_delay_seconds, or neither (OPA refuses one alone)"]
    if isinstance(low, int) and isinstance(high, int) and low > high:
        return [f"{at}.max_delay_seconds: must be at least min_delay_seconds ({low}), got {high}"]
    return []


def _netloc(url: str) -> str:
    try:
        return urlsplit(url).netloc
    except ValueError:  # not a URL urlsplit can read: the schema's pattern and the loader say so
        return ""


def _splits(url: str) -> bool:
    try:
        urlsplit(url)
    except ValueError:
        return False
    return True


def _consistency(raw: dict[str, Any]) -> list[str]:
    """Settings that are each valid but contradict each other, or one that would be silently ignored."""
    out: list[str] = _url_credentials(raw)
    names = [c["name"] for c in raw["clusters"]]
    for i, name in enumerate(names):
        if names.index(name) != i:
            out.append(f"clusters[{i}].name: cluster {name!r} is configured twice")
    for i, c in enumerate(raw["clusters"]):
        at = _display_path(raw, ["clusters", i])
        if isinstance(c.get("api_url"), str) and _plain_http_off_host(c["api_url"]):
            out.append(
                f"{at}.api_url: plain http:// to another host would send the Proxmox API token in the clear; "
                "use https:// (plain http is for a loopback address only)"
            )
        if isinstance(c.get("api_url"), str):
            out += _api_url(f"{at}.api_url", c["api_url"])
        if c.get("fingerprint") and c.get("ca_file"):
            out.append(f"{at}.ca_file: not used when {at}.fingerprint pins the certificate; give one of them")
        if c.get("fingerprint") and c.get("verify_tls") is False:
            out.append(f"{at}.fingerprint: not used when {at}.verify_tls is false; give one of them")
        if c.get("ca_file") and c.get("verify_tls") is False:
            out.append(f"{at}.ca_file: not used when {at}.verify_tls is false; give one of them")
    if isinstance(raw.get("public_url"), str):
        out += _public_url(raw["public_url"])
    if isinstance(raw["auth"].get("jwks_url"), str):
        out += _jwks_url(raw["auth"]["jwks_url"])
    # issuer identifiers clients append /.well-known/... to (RFC 8414): advertised to every MCP client
    for i, server in enumerate(raw["auth"].get("authorization_servers") or []):
        if isinstance(server, str):
            out += _base_url(f"auth.authorization_servers[{i}]", server)[1]

    opa = raw.get("opa") or {}
    if opa.get("mode") == "external":
        if not opa.get("url"):
            out.append("opa.url: required when opa.mode is external")
        elif isinstance(opa["url"], str):
            # the base of OPA's /v1/data/...: the schema's pattern asks only for the scheme, and `http://` or a
            # port out of range failed only at run time
            out += _base_url("opa.url", opa["url"])[1]
        if not opa.get("token"):
            out.append("opa.token: required when opa.mode is external (the token OPA's API admits)")
        for key in (
            "binary",
            "policies",
            "bundle",
            "verification_key",
            "allow_unsigned",
            "services",
            "bundles",
            "keys",
        ):
            if opa.get(key):
                out.append(f"opa.{key}: only used when opa.mode is managed (the external OPA loads its own policies)")
    else:
        if opa.get("url"):
            out.append("opa.url: only used when opa.mode is external")
        if opa.get("token"):
            out.append("opa.token: only used when opa.mode is external (a managed OPA gets a token per start)")
        if opa.get("bundle") and opa.get("policies"):
            out.append("opa.policies: not used when opa.bundle is given; give one of them")
        if opa.get("verification_key") and not opa.get("bundle"):
            out.append("opa.verification_key: only used with opa.bundle")
        if opa.get("bundles") and (opa.get("bundle") or opa.get("policies")):
            out.append("opa.bundles: OPA follows a bundle service instead of opa.bundle / opa.policies; give one")
        if opa.get("watch_bundle") and not opa.get("bundle"):
            out.append("opa.watch_bundle: only used with opa.bundle")
        unsigned_ok = bool(opa.get("allow_unsigned"))
        if opa.get("bundle") and not opa.get("verification_key") and not unsigned_ok:
            out.append(
                "opa.verification_key: required with opa.bundle (the public key its signature must verify "
                "against; `pvegate bundle keygen`); opa.allow_unsigned: true lets an unsigned bundle load, "
                "for development only"
            )
        for bname, entry in (opa.get("bundles") or {}).items():
            svc = entry.get("service")
            if svc is not None and svc not in (opa.get("services") or {}):
                out.append(f"opa.bundles.{bname}.service: {svc!r} is not in opa.services")
            keyid = (entry.get("signing") or {}).get("keyid")
            if keyid is None and not unsigned_ok:
                out.append(
                    f"opa.bundles.{bname}.signing.keyid: required (the key in opa.keys its signature must "
                    "verify against); opa.allow_unsigned: true lets an unsigned bundle load, for development only"
                )
            elif keyid is not None and keyid not in (opa.get("keys") or {}):
                out.append(f"opa.bundles.{bname}.signing.keyid: {keyid!r} is not in opa.keys")
            if (entry.get("signing") or {}).get("exclude_files") and not unsigned_ok:
                out.append(
                    f"opa.bundles.{bname}.signing.exclude_files: files OPA would load without checking their "
                    "signature; opa.allow_unsigned: true allows that, for development only"
                )
        if unsigned_ok and not (opa.get("bundle") or opa.get("bundles")):
            out.append("opa.allow_unsigned: only used with opa.bundle or opa.bundles")
        for sname, svc in (opa.get("services") or {}).items():
            oauth2 = (svc.get("credentials") or {}).get("oauth2")
            ways = [k for k in ("client_secret", "client_assertion", "client_assertion_path") if k in (oauth2 or {})]
            if oauth2 is not None and len(ways) != 1:
                out.append(
                    f"opa.services.{sname}.credentials.oauth2: give exactly one of client_secret, client_assertion "
                    f"or client_assertion_path (got {', '.join(ways) if ways else 'none'})"
                )
        upload = opa.get("decision_logs_upload") or {}
        if upload.get("service") is not None and upload["service"] not in (opa.get("services") or {}):
            out.append(f"opa.decision_logs_upload.service: {upload['service']!r} is not in opa.services")
        for bname, entry in (opa.get("bundles") or {}).items():
            out += _opa_delays(f"opa.bundles.{bname}.polling", entry.get("polling"))
        out += _opa_delays("opa.decision_logs_upload.reporting", upload.get("reporting"))

    console = raw.get("console") or {}
    if console.get("enabled") is True and isinstance(console.get("issuer"), str) and _splits(console["issuer"]):
        # the base of ISSUER/.well-known/openid-configuration (one urlsplit cannot read: config._console says why);
        # a disabled console's issuer may be a placeholder, as it loaded before this check
        out += _base_url("console.issuer", console["issuer"])[1]

    tls = raw.get("tls") or {}
    host = str((raw.get("listen") or {}).get("host", "127.0.0.1"))
    bad_host = _listen_host(host)
    out += bad_host
    if tls.get("insecure_http"):
        if not bad_host and not is_loopback(host):
            out.append(f"tls.insecure_http: plain HTTP is only allowed on a loopback listen.host, not {host}")
        if tls.get("cert") or tls.get("key"):
            out.append("tls.insecure_http: true, so tls.cert and tls.key are not used; give one or the other")
    elif not (tls.get("cert") and tls.get("key")):
        out.append("tls: tls.cert and tls.key are required (or tls.insecure_http: true on a loopback listen.host)")

    for i, entry in enumerate(raw.get("trusted_proxies") or []):
        out += _trusted_proxy(i, entry)
    for i, entry in enumerate(raw.get("allowed_hosts") or []):
        out += _allowed_host(i, entry)
    for i, entry in enumerate(raw.get("allowed_origins") or []):
        out += _allowed_origin(i, entry)

    auth = raw["auth"]
    if auth.get("jwks_url") and auth.get("jwks_file"):
        out.append("auth.jwks_file: give auth.jwks_url or auth.jwks_file, not both")
    algorithms = auth.get("algorithms", ["HS256"])
    if "HS256" in algorithms and not auth.get("hs256_secret"):
        out.append("auth.algorithms: HS256 is accepted but auth.hs256_secret is not set")
    if auth.get("hs256_secret") and "HS256" not in algorithms:
        # `pvegate token mint` would sign with it tokens that every request then refuses
        out.append(
            "auth.hs256_secret: not used when auth.algorithms does not list HS256 (tokens signed with it "
            "would be refused); add HS256 to auth.algorithms or remove the secret"
        )
    asymmetric = [a for a in algorithms if a != "HS256"]
    if asymmetric and not (auth.get("jwks_url") or auth.get("jwks_file")):
        out.append(f"auth.algorithms: {', '.join(asymmetric)} need auth.jwks_url or auth.jwks_file")
    kind = auth.get("kind") or {}
    if auth.get("client_id_claims") == []:
        # no client id is ever read, so the lists would never apply: an agent client listed to keep its
        # password-grant tokens (which carry a login session) from passing as a human's would not be
        for setting in ("agent_clients", "human_clients"):
            if kind.get(setting):
                out.append(
                    f"auth.kind.{setting}: never applies when auth.client_id_claims is empty (no client id "
                    "is read from a token); name the claims that carry it, e.g. [azp, client_id]"
                )
    if kind.get("values") and not kind.get("claim"):
        out.append("auth.kind.values: only used with auth.kind.claim (the claim whose value they map)")
    if "jwks_cache_seconds" in auth and not auth.get("jwks_url"):
        out.append("auth.jwks_cache_seconds: only used with auth.jwks_url (a jwks_file is read when it changes)")
    return out


# -- the settings reference -----------------------------------------------------------------


def _type_of(node: dict[str, Any]) -> str:
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    raw = node.get("type", [])
    types: list[str] = raw if isinstance(raw, list) else [raw]
    words = {"object": "mapping", "array": "list", "integer": "integer", "number": "number", "string": "string"}
    shown = [words.get(t, t) for t in types if t != "null"]
    text = " or ".join(shown)
    if set(node.get("properties", {})) == {"file", "env"}:
        text = "secret (`file:` or `env:`)"
    elif node.get("type") == "array" and isinstance(node.get("items"), dict):
        item = _resolve(node["items"])
        inner = " \\| ".join(f"`{v}`" for v in item["enum"]) if "enum" in item else _type_of(item)
        text = f"list of {inner}"
    return text


def _range(node: dict[str, Any]) -> str:
    parts = []
    if "minimum" in node:
        parts.append(f">= {node['minimum']}")
    if "exclusiveMinimum" in node:
        parts.append(f"> {node['exclusiveMinimum']}")
    if "maximum" in node:
        parts.append(f"<= {node['maximum']}")
    return ", ".join(parts)


def _default(node: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "x-default" in node:
        return f"`{node['x-default']}`"
    if "default" not in node:
        return ""
    value = node["default"]
    return "none" if value is None else f"`{json.dumps(value)}`"


def _required_paths() -> set[str]:
    out: set[str] = set()

    def walk(prefix: str, node: dict[str, Any]) -> None:
        node = _resolve(node)
        for key in node.get("required", []):
            out.add(f"{prefix}.{key}" if prefix else key)
        for key, sub in node.get("properties", {}).items():
            path = f"{prefix}.{key}" if prefix else key
            walk(path, sub)
            sub = _resolve(sub)
            if isinstance(sub.get("items"), dict):
                walk(f"{path}[]", sub["items"])
            if isinstance(sub.get("additionalProperties"), dict):
                walk(f"{path}.<name>", sub["additionalProperties"])

    walk("", schema())
    return out


def reference() -> str:
    """docs/configuration.md: every setting with its type, default and description (Markdown)."""
    doc = schema()
    required = _required_paths()
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from gateway/schemas/config.schema.json by `pvegate config reference`: do not edit. -->",
        "",
        doc["description"],
        "",
        "Check a file with `pvegate config check pvegate.yaml`; `pvegate serve` refuses to start",
        "on the same problems, each named by its path (e.g. `clusters.prod.timeout`).",
        "An annotated example is in [deployment.md](deployment.md).",
        "",
        "| Setting | Type | Default | Description |",
        "|---|---|---|---|",
    ]
    secrets: list[str] = []
    for path, node in settings():
        if any(path.startswith(f"{s}.") for s in secrets):
            continue  # file/env: explained once, below
        if set(node.get("properties", {})) == {"file", "env"}:
            secrets.append(path)
        kind = _type_of(node)
        limits = _range(node)
        if limits:
            kind += f" ({limits})"
        description = " ".join(str(node.get("description", "")).split()).replace("|", "\\|")
        lines.append(f"| `{path}` | {kind} | {_default(node, path in required)} | {description} |")
    lines += [
        "",
        "A secret setting is a mapping with exactly one key: `file: PATH` (a file holding the secret, mode",
        "0600; surrounding whitespace is ignored) or `env: NAME` (an environment variable holding it).",
        "",
        "`clusters[]` is a list of clusters; in problem messages a cluster is named by its `name`",
        "(`clusters.prod.timeout`). `<name>` is a key you choose (an SSH node's Proxmox name).",
        "",
        "Beyond types and ranges, a configuration is refused when settings contradict each other",
        "or one would be silently ignored: two clusters with the same name, `opa.url` or `opa.token`",
        "without `opa.mode: external` (or the reverse), `opa.bundle` with `opa.policies`, `opa.verification_key`",
        "without `opa.bundle`, no `tls.cert`/`tls.key` without `tls.insecure_http`, plain HTTP on a",
        "non-loopback address, a cluster's `api_url` over plain `http://` to a non-loopback host (the",
        "API token would cross the network in the clear), both `auth.jwks_url` and `auth.jwks_file`,",
        "HS256 accepted without `auth.hs256_secret` (or `auth.hs256_secret` without HS256 in",
        "`auth.algorithms`: `pvegate token mint` would sign tokens the gateway refuses), an asymmetric",
        "algorithm without a JWKS, a cluster's `fingerprint` together with its `ca_file` or with",
        "`verify_tls: false`, and a cluster's `ca_file` with `verify_tls: false`. A `trusted_proxies` entry",
        "must be an IP address or CIDR network: `*` (believe every client's `X-Forwarded-For`) and names are",
        "refused. An `allowed_hosts` entry must be `host` or `host:port` and an `allowed_origins` entry",
        "`http(s)://host[:port]` without the scheme's default port (`:443`, `:80`): each is compared with",
        "the whole header, so `*`, a URL as a host, a path or a bare name as an origin would never match.",
        "An `opa.bundles.<name>.polling` or `opa.decision_logs_upload.reporting` section gives both",
        "`min_delay_seconds` and `max_delay_seconds` or neither, the min not above the max (OPA's rule).",
        "A cluster's `api_url` must have the path `/api2/json`, and `public_url` must not end in `/mcp` (it",
        "is the gateway's base URL); both, an external `opa.url`, each `auth.authorization_servers` entry",
        "and `console.issuer` need a host and a port",
        "(if any) from 1 to 65535, without query, fragment or whitespace. `auth.jwks_url` must be https (http",
        "only on `127.0.0.1`, `localhost` or `::1`), as `pvegate serve` requires, with a host and a port (if",
        "any) from 1 to 65535, and an enabled console's `console.scopes` must include `openid`.",
        "`listen.host` is a host name or IP address alone (`::1`, not `[::1]`; no port: that is `listen.port`).",
        "No URL setting may hold a user name or password. A mapping key YAML reads as something else than",
        "a string (an unquoted `on`, `yes` or `true` is a boolean, `1` a number) is refused: quote it.",
        "Every number that feeds a timeout, a sleep, a size or a count has a maximum (shown above).",
        "A key given twice in one mapping (YAML would keep the last silently), a merge (`<<: *x`) of a",
        "mapping that itself merges and overrides a key (PyYAML would take the merged value, not the",
        "override), a number that is `.nan`, `.inf` or `-.inf`, aliases (`*x`) that repeat more than",
        "100000 nodes in all (an alias bomb) and nesting deeper than the reader can follow are refused",
        "too. A problem never shows a URL's user name or password. The policy data",
        "(`policies/data/data.yaml`) and the connector files are read as strictly (`pvegate policy",
        "check`, `bundle build`, `pvegate check` and the gateway's start).",
        "",
        "## When the gateway cannot start",
        "",
        "`pvegate serve` then exits with status 2 and says why on stderr, in one line starting",
        "`pvegate: cannot start:` (several configuration problems: one per line after it); the",
        "traceback is only logged with `pvegate -v serve`. Before it starts OPA it checks that the",
        "configuration is valid, every secret can be read, `state_dir` (and the audit database's",
        "directory) can be created and written, the files it names can be read, each cluster's SSH",
        "private key loads without a passphrase and each pinned `host_key` is a public key, `opa.services`",
        "credentials given as `{file:}`/`{env:}` can be read, the TLS certificate and key load (a key that",
        "needs a passphrase is refused, never prompted for: store it decrypted), and `listen.port` is free.",
        "The policy data a managed OPA loads from a directory is read strictly (a key given twice refuses",
        "the start, as OPA would keep only the last). A managed OPA that",
        "refuses to start (e.g. a bundle",
        "whose signature or digest does not verify) is quoted from its log, `state_dir/opa.log`:",
        "",
        "```text",
        "pvegate: cannot start: OPA exited with status 1 during start-up: load error: bundle",
        "  /etc/pvegate/bundles/pvegate.tar.gz: pvegate/decision.rego: digest mismatch (want: ..., got: ...)",
        "  (log: /var/lib/pvegate/opa.log)",
        "```",
        "",
        "(one line on the terminal; wrapped here).",
        "",
    ]
    return "\n".join(lines)
