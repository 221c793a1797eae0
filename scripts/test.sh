#!/usr/bin/env bash
# One command for a fresh machine: install everything the tests need, then run the test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m slow`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
. scripts/setup_env.sh
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"  # see specviz/__main__.py
# Browser tests drive Debian's chromium through Playwright (never `playwright install`).
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = "0" ]; then
    echo "[specviz] installing Debian chromium for the browser tests"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "[specviz] chromium could not be installed; browser tests will be skipped"
  else
    echo "[specviz] /usr/bin/chromium missing (install it with: sudo apt-get install chromium); browser tests will be skipped"
  fi
fi
python -m specviz prepare
exec python -m pytest "$@"
