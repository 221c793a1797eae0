#!/usr/bin/env bash
# Issue 10's bench: AR, PLD, AdaPLD, the old bundled DFlash drafter and the retrained one, on the
# README's DFlash prompts (none trained on by either drafter), greedy, 64 new tokens.
# OLD / NEW: the two checkpoint folders (defaults: runs/dflash-old, runs/dflash-c1).
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
D=${SPECVIZ_DATA:-../shared/data}
OUT=${1:-results/bench_dflash_new}
OLD=${OLD:-runs/dflash-old}
NEW=${NEW:-runs/dflash-c1}
python -m specviz bench --methods ar,pld,adapld,dflash@old,dflash@new \
  --params "{\"dflash@old\": {\"checkpoint\": \"$OLD\"}, \"dflash@new\": {\"checkpoint\": \"$NEW\"}}" \
  --data $D/spec_bench_dev.jsonl:10 --data $D/gsm8k_train.jsonl:30 --data $D/mbpp.jsonl:30 \
  --data $D/alpaca_seed_tasks.jsonl:25 --max-new-tokens 64 --out "$OUT"
