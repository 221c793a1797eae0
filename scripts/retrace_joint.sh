#!/usr/bin/env bash
# Issue 11: ReTrace with the backbone frozen vs fine-tuned jointly, from the bundled DFlash
# drafter, on the same data for the same steps (one torch thread each, run side by side).
# Needs runs/edr-rollouts and runs/eval-rollouts (scripts/make_training_data.sh steps 1 and 3).
# The held-out measure: round r+1's accepted length after a round with a rejected suffix
# (exact, greedy), with the fusion and with the gate off, on 32 held-out rollouts.
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
rt() {  # out [extra args]
  python -m specviz train retrace --data runs/edr-rollouts --eval runs/eval-rollouts --out "$1" \
    --steps 40 --batch-size 4 --anchors-per-seq 12 --lr 1e-4 --eval-every 10 \
    --eval-sequences 32 --seed 0 "${@:2}"
}
rt runs/rt-frozen > runs/rt-frozen.log 2>&1 &
rt runs/rt-joint --backbone-lr 2e-5 > runs/rt-joint.log 2>&1 &
wait
grep -h accepted runs/rt-frozen/train_log.jsonl runs/rt-joint/train_log.jsonl
