#!/usr/bin/env bash
# The same prompts with torch's default linear kernels and with the measured packed ones
# (specviz/kernels.py), back to back: AR, AdaPLD and DFlash on 20 GSM8K + 20 MBPP prompts (bench
# prompts, none trained on), greedy, 64 new tokens. Speedups are against AR in each run.
#   bash experiments/ab_kernels.sh [OUT]      # default OUT: results/ab_kernels
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
D=${SPECVIZ_DATA:-../shared/data}
OUT=${1:-results/ab_kernels}
for mode in default packed; do
  SPECVIZ_LINEAR=$mode python -m specviz bench --methods ar,adapld,dflash \
    --data $D/gsm8k_train.jsonl:20 --data $D/mbpp.jsonl:20 --max-new-tokens 64 --out "$OUT/$mode"
done
