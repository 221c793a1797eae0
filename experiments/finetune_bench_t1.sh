#!/usr/bin/env bash
# Real SAMPLED bench (temperature 1, the drafters drafting at 1) of the drafters fine-tuned with
# sampled acceptance by experiments/edr_sampled.sh (EDR vs decay-CE; DFlash in runs/ft1-*,
# DSpark in runs/ds1-*), on 30 bench prompts none of them trained on.
#   bash experiments/finetune_bench_t1.sh [OUT] [auto|off]   # OUT: results/edr_sampled
# Second argument: the block cut (auto = the default cost-aware cut; off = whole blocks, as the
# offline evaluation drafts them).
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
D=${SPECVIZ_DATA:-../shared/data}
OUT=${1:-results/edr_sampled}
CUT=${2:-auto}
SUF=$([ "$CUT" = auto ] && echo "" || echo "_cut_$CUT")
for obj in edr decay_ce; do
python -m specviz bench --methods dflash,dspark --temperature 1 \
  --params "{\"dflash\": {\"checkpoint\": \"runs/ft1-$obj\", \"draft_temperature\": 1, \"cut\": \"$CUT\"}, \"dspark\": {\"checkpoint\": \"runs/ds1-$obj\", \"draft_temperature\": 1, \"cut\": \"$CUT\"}}" \
  --data $D/spec_bench_dev.jsonl:2 --data $D/gsm8k_train.jsonl:10 --data $D/mbpp.jsonl:10 \
  --max-new-tokens 64 --out "$OUT/bench_t1_$obj$SUF"
done
