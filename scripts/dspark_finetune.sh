#!/usr/bin/env bash
# Issue 12: DSpark (the bundled DFlash drafter + a zero-initialised rank-16 Markov head)
# fine-tuned with EDR and with decay-CE from the same weights for the same steps, one torch
# thread (6.5 min each on the 2-core CPU). Needs runs/edr-rollouts and runs/eval-rollouts
# (scripts/make_training_data.sh). The DFlash pair: the same command without --markov-rank.
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
for obj in edr decay_ce; do
python -m specviz train finetune --objective $obj --init specviz/weights/dflash-smollm2-135m-instruct \
  --markov-rank 16 --rollouts runs/edr-rollouts --eval runs/eval-rollouts --out runs/ds-$obj \
  --steps 80 --batch-size 4 --num-starts 48 --lr 2e-4 --eval-every 40 --eval-rollouts 88 --seed 0
done
