#!/usr/bin/env bash
# Provision a Compose implementation so `make test` can validate docker/compose.yaml
# (`docker-compose config` needs no Docker daemon). Debian's docker-compose (1.29, Python)
# is installed without its recommended Docker engine. Idempotent; skipped (and said so)
# where packages cannot be installed, and then tests/packaging/test_compose.py skips
# only its `docker-compose config` step.
set -euo pipefail
if command -v docker-compose >/dev/null 2>&1; then
	exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	echo "docker-compose not found and not installable here (needs root and apt-get):" \
		"the compose file is still checked, but not by docker-compose config"
	exit 0
fi
echo ">> installing docker-compose (Debian package, without the Docker engine)"
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq --no-install-recommends docker-compose >/dev/null; then
	apt-get update -qq >/dev/null
	apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
fi
docker-compose version --short
