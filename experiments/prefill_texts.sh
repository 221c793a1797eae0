#!/usr/bin/env bash
# Prefill-labelled texts (`train prefill`: one batched forward over prompt + reference reply,
# the target's greedy next token stored per position, exact labels while the text follows it):
# GSM8K rows 30-1199, MBPP 30-899, Alpaca 25-174, Spec-Bench references from row 10 on, bench
# prompts excluded; 2,357 texts, 406k tokens, 15 min on a 2-core CPU, into $WORK/prefill. The
# data of the prefill-label experiments (continuing a drafter on them made it worse on the
# target's own replies), with the held-out and training replies beside them ($WORK/eval-rollouts,
# $WORK/edr-rollouts).
#   bash experiments/prefill_texts.sh          # WORK (runs), DATA
. "$(dirname "$0")/../recipes/common.sh"
eval_rollouts
$TRAIN prefill --data "$D/gsm8k_train.jsonl:1200" --data "$D/mbpp.jsonl:900" \
  --data "$D/alpaca_seed_tasks.jsonl" --data "$D/spec_bench_dev.jsonl" \
  --exclude "$D/gsm8k_train.jsonl:30" --exclude "$D/mbpp.jsonl:30" \
  --exclude "$D/alpaca_seed_tasks.jsonl:25" --exclude "$D/spec_bench_dev.jsonl:10" \
  --out "$W/prefill" --max-tokens 640
edr_rollouts
