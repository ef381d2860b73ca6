#!/usr/bin/env bash
# Provision PostgreSQL's server binaries (initdb, postgres) for the storage tests: tests/pgserver.py
# starts a throw-away cluster on 127.0.0.1 in a temp folder. Debian's `postgresql` package, whose
# own cluster service is not started (no init system here, and nothing else uses it). Idempotent;
# skipped when initdb is already on PATH or in /usr/lib/postgresql/*/bin.
set -euo pipefail
if command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
	exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	echo "PostgreSQL not found and not installable here (needs root and apt-get): install its server" \
		"package (initdb, postgres) yourself; the PostgreSQL storage tests fail without it" >&2
	exit 1
fi
echo ">> installing PostgreSQL (Debian package postgresql) for the storage tests"
export DEBIAN_FRONTEND=noninteractive
# keep the package from starting its own cluster service (a server nobody stops): deny service
# starts during the install, as Debian's policy-rc.d interface allows, unless a policy is already set
if [ ! -e /usr/sbin/policy-rc.d ]; then
	printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
	chmod +x /usr/sbin/policy-rc.d
	trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
if ! apt-get install -y -qq --no-install-recommends postgresql >/dev/null; then
	apt-get update -qq >/dev/null
	apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi
compgen -G "/usr/lib/postgresql/*/bin/initdb"
