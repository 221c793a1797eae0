#!/usr/bin/env bash
# One command for a fresh machine: install everything, prepare the embedded model, start the app.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
. scripts/setup_env.sh
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"  # see specviz/__main__.py
echo "[specviz] preparing the embedded SmolLM2-135M-Instruct (converted once, then cached)"
python -m specviz prepare
exec streamlit run app.py --browser.gatherUsageStats false "$@"
