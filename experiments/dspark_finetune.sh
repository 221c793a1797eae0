#!/usr/bin/env bash
# EDR against decay-CE, for DFlash and for DSpark (the same drafter + a zero-initialised rank-16
# Markov head): four fine-tunes of the DFlash recipe's stage-0 drafter (INIT) on the same 164
# greedy replies for the same 80 steps, one torch thread each (6.5 min each on a 2-core CPU),
# into $WORK/ft-{edr,decay_ce} (DFlash) and $WORK/ds-{edr,decay_ce} (DSpark); then all five
# drafters offline on the 88 held-out replies (RESULTS, default results/finetune_dspark). The
# EDR DSpark is the recipe of the bundled one (recipes/dspark.sh); experiments/finetune_bench.sh
# benches the four.
#   bash experiments/dspark_finetune.sh     # INIT (default: stage 0, made when missing), RESULTS
. "$(dirname "$0")/../recipes/common.sh"
export OMP_NUM_THREADS=1
INIT=${INIT:-$(first_drafter)}
eval_rollouts
edr_rollouts
for obj in edr decay_ce; do
  finetune "$W/ft-$obj" --objective $obj --init "$INIT" --rollouts "$W/edr-rollouts" \
    --eval "$W/eval-rollouts" --eval-rollouts 88
  finetune "$W/ds-$obj" --objective $obj --init "$INIT" --markov-rank 16 \
    --rollouts "$W/edr-rollouts" --eval "$W/eval-rollouts" --eval-rollouts 88
done
DR="dflash:$INIT,dflash:$W/ft-decay_ce,dflash:$W/ft-edr,dspark:$W/ds-decay_ce,dspark:$W/ds-edr"
python -m specviz eval --drafters "$DR" --rollouts "$W/eval-rollouts" --out "${RESULTS:-results/finetune_dspark}"
