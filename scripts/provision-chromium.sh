#!/usr/bin/env bash
# Headless Chromium for the console's browser test (tests/console/test_browser.py), from Debian's
# packages: Playwright's own browser downloads are not reachable, so Playwright drives this one
# (chromium.launch(executable_path="/usr/bin/chromium")). Skipped when already installed.
set -euo pipefail
CHROMIUM="${PVEGATE_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then
  echo "chromium: $CHROMIUM (installed)"
  exit 0
fi
command -v apt-get >/dev/null 2>&1 || { echo "error: no $CHROMIUM and no apt-get: install Chromium, or set PVEGATE_CHROMIUM" >&2; exit 1; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing chromium with apt-get (once)..."
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
"$CHROMIUM" --version
