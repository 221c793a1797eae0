#!/usr/bin/env bash
# EDR as the paper trains it: sampled acceptance at T = 1.
# 1. replies sampled at temperature 1 that store p(y_t): held out (the prompts of
#    $WORK/eval-rollouts) and training (prompts no bench, eval or earlier drafter used);
# 2. DFlash and DSpark (the DFlash recipe's stage-0 drafter, INIT, + a zero rank-16 Markov head)
#    fine-tuned with EDR and with decay-CE from the same weights for the same steps, one torch
#    thread each, two at a time, into $WORK/ft1-* and $WORK/ds1-*;
# 3. offline comparison on the sampled held-out replies (sampled acceptance, OUT/eval_t1) and on
#    the greedy ones ($WORK/eval-rollouts, OUT/eval_greedy).
# The DFlash EDR fine-tune is the recipe of the bundled dflash-edr-t1 (recipes/dflash_edr_t1.sh);
# experiments/finetune_bench_t1.sh benches the four.
#   bash experiments/edr_sampled.sh [OUT]     # default OUT: results/edr_sampled
. "$(dirname "$0")/../recipes/common.sh"
OUT=${1:-results/edr_sampled}
INIT=${INIT:-$(first_drafter)}
mkdir -p "$OUT"
eval_rollouts
sampled_rollouts
ft() {  # out [extra args]
  OMP_NUM_THREADS=1 finetune "$1" --objective "$obj" --init "$INIT" \
    --rollouts "$W/edr-rollouts-t1" --eval "$W/eval-rollouts-t1" --eval-rollouts 32 "${@:2}"
}
for obj in edr decay_ce; do
  ft "$W/ft1-$obj" > "$W/ft1-$obj.log" 2>&1 &
  a=$!
  ft "$W/ds1-$obj" --markov-rank 16 > "$W/ds1-$obj.log" 2>&1 &
  b=$!
  wait $a
  wait $b
done
DR="dflash:$INIT,dflash:$W/ft1-decay_ce,dflash:$W/ft1-edr,dspark:$W/ds1-decay_ce,dspark:$W/ds1-edr"
python -m specviz eval --drafters "$DR" --rollouts "$W/eval-rollouts-t1" --out "$OUT/eval_t1"
python -m specviz eval --drafters "$DR" --rollouts "$W/eval-rollouts" --out "$OUT/eval_greedy"
