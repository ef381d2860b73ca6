#!/usr/bin/env bash
# `make bench`: the side-by-side benchmark (bench/run.py -> docs/performance.md),
# then the long resilience tests (soak, 200k-call runs) behind the `slow` marker.
#   BENCH_ARGS="--seconds 5 --memory-calls 50000"  make bench   # a quick look: bench/results/quick-*.json, record untouched
#   BENCH_ARGS="... --record" make bench                        # record a run with options
#   BENCH_SKIP_SLOW=1 make bench                                # benchmark only
#   BENCH_STORAGE_ARGS="--seconds 5" make bench                 # storage rows printed, not recorded
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v wrk >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo ">> installing wrk (Debian package)"
    apt-get install -y wrk >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y wrk >/dev/null; }
  else
    echo "error: wrk is not installed; run: sudo apt-get install -y wrk" >&2
    exit 2
  fi
fi

# shellcheck disable=SC2086  # BENCH_ARGS is a list of options
.venv/bin/python bench/run.py ${BENCH_ARGS:-}

# the storage rows, side by side in one run: the full path on SQLite against PostgreSQL, one
# replica against two (bench/storage.py -> docs/performance.md, "Storage and replicas")
# shellcheck disable=SC2086  # BENCH_STORAGE_ARGS is a list of options
.venv/bin/python bench/storage.py ${BENCH_STORAGE_ARGS:---record}

if [ -z "${BENCH_SKIP_SLOW:-}" ]; then
  echo ">> slow resilience tests (soak; a replica SIGKILLed under load)"
  .venv/bin/pytest -q -m slow tests/resilience tests/replicas
fi
