#!/usr/bin/env bash
# Provision the pinned OPA binary into .tools/bin (git-ignored).
# No package registry ships OPA, so it is built from the Go module proxy.
set -euo pipefail
OPA_VERSION="${OPA_VERSION:-v1.22.3}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$ROOT/.tools/bin"
mkdir -p "$BIN"

have_version() { # $1=binary; succeeds when it reports the pinned version
  # capture first: with pipefail, `grep -q` closing the pipe early would fail the check
  local out
  out="$("$1" version 2>/dev/null)" || return 1
  grep -q "^Version: ${OPA_VERSION#v}\$" <<<"$out"
}

if [ -x "$BIN/opa" ] && have_version "$BIN/opa"; then
  echo "opa ${OPA_VERSION}: $BIN/opa (cached)"
  exit 0
fi
if command -v opa >/dev/null 2>&1 && have_version "$(command -v opa)"; then
  ln -sf "$(command -v opa)" "$BIN/opa"
  echo "opa ${OPA_VERSION}: reusing $(command -v opa)"
  exit 0
fi
command -v go >/dev/null 2>&1 || { echo "error: Go is needed to build OPA ${OPA_VERSION} (or put opa ${OPA_VERSION} on PATH)" >&2; exit 1; }
echo "building opa ${OPA_VERSION} with 'go install' into $BIN (first build takes a few minutes)..."
GOBIN="$BIN" GOFLAGS=-mod=mod go install "github.com/open-policy-agent/opa@${OPA_VERSION}"
have_version "$BIN/opa" || { echo "error: built opa does not report ${OPA_VERSION}" >&2; exit 1; }
echo "opa ${OPA_VERSION}: built $BIN/opa"
