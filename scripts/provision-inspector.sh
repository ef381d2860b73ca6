#!/usr/bin/env bash
# Install the MCP Inspector (CLI mode is our second, independent MCP client in the tests)
# into the git-ignored .tools/node. Pinned: 0.21.2 is the newest 0.x; it declares node >= 22
# but its CLI mode (Streamable HTTP, --header, --tool-metadata) runs on the node 20 we have,
# which tests/mcp/test_inspector.py proves on every run.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${INSPECTOR_VERSION:-0.21.2}"
PREFIX=.tools/node
BIN="$PREFIX/node_modules/@modelcontextprotocol/inspector-cli/build/index.js"
if [ -f "$BIN" ] && grep -q "\"version\": \"$VERSION\"" "$PREFIX/node_modules/@modelcontextprotocol/inspector/package.json" 2>/dev/null; then
  exit 0
fi
command -v npm >/dev/null || { echo "npm not found: skipping the MCP Inspector (its tests will skip)"; exit 0; }
echo ">> installing @modelcontextprotocol/inspector@$VERSION into $PREFIX"
mkdir -p "$PREFIX"
npm install --silent --no-audit --no-fund --prefix "$PREFIX" "@modelcontextprotocol/inspector@$VERSION"
