#!/usr/bin/env bash
# Issue 10, item 2: short A/Bs of DFlash training choices, judged on the exact simulated
# held-out tau. Every arm starts from the target's top layers (--init target) and trains on the
# same greedy rollouts (runs/more-rollouts + runs/edr-rollouts, see scripts/retrain_dflash.sh),
# the same steps, batch, lr and seed; only one choice differs from the baseline (block 8,
# 2 layers). One torch thread per run so other work can share the 2-core CPU.
# Then an exact offline eval of every arm on all 88 held-out rollouts (runs/eval-rollouts).
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
STEPS=${STEPS:-400}
OUT=${OUT:-runs/ab}
arm() {  # name block layers
  python -m specviz train dflash --rollouts runs/eval-rollouts \
    --prefill runs/more-rollouts --prefill runs/edr-rollouts --init target \
    --out $OUT/$1 --block-size $2 --layers $3 --steps $STEPS --batch-size 8 \
    --anchors-per-seq 16 --lr 8e-4 --gamma 4 --eval-every 200 --eval-rollouts 32 \
    --save-dtype bfloat16 --seed 0
}
arm b8-l2 8 2
arm b12-l2 12 2
arm b8-l3 8 3
python -m specviz eval --drafters dflash:$OUT/b8-l2,dflash:$OUT/b12-l2,dflash:$OUT/b8-l3 \
  --rollouts runs/eval-rollouts --out ${RESULTS:-results/dflash_ab}
