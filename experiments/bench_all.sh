#!/usr/bin/env bash
# One bench of every method on the union of the DFlash, ReTrace and AdaPLD prompt sets, none of
# them trained on or tuned against: code editing (MBPP rows 800-819, specviz.editset),
# Spec-Bench dev 10 per category, 30 GSM8K, 30 MBPP, 25 Alpaca. Greedy, 64 new tokens, traces
# saved, then the rejected-suffix alignment table of the same traces. Methods: AR, PLD, AdaPLD
# and its lexical-only ablation, DFlash (default: block cut + forward gate), DFlash with the
# block cut only (dflash@block, no forward gate), ReTrace on the DFlash backbone.
#   bash experiments/bench_all.sh results/bench_all_quiet
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
D=${SPECVIZ_DATA:-../shared/data}
OUT=${1:?output folder}
python -m specviz bench --methods ${METHODS:-pld,adapld,adapld_lex,dflash,dflash@block,retrace} \
  --params '{"dflash@block": {"cut": "block"}}' \
  --data edit:$D/mbpp.jsonl:20:800 --data $D/spec_bench_dev.jsonl:10 \
  --data $D/gsm8k_train.jsonl:30 --data $D/mbpp.jsonl:30 --data $D/alpaca_seed_tasks.jsonl:25 \
  --max-new-tokens 64 --out "$OUT" --save-traces
python -m specviz align "$OUT/traces" --out "$OUT/alignment.csv" --bound-out "$OUT/suffix_bound.csv"
# the traces (~50 MB) stay out of git: moved to runs/ (reopen them in the app or with `align`)
mkdir -p runs && rm -rf "runs/$(basename "$OUT")-traces" && mv "$OUT/traces" "runs/$(basename "$OUT")-traces"
