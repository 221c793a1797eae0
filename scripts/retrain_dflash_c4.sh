#!/usr/bin/env bash
# Issue 10, fourth continuation: the bundled DFlash drafter (c3, commit 65f75e7) continued on
# the last fresh greedy GSM8K rollouts of the target (rows 5800-7472, never used before) plus
# replayed replies it was trained on (scripts/retrain_dflash_c3.sh's Spec-Bench and MBPP sets,
# against forgetting), tapped at the drafter's five layers while generated. Bench / held-out /
# dev prompts are excluded. 2-core CPU timings in the README. Every step resumes when rerun.
set -euo pipefail
. .venv/bin/activate
D=${SPECVIZ_DATA:-../shared/data}
L=1,8,14,20,27
R="python -m specviz train rollouts --max-new-tokens 128 --batch-size 24 --holdout 0 --layers $L"
# 1. held-out rollouts for the exact simulated tau (as in scripts/retrain_dflash_c3.sh)
[ -f runs/eval-rollouts/manifest.jsonl ] || python -m specviz train rollouts \
  --data $D/gsm8k_train.jsonl:1224 --exclude $D/gsm8k_train.jsonl:1200 \
  --data $D/mbpp.jsonl:924 --exclude $D/mbpp.jsonl:900 \
  --data $D/spec_bench_dev.jsonl:18 --exclude $D/spec_bench_dev.jsonl:10 \
  --out runs/eval-rollouts --max-new-tokens 128 --batch-size 24 --holdout 0.9999
# 2. training rollouts: fresh GSM8K (~25 min at ~140 new tokens/s); replay sets as in c3
$R --data $D/gsm8k_train.jsonl:7473 --exclude $D/gsm8k_train.jsonl:5800 --out runs/c4-gsm
$R --data $D/spec_bench_dev.jsonl:60 --exclude $D/spec_bench_dev.jsonl:28 --out runs/c3-sb
$R --data $D/mbpp.jsonl:180 --exclude $D/mbpp.jsonl:30 --out runs/c3-mbpp
# 3. continue the drafter bundled before this step (commit 65f75e7, restored from git)
PREV=runs/dflash-c3
if [ ! -f $PREV/model.safetensors ]; then
  mkdir -p $PREV
  for f in config.json model.safetensors; do
    git show 65f75e7:specviz/weights/dflash-smollm2-135m-instruct/$f > $PREV/$f
  done
fi
python -m specviz train dflash --rollouts runs/eval-rollouts --prefill runs/c4-gsm \
  --prefill runs/c3-sb --prefill runs/c3-mbpp \
  --init $PREV --out runs/dflash-c4 $( [ -f runs/dflash-c4/train_state.pt ] && echo --resume ) \
  --block-size 8 --layers 2 --steps ${STEPS:-600} --batch-size 8 --anchors-per-seq 16 \
  --lr 3e-4 --gamma 4 --eval-every 150 --eval-rollouts 32 --save-dtype bfloat16
# 4. exact offline comparison on all 88 held-out rollouts
python -m specviz eval --drafters dflash:$PREV,dflash:runs/dflash-c4 --rollouts runs/eval-rollouts \
  --out results/dflash_c4_eval
# 5. bundle it and retrain the ReTrace fusion on it (~11 min; the step-40 checkpoint is bundled)
if [ "${BUNDLE:-0}" = 1 ]; then
  cp runs/dflash-c4/{config.json,model.safetensors,train_log.jsonl} \
    specviz/weights/dflash-smollm2-135m-instruct/
  python -m specviz train retrace --data runs/c4-gsm --data runs/c3-sb --data runs/c3-mbpp \
    --eval runs/eval-rollouts --out runs/retrace-c4 \
    $( [ -f runs/retrace-c4/train_state.pt ] && echo --resume ) \
    --steps 40 --batch-size 4 --anchors-per-seq 12 --lr 1e-4 --eval-every 10 --eval-sequences 32
  cp runs/retrace-c4/{config.json,model.safetensors,train_log.jsonl} \
    specviz/weights/retrace-smollm2-135m-instruct/
fi
