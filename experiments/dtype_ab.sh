#!/usr/bin/env bash
# The target's numerics A/B (specviz.numerics): the same 22 prompts (10 GSM8K, Spec-Bench dev
# 2/category), AR and PLD, once with a float32 target (unpadded, SDPA) and once in bfloat16 with
# the width-invariant attention and padded forwards; greedy, 64 new tokens. Run on a quiet
# machine, one after the other. Usage (repo root): bash experiments/dtype_ab.sh results/dtype_ab
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
D=${SPECVIZ_DATA:-../shared/data}
OUT=${1:?output folder}
for dt in float32 bfloat16; do
  python -m specviz bench --target-dtype $dt --methods pld \
    --data $D/gsm8k_train.jsonl:10 --data $D/spec_bench_dev.jsonl:2 \
    --max-new-tokens 64 --out "$OUT/$dt"
done
