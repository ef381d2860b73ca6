#!/usr/bin/env bash
# `make bundle`: the signed OPA bundle that docker/compose.yaml serves, in bundles/ (git-ignored).
# Demo signing keys are generated in bundles/keys/ when missing, never committed: for
# production, sign with a key kept offline (bundles/README.md).
#
# Env: BUNDLE_DIR (default bundles/), PVEGATE (default .venv/bin/pvegate).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${BUNDLE_DIR:-$ROOT/bundles}"
PVEGATE="${PVEGATE:-$ROOT/.venv/bin/pvegate}"
KEYS="$OUT/keys"

if [ ! -s "$KEYS/bundle-signing.pem" ] || [ ! -s "$KEYS/bundle-verify.pem" ]; then
	echo ">> no signing key in $KEYS: generating a demo key pair (pvegate bundle keygen)"
	"$PVEGATE" bundle keygen --out "$KEYS"
fi
"$PVEGATE" bundle build --policies "$ROOT/policies" --signing-key "$KEYS/bundle-signing.pem" -o "$OUT/pvegate.tar.gz"
"$PVEGATE" bundle verify "$OUT/pvegate.tar.gz" --verification-key "$KEYS/bundle-verify.pem"
