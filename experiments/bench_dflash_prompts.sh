#!/usr/bin/env bash
# The DFlash prompts bench: AR, PLD, AdaPLD, another DFlash checkpoint (dflash@prev = PREV,
# default runs/dflash-stage5: the stage of recipes/dflash.sh before the bundled drafter), the
# bundled DFlash drafter and ReTrace on it, on Spec-Bench dev 10/category, 30 GSM8K, 30 MBPP and
# 25 Alpaca prompts (none trained on by any drafter or fusion), greedy, 64 new tokens, traces
# saved, then the rejected-suffix alignment table. METHODS=ar,dflash,retrace runs a subset (the
# same prompts).
#   bash experiments/bench_dflash_prompts.sh [OUT]    # default OUT: results/bench_dflash_c2
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
D=${SPECVIZ_DATA:-../shared/data}
OUT=${1:-results/bench_dflash_c2}
PREV=${PREV:-runs/dflash-stage5}
METHODS=${METHODS:-ar,pld,adapld,dflash@prev,dflash,retrace}
# PARAMS (JSON) replaces the per-method settings, e.g. to add a float-weights DFlash:
# PARAMS='{"dflash@prev": {"checkpoint": "runs/dflash-stage3"}, "dflash@float": {"weights": "float"}}'
PARAMS=${PARAMS:-"{\"dflash@prev\": {\"checkpoint\": \"$PREV\"}}"}
python -m specviz bench --methods "$METHODS" --params "$PARAMS" \
  --data $D/spec_bench_dev.jsonl:10 --data $D/gsm8k_train.jsonl:30 --data $D/mbpp.jsonl:30 \
  --data $D/alpaca_seed_tasks.jsonl:25 --max-new-tokens 64 --out "$OUT" --save-traces
python -m specviz align "$OUT/traces" --out "$OUT/alignment.csv" --bound-out "$OUT/suffix_bound.csv"
