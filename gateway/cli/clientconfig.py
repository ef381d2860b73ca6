"""How MCP clients are pointed at pvegate: one snippet per client, in that client's own format.

One source for both the README's "Pointing an MCP client at it" section (placeholders,
kept in sync by `python -m gateway.cli.docs`) and what `pvegate demo` prints (the real URL,
token and CA file). Formats, as each client documents them:

- Claude Code: `.mcp.json` `mcpServers.<name>` with `"type": "http"`, `url`, `headers`;
  or `claude mcp add --transport http <name> <url> --header "Authorization: Bearer …"`.
- VS Code: `.vscode/mcp.json` `servers.<name>` with `"type": "http"`, `url`, `headers`.
- Cursor: `.cursor/mcp.json` (or `~/.cursor/mcp.json`) `mcpServers.<name>` with `url`, `headers`.
- MCP Inspector 0.21.2 (CLI mode): `--cli <url> --transport http --header "Authorization: Bearer …"`.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

NAME = "pvegate"
INSPECTOR = "@modelcontextprotocol/inspector@0.21.2"  # the version scripts/provision-inspector.sh pins

# what the README shows in place of the values `pvegate demo` fills in
README_URL = "https://127.0.0.1:8443/mcp"
README_TOKEN = "<token printed by make demo>"  # noqa: S105 - a placeholder, not a secret
README_CA = ".state/demo/tls/ca.pem"


@dataclass(frozen=True)
class Snippet:
    client: str
    where: str  # where the text goes, in the client's own terms (Markdown)
    lang: str  # the fence language: json or sh
    text: str


def _json(doc: object) -> str:
    return json.dumps(doc, indent=2)


def snippets(url: str, token: str, ca_file: str) -> list[Snippet]:
    headers = {"Authorization": f"Bearer {token}"}
    auth = shlex.quote(f"Authorization: Bearer {token}")
    ca = f"NODE_EXTRA_CA_CERTS={shlex.quote(ca_file)}"
    return [
        Snippet(
            "Claude Code",
            "`.mcp.json` in the project root",
            "json",
            _json({"mcpServers": {NAME: {"type": "http", "url": url, "headers": headers}}}),
        ),
        Snippet(
            "Claude Code",
            "or the same from the command line",
            "sh",
            f"claude mcp add --transport http {NAME} {shlex.quote(url)} --header {auth}",
        ),
        Snippet(
            "VS Code",
            "`.vscode/mcp.json` in the workspace",
            "json",
            _json({"servers": {NAME: {"type": "http", "url": url, "headers": headers}}}),
        ),
        Snippet(
            "Cursor",
            "`.cursor/mcp.json` in the project (or `~/.cursor/mcp.json`)",
            "json",
            _json({"mcpServers": {NAME: {"url": url, "headers": headers}}}),
        ),
        Snippet(
            "MCP Inspector",
            "CLI mode, one method per run",
            "sh",
            # -y: npx would otherwise stop to ask (and, without a terminal, refuse) before fetching it once
            f"{ca} npx -y {INSPECTOR} --cli {shlex.quote(url)} --transport http --header {auth} --method tools/list",
        ),
    ]


def trust_note(ca_file: str) -> str:
    return (
        f"The gateway's certificate is signed by the demo CA `{ca_file}`: start Node-based clients "
        f"(Claude Code, VS Code, Cursor, the Inspector) with `NODE_EXTRA_CA_CERTS={ca_file}` in their "
        "environment, and Python ones with `SSL_CERT_FILE`."
    )


def markdown(url: str = README_URL, token: str = README_TOKEN, ca_file: str = README_CA) -> str:
    """The README section body (between its clients markers)."""
    out: list[str] = []
    for s in snippets(url, token, ca_file):
        out += [f"**{s.client}**, {s.where}:", "", f"```{s.lang}", s.text, "```", ""]
    out.append(trust_note(ca_file))
    return "\n".join(out)


def console(url: str, token: str, ca_file: str) -> list[str]:
    """The same snippets as `pvegate demo` prints them, real values filled in."""
    out: list[str] = []
    for s in snippets(url, token, ca_file):
        out.append(f"  {s.client}: {s.where.replace('`', '')}")
        out += ["    " + line for line in s.text.splitlines()]
    return out
