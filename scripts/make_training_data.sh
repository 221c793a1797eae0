#!/usr/bin/env bash
# The training / held-out data behind the figures in the README (2-core CPU timings in docs/dflash.md).
# Bench prompts (the first 10 per Spec-Bench category, 30 GSM8K, 30 MBPP, 25 Alpaca) are
# excluded everywhere. Outputs go to runs/ (git-ignored). Run from the repository root.
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
D=${SPECVIZ_DATA:-../shared/data}
# 1. held-out greedy rollouts: the exact simulated tau / round-r+1 measure (88 replies, 128 tokens)
python -m specviz train rollouts --data $D/gsm8k_train.jsonl:1224 --exclude $D/gsm8k_train.jsonl:1200 \
  --data $D/mbpp.jsonl:924 --exclude $D/mbpp.jsonl:900 \
  --data $D/spec_bench_dev.jsonl:18 --exclude $D/spec_bench_dev.jsonl:10 \
  --out runs/eval-rollouts --max-new-tokens 128 --batch-size 24 --holdout 0.9999
# 2. prefill-labelled texts (15 min: 2,357 texts, 406k tokens)
python -m specviz train prefill --data $D/gsm8k_train.jsonl:1200 --data $D/mbpp.jsonl:900 \
  --data $D/alpaca_seed_tasks.jsonl --data $D/spec_bench_dev.jsonl \
  --exclude $D/gsm8k_train.jsonl:30 --exclude $D/mbpp.jsonl:30 \
  --exclude $D/alpaca_seed_tasks.jsonl:25 --exclude $D/spec_bench_dev.jsonl:10 \
  --out runs/prefill --max-tokens 640
# 3. greedy training rollouts for ReTrace and EDR fine-tuning (164 replies, 18k tokens)
python -m specviz train rollouts --data $D/gsm8k_train.jsonl:1380 --exclude $D/gsm8k_train.jsonl:1300 \
  --data $D/mbpp.jsonl:974 --exclude $D/mbpp.jsonl:930 \
  --data $D/spec_bench_dev.jsonl:26 --exclude $D/spec_bench_dev.jsonl:18 \
  --out runs/edr-rollouts --max-new-tokens 128 --batch-size 24 --holdout 0
