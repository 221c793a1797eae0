#!/usr/bin/env bash
# Issues 10 and 11, one bench: AR, PLD, AdaPLD, the previously bundled DFlash drafter (PREV,
# default runs/dflash-c1 = commit b44607b's), the bundled DFlash drafter and ReTrace on it, on
# the README's DFlash prompts (Spec-Bench dev 10/category, 30 GSM8K, 30 MBPP, 25 Alpaca; none
# trained on by any drafter or fusion), greedy, 64 new tokens, traces saved, then the
# rejected-suffix alignment table. METHODS=ar,dflash,retrace runs a subset (the same prompts).
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
D=${SPECVIZ_DATA:-../shared/data}
OUT=${1:-results/bench_dflash_c2}
PREV=${PREV:-runs/dflash-c1}
METHODS=${METHODS:-ar,pld,adapld,dflash@prev,dflash,retrace}
# PARAMS (JSON) replaces the per-method settings, e.g. to add a float-weights DFlash:
# PARAMS='{"dflash@prev": {"checkpoint": "runs/dflash-c3"}, "dflash@float": {"weights": "float"}}'
PARAMS=${PARAMS:-"{\"dflash@prev\": {\"checkpoint\": \"$PREV\"}}"}
python -m specviz bench --methods "$METHODS" --params "$PARAMS" \
  --data $D/spec_bench_dev.jsonl:10 --data $D/gsm8k_train.jsonl:30 --data $D/mbpp.jsonl:30 \
  --data $D/alpaca_seed_tasks.jsonl:25 --max-new-tokens 64 --out "$OUT" --save-traces
python -m specviz align "$OUT/traces" --out "$OUT/alignment.csv" --bound-out "$OUT/suffix_bound.csv"
