#!/usr/bin/env bash
# Short A/Bs of DFlash training choices (block 12 instead of 8, 3 layers instead of 2), judged
# on the exact simulated held-out tau. Every arm starts from the target's top layers
# (--init target) and trains on the same greedy replies (the DFlash recipe's stage-1 data,
# $WORK/more-rollouts + $WORK/edr-rollouts, made here when missing), the same steps, batch, lr
# and seed; only one choice differs from the baseline (block 8, 2 layers). One torch thread per
# run so other work can share a 2-core CPU. Then an exact offline eval of every arm on the 88
# held-out replies ($WORK/eval-rollouts).
#   bash experiments/ab_dflash.sh       # STEPS (400), OUT (runs/ab), RESULTS (results/dflash_ab)
. "$(dirname "$0")/../recipes/common.sh"
export OMP_NUM_THREADS=1
STEPS=${STEPS:-400}
OUT=${OUT:-$W/ab}
eval_rollouts
edr_rollouts
more_rollouts
arm() {  # name block layers
  $TRAIN dflash --rollouts "$W/eval-rollouts" --prefill "$W/more-rollouts" \
    --prefill "$W/edr-rollouts" --init target --out "$OUT/$1" --block-size "$2" --layers "$3" \
    --steps "$STEPS" --batch-size 8 --anchors-per-seq 16 --lr 8e-4 --gamma 4 --eval-every 200 \
    --eval-rollouts 32 --save-dtype bfloat16 --seed 0
}
arm b8-l2 8 2
arm b12-l2 12 2
arm b8-l3 8 3
python -m specviz eval --drafters "dflash:$OUT/b8-l2,dflash:$OUT/b12-l2,dflash:$OUT/b8-l3" \
  --rollouts "$W/eval-rollouts" --out "${RESULTS:-results/dflash_ab}"
