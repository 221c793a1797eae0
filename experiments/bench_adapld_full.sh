#!/usr/bin/env bash
# The full AdaPLD bench: code editing (MBPP rows 800-819, built by specviz.editset) +
# Spec-Bench dev 10/category + 30 GSM8K + 30 MBPP, greedy, 64 new tokens. Usage (repo root):
#   bash experiments/bench_adapld_full.sh results/bench_adapld_full_quiet2
# Loaded repeat (a second process busy on one core):
#   bash experiments/bench_adapld_full.sh OUT & bash experiments/one_core_load.sh $!
# METHODS=pld,adapld overrides the methods (AR is always run).
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
D=${SPECVIZ_DATA:-../shared/data}
python -m specviz bench --methods ${METHODS:-ar,pld,adapld,adapld_nohist,adapld_lex} \
  --data edit:$D/mbpp.jsonl:20:800 --data $D/spec_bench_dev.jsonl:10 \
  --data $D/gsm8k_train.jsonl:30 --data $D/mbpp.jsonl:30 \
  --max-new-tokens 64 --out "${1:?output folder}"
