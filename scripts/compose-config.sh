#!/usr/bin/env bash
# `make compose-config`: docker/config/ for docker/compose.yaml, from docker/config.example/.
# Never overwrites: an existing configuration or secret is left as it is. Generates the OPA API
# token (opa.env) and the admin token; lists what the operator still has to provide.
#
# Env: COMPOSE_CONFIG_DIR (default docker/config).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${COMPOSE_CONFIG_DIR:-$ROOT/docker/config}"

token() { python3 -c 'import secrets; print(secrets.token_urlsafe(32))'; }

# the configuration is readable by the container's user (uid 10001); secrets and keys are not, until
# the operator hands them to that user (README.md)
umask 022
mkdir -p "$DEST"
for f in pvegate.yaml pvegate-pg.yaml README.md; do
	[ -e "$DEST/$f" ] || cp "$ROOT/docker/config.example/$f" "$DEST/$f"
done
umask 077
mkdir -p "$DEST/secrets" "$DEST/tls"
if [ ! -s "$DEST/opa.env" ]; then
	printf 'PVEGATE_OPA_TOKEN=%s\n' "$(token)" >"$DEST/opa.env"
	echo ">> $DEST/opa.env: a new OPA API token"
fi
if [ ! -s "$DEST/secrets/admin-token" ]; then
	token >"$DEST/secrets/admin-token"
	echo ">> $DEST/secrets/admin-token: a new admin token"
fi
# the postgresql profile: PostgreSQL's password (the server's env file and the gateways' secret
# hold the same one) and the request-state key every replica shares
if [ ! -s "$DEST/secrets/pg-password" ]; then
	token >"$DEST/secrets/pg-password"
	echo ">> $DEST/secrets/pg-password: a new PostgreSQL password"
fi
if [ ! -s "$DEST/postgres.env" ]; then
	printf 'POSTGRES_USER=pvegate\nPOSTGRES_DB=pvegate\nPOSTGRES_PASSWORD=%s\n' "$(cat "$DEST/secrets/pg-password")" >"$DEST/postgres.env"
	echo ">> $DEST/postgres.env: PostgreSQL's user, database and password"
fi
if [ ! -s "$DEST/secrets/state-key" ]; then
	python3 -c 'import secrets; print(secrets.token_hex(32))' >"$DEST/secrets/state-key"
	echo ">> $DEST/secrets/state-key: a new request-state key (shared by the replicas)"
fi
missing=()
for f in tls/server.pem tls/server-key.pem secrets/pve-token pve-ca.pem; do
	[ -s "$DEST/$f" ] || missing+=("$f")
done
if [ "${#missing[@]}" -gt 0 ]; then
	echo ">> still to provide in $DEST (see its README.md): ${missing[*]}"
fi
