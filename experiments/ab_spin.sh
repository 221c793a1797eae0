#!/usr/bin/env bash
# OpenMP workers that sleep at once (GOMP_SPINCOUNT=0, the passive policy alone) vs a short
# bounded spin (20000, specviz's default), back to back: AR, AdaPLD and DFlash on 20 GSM8K + 20
# MBPP bench prompts (none trained on), greedy, 64 new tokens. Speedups vs AR in each run.
#   bash experiments/ab_spin.sh [OUT]         # default OUT: results/ab_spin
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
D=${SPECVIZ_DATA:-../shared/data}
OUT=${1:-results/ab_spin}
for spin in 0 20000; do
  GOMP_SPINCOUNT=$spin python -m specviz bench --methods ar,adapld,dflash \
    --data $D/gsm8k_train.jsonl:20 --data $D/mbpp.jsonl:20 --max-new-tokens 64 --out "$OUT/spin$spin"
done
