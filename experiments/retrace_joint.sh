#!/usr/bin/env bash
# ReTrace with the backbone frozen vs fine-tuned jointly (--backbone-lr 2e-5), on the same 164
# greedy replies for the same steps, one torch thread each, side by side; the backbone is the
# DFlash recipe's stage-0 drafter (BACKBONE; made when missing). The held-out measure: round
# r+1's accepted length after a round with a rejected suffix (exact, greedy), with the fusion and
# with the gate off, on 32 held-out replies, in the two training logs (copied to RESULTS,
# default results/retrace_joint).
#   bash experiments/retrace_joint.sh          # BACKBONE, RESULTS, WORK, DATA
. "$(dirname "$0")/../recipes/common.sh"
export OMP_NUM_THREADS=1
BACKBONE=${BACKBONE:-$(first_drafter)}
eval_rollouts
edr_rollouts
rt() {  # out [extra args]
  $TRAIN retrace --backbone "$BACKBONE" --data "$W/edr-rollouts" --eval "$W/eval-rollouts" \
    --out "$1" --steps 40 --batch-size 4 --anchors-per-seq 12 --lr 1e-4 --eval-every 10 \
    --eval-sequences 32 --seed 0 "${@:2}" > "$1.log" 2>&1
}
rt "$W/rt-frozen" &
a=$!
rt "$W/rt-joint" --backbone-lr 2e-5 &
b=$!
wait $a
wait $b
grep -h accepted "$W/rt-frozen/train_log.jsonl" "$W/rt-joint/train_log.jsonl"
RESULTS=${RESULTS:-results/retrace_joint}
mkdir -p "$RESULTS"
for r in rt-frozen rt-joint; do cp "$W/$r/train_log.jsonl" "$RESULTS/$r.train_log.jsonl"; done
