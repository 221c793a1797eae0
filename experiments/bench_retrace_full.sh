#!/usr/bin/env bash
# ReTrace's paired bench and the rejected-suffix alignment table (Spec-Bench dev 10 per
# category, 30 GSM8K, 30 MBPP; none of them trained on by any drafter or fusion): AR, PLD,
# AdaPLD, DFlash (the ReTrace backbone) and ReTrace, greedy, traces saved.
#   bash experiments/bench_retrace_full.sh [OUT] [BENCH ARGS]   # OUT: results/bench_retrace_full
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
D=${SPECVIZ_DATA:-../shared/data}
OUT=${1:-results/bench_retrace_full}
python -m specviz bench --methods pld,adapld,dflash,retrace --data $D/spec_bench_dev.jsonl:10 \
  --data $D/gsm8k_train.jsonl:30 --data $D/mbpp.jsonl:30 --max-new-tokens 64 --out "$OUT" \
  --save-traces "${@:2}"
python -m specviz align "$OUT/traces" --out "$OUT/alignment.csv" --bound-out "$OUT/suffix_bound.csv"
