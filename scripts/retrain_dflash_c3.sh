#!/usr/bin/env bash
# Issue 10, third continuation: the bundled DFlash drafter continued on fresh greedy rollouts of
# the target (GSM8K rows 4600-5799, never used before) plus replayed replies it was trained on
# (Spec-Bench rows 28-59 per category, MBPP rows 30-179: against forgetting), tapped at the
# drafter's five layers while they are generated. Bench / held-out / dev prompts are excluded
# (see scripts/make_store.sh). 2-core CPU timings in the README. Every step resumes when rerun.
set -euo pipefail
. .venv/bin/activate
D=${SPECVIZ_DATA:-../shared/data}
L=1,8,14,20,27
R="python -m specviz train rollouts --max-new-tokens 128 --batch-size 24 --holdout 0 --layers $L"
# 1. held-out rollouts for the exact simulated tau (scripts/make_training_data.sh step 1)
[ -f runs/eval-rollouts/manifest.jsonl ] || python -m specviz train rollouts \
  --data $D/gsm8k_train.jsonl:1224 --exclude $D/gsm8k_train.jsonl:1200 \
  --data $D/mbpp.jsonl:924 --exclude $D/mbpp.jsonl:900 \
  --data $D/spec_bench_dev.jsonl:18 --exclude $D/spec_bench_dev.jsonl:10 \
  --out runs/eval-rollouts --max-new-tokens 128 --batch-size 24 --holdout 0.9999
# 2. training rollouts (~20 min at ~140 new tokens/s)
$R --data $D/gsm8k_train.jsonl:5800 --exclude $D/gsm8k_train.jsonl:4600 --out runs/c3-gsm
$R --data $D/spec_bench_dev.jsonl:60 --exclude $D/spec_bench_dev.jsonl:28 --out runs/c3-sb
$R --data $D/mbpp.jsonl:180 --exclude $D/mbpp.jsonl:30 --out runs/c3-mbpp
# 3. continue the drafter bundled before this step (commit 44967fb, restored from git)
PREV=runs/dflash-c2
if [ ! -f $PREV/model.safetensors ]; then
  mkdir -p $PREV
  for f in config.json model.safetensors; do
    git show 44967fb:specviz/weights/dflash-smollm2-135m-instruct/$f > $PREV/$f
  done
fi
python -m specviz train dflash --rollouts runs/eval-rollouts --prefill runs/c3-gsm \
  --prefill runs/c3-sb --prefill runs/c3-mbpp \
  --init $PREV --out runs/dflash-c3 $( [ -f runs/dflash-c3/train_state.pt ] && echo --resume ) \
  --block-size 8 --layers 2 --steps ${STEPS:-600} --batch-size 8 --anchors-per-seq 16 \
  --lr 3e-4 --gamma 4 --eval-every 150 --eval-rollouts 32 --save-dtype bfloat16
# 4. exact offline comparison on all 88 held-out rollouts
python -m specviz eval --drafters dflash:$PREV,dflash:runs/dflash-c3 --rollouts runs/eval-rollouts \
  --out results/dflash_c3_eval
# 5. bundle it and retrain the ReTrace fusion on it (~11 min; the step-40 checkpoint is bundled)
if [ "${BUNDLE:-0}" = 1 ]; then
  cp runs/dflash-c3/{config.json,model.safetensors,train_log.jsonl} \
    specviz/weights/dflash-smollm2-135m-instruct/
  python -m specviz train retrace --data runs/c3-gsm --data runs/c3-sb --data runs/c3-mbpp \
    --eval runs/eval-rollouts --out runs/retrace-c3 \
    $( [ -f runs/retrace-c3/train_state.pt ] && echo --resume ) \
    --steps 40 --batch-size 4 --anchors-per-seq 12 --lr 1e-4 --eval-every 10 --eval-sequences 32
  cp runs/retrace-c3/{config.json,model.safetensors,train_log.jsonl} \
    specviz/weights/retrace-smollm2-135m-instruct/
fi
