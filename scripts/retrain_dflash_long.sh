#!/usr/bin/env bash
# Issue 10: are the training data under-used? The bundled drafter (scripts/ab_soft_labels.sh:
# c5 continued 750 steps x 8 sequences x 16 anchors, soft weight 0.5) saw each of the ~350k
# reply anchors ~0.3 times. This run repeats its recipe exactly -- same data, init (c5), seed,
# lr, batch, soft labels -- with 2,000 steps (one cosine cycle over them, ~0.8 passes), judged
# by the exact simulated tau on the held-out sets as every drafter in the README. Two torch
# threads (one run). BUNDLE=1 bundles it, refits the forward gate's state probe and retrains the
# ReTrace fusion on it (as ab_soft_labels.sh's step 4). Every step resumes.
set -euo pipefail
. .venv/bin/activate
OUT=runs/dflash-long
OLD=${OLD:-runs/dflash-soft0.5}      # the drafter bundled before this run
DATA="--prefill runs/c6-magpie --prefill runs/c3-sb --prefill runs/c3-mbpp --prefill runs/c6-gsm \
  --prefill runs/c5-alpaca"
# 1. the run (soft labels beside the folders: step 1 of ab_soft_labels.sh)
OMP_NUM_THREADS=2 python -m specviz train dflash --rollouts runs/eval-rollouts $DATA \
  --init runs/dflash-c5 --out $OUT $( [ -f $OUT/train_state.pt ] && echo --resume ) \
  --soft-weight 0.5 --block-size 8 --layers 2 --steps ${STEPS:-2000} --batch-size 8 \
  --anchors-per-seq 16 --lr 3e-4 --gamma 4 --eval-every 500 --eval-rollouts 32 \
  --save-dtype bfloat16 > runs/long.log 2>&1
# 2. exact offline comparison with the drafter bundled before, on the held-out sets
for S in eval-rollouts eval-magpie3 gate-probe; do
  python -m specviz eval --drafters dflash:$OLD,dflash:$OUT --rollouts runs/$S --split all \
    --out results/dflash_long_eval/$S
done
# 3. bundle; refit the state probe; retrain the ReTrace fusion on the new backbone
if [ "${BUNDLE:-0}" = 1 ]; then
  W=specviz/weights/dflash-smollm2-135m-instruct
  cp $OUT/{config.json,model.safetensors,train_log.jsonl} $W/
  python -m specviz train gate-probe --rollouts runs/gate-probe
  python -m specviz train retrace --data runs/c6-gsm --data runs/c3-sb --data runs/c3-mbpp \
    --data runs/c6-magpie --eval runs/eval-rollouts --out runs/retrace-long \
    $( [ -f runs/retrace-long/train_state.pt ] && echo --resume ) \
    --steps 20 --batch-size 4 --anchors-per-seq 12 --lr 3e-5 --eval-every 5 --eval-sequences 32
  cp runs/retrace-long/best/{config.json,model.safetensors} runs/retrace-long/train_log.jsonl \
    specviz/weights/retrace-smollm2-135m-instruct/
fi
