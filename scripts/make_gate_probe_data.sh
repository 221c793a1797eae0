#!/usr/bin/env bash
# Rollouts for the forward gate's state probe (issue 10, item 3; thirteenth session): greedy
# 128-token replies of the embedded target to prompts in NO drafter's training and in no bench
# or held-out set -- Spec-Bench dev rows 60-79 of each category, GSM8K rows 6400-6479, MBPP rows
# 600-679 and 160 Magpie requests of seed 4 -- so the bundled drafter's acceptance on them is
# what it is on unseen text. ~6 min on the 2-core CPU. Then:
#   python -m specviz train gate-probe --rollouts runs/gate-probe --out specviz/weights/...
. "$(dirname "$0")/rollouts_common.sh"   # D, L, R
P="python -m specviz train prompts --batch-size 32"
[ -f runs/magpie-probe4.jsonl ] || $P --count 160 --seed 4 --exclude runs/magpie-prompts.jsonl \
  --exclude runs/magpie-prompts2.jsonl --exclude runs/magpie-eval3.jsonl \
  --out runs/magpie-probe4.jsonl
$R --data $D/spec_bench_dev.jsonl:80 --exclude $D/spec_bench_dev.jsonl:60 \
  --data $D/gsm8k_train.jsonl:6480 --exclude $D/gsm8k_train.jsonl:6400 \
  --data $D/mbpp.jsonl:680 --exclude $D/mbpp.jsonl:600 \
  --data runs/magpie-probe4.jsonl --out runs/gate-probe
