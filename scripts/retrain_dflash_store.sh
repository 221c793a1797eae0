#!/usr/bin/env bash
# Issue 10, second continuation: the bundled DFlash drafter continued on the greedy rollouts
# that AdaPLD's history store is counted from (scripts/make_store.sh: 1,620 greedy replies,
# generated anyway, stored with one tapped layer), re-tapped at the drafter's five layers at
# prefill speed; then the ReTrace fusion retrained on the new backbone (issue 11 asks that the
# bundled fusion be the one trained on the bundled backbone). 2-core CPU timings in docs/dflash.md.
# Needs runs/store-* (scripts/make_store.sh, ~45 min) and runs/eval-rollouts
# (scripts/make_training_data.sh step 1, ~4 min). Bench / held-out / AdaPLD-dev prompts are
# excluded from the store's rollouts (see make_store.sh). Every step resumes when rerun.
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
# 1. re-tap the store's rollouts at layers 1, 8, 14, 20, 27 (one batched prefill each; ~16 min)
python -m specviz train prefill --rollouts runs/store-gsm --rollouts runs/store-mbpp \
  --rollouts runs/store-alpaca --rollouts runs/store-edit --rollouts runs/store-sb \
  --out runs/retap --max-tokens 768
# 2. continue the drafter bundled before this step (commit b44607b, restored from git)
PREV=runs/dflash-c1
if [ ! -f $PREV/model.safetensors ]; then
  mkdir -p $PREV
  for f in config.json model.safetensors; do
    git show b44607b:specviz/weights/dflash-smollm2-135m-instruct/$f > $PREV/$f
  done
fi
python -m specviz train dflash --rollouts runs/eval-rollouts --prefill runs/retap \
  --init $PREV --out runs/dflash-c2 $( [ -f runs/dflash-c2/train_state.pt ] && echo --resume ) \
  --block-size 8 --layers 2 --steps ${STEPS:-1400} --batch-size 8 --anchors-per-seq 16 \
  --lr 4e-4 --gamma 4 --eval-every 250 --eval-rollouts 32 --save-dtype bfloat16
# 3. exact offline comparison on all 88 held-out rollouts
python -m specviz eval --drafters dflash:$PREV,dflash:runs/dflash-c2 --rollouts runs/eval-rollouts \
  --out results/dflash_c2_eval
# 4. bundle it (cp runs/dflash-c2/{config.json,model.safetensors,train_log.jsonl}
#    specviz/weights/dflash-smollm2-135m-instruct/), then retrain the ReTrace fusion on the
#    bundled backbone (~11 min; the step-40 checkpoint is the bundled fusion):
if [ "${BUNDLE:-0}" = 1 ]; then
  cp runs/dflash-c2/{config.json,model.safetensors,train_log.jsonl} \
    specviz/weights/dflash-smollm2-135m-instruct/
  python -m specviz train retrace --data runs/retap --eval runs/eval-rollouts \
    --out runs/retrace-c2 $( [ -f runs/retrace-c2/train_state.pt ] && echo --resume ) \
    --steps 40 --batch-size 4 --anchors-per-seq 12 --lr 1e-4 --eval-every 10 --eval-sequences 32
fi
