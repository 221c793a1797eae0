#!/usr/bin/env bash
# Real greedy bench of the fine-tuned drafters of experiments/dspark_finetune.sh (EDR vs
# decay-CE; DFlash in runs/ft-*, DSpark in runs/ds-*) on 30 bench prompts none of them trained
# on, one torch thread, into results/finetune_dspark/bench_{edr,decay_ce}.
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
D=${SPECVIZ_DATA:-../shared/data}
for obj in edr decay_ce; do
python -m specviz bench --methods dflash,dspark \
  --params "{\"dflash\": {\"checkpoint\": \"runs/ft-$obj\"}, \"dspark\": {\"checkpoint\": \"runs/ds-$obj\"}}" \
  --data $D/spec_bench_dev.jsonl:2 --data $D/gsm8k_train.jsonl:10 --data $D/mbpp.jsonl:10 \
  --max-new-tokens 64 --out results/finetune_dspark/bench_$obj
done
