#!/usr/bin/env bash
# Stage 6's data used three ways: does more of the target's own dialogue help, and do its soft
# labels (its top-8 next-token probabilities, `train soft-labels`) make a better drafter from the
# same text? Every arm continues stage 5 of recipes/dflash.sh for 750 steps on stage 6's data
# (2,400 Magpie replies of seed 2 + replay; same seed, lr, batch) and differs only in
# --soft-weight: 0 (hard labels only), 0.5 and 1.0. One torch thread per arm, the arms at once.
# Judged by the exact simulated tau on held-out replies:
#   1. the hard-label arm against stage 5 on $WORK/eval-rollouts, eval-alpaca and eval-magpie3
#      (RESULTS_HARD, default results/dflash_c6_eval);
#   2. every arm on $WORK/eval-rollouts and eval-magpie3, and the hard arm against weight 0.5 on
#      $WORK/gate-probe (420 replies to prompts in no drafter's training) (RESULTS, default
#      results/dflash_soft_eval).
#   bash experiments/ab_soft_labels.sh       # WEIGHTS ("0 0.5 1.0"), STEPS (750), WORK, DATA
# Makes recipes/dflash.sh's stages 0-5 and the held-out sets first when they are missing.
. "$(dirname "$0")/../recipes/common.sh"
WEIGHTS=${WEIGHTS:-0 0.5 1.0}
RESULTS=${RESULTS:-results/dflash_soft_eval}
RESULTS_HARD=${RESULTS_HARD:-results/dflash_c6_eval}
BASE=$W/dflash-stage5
[ -f "$BASE/stage.done" ] || STAGES="0 1 2 3 4 5" bash recipes/dflash.sh
eval_rollouts
magpie_s2
$R --data "$W/magpie-eval3.jsonl" --out "$W/eval-magpie3"
$R --data "$D/alpaca_seed_tasks.jsonl" --exclude "$D/alpaca_seed_tasks.jsonl:150" \
  --out "$W/eval-alpaca"
gate_probe_rollouts
replay_rollouts
gsm 6100 6399
DATA_ARGS=() LABEL_ARGS=()
for f in magpie-s2 replay-sb replay-mbpp gsm-6100-6399 alpaca-25-149; do
  DATA_ARGS+=(--prefill "$W/$f")
  LABEL_ARGS+=(--rollouts "$W/$f")
done
# 1. soft labels (top-8) beside every training folder (~600 tokens/s; resumes)
$TRAIN soft-labels "${LABEL_ARGS[@]}"
# 2. the arms
arm() {  # soft-weight
  local out=$W/dflash-soft$1
  OMP_NUM_THREADS=1 $TRAIN dflash --rollouts "$W/eval-rollouts" "${DATA_ARGS[@]}" \
    --init "$BASE" --out "$out" $(resume "$out") --soft-weight "$1" --block-size 8 --layers 2 \
    --steps "${STEPS:-750}" --batch-size 8 --anchors-per-seq 16 --lr 3e-4 --gamma 4 \
    --eval-every 250 --eval-rollouts 32 --save-dtype bfloat16 > "$W/soft$1.log" 2>&1
}
pids=()
for w in $WEIGHTS; do arm "$w" & pids+=($!); done
for p in "${pids[@]}"; do wait "$p"; done
# 3. exact offline comparisons on the held-out sets
for s in eval-rollouts eval-alpaca eval-magpie3; do
  python -m specviz eval --drafters "dflash:$BASE,dflash:$W/dflash-soft0" --rollouts "$W/$s" \
    --split all --out "$RESULTS_HARD/$s"
done
ARMS=$(for w in $WEIGHTS; do printf ",dflash:%s/dflash-soft%s" "$W" "$w"; done)
for s in eval-rollouts eval-magpie3; do
  python -m specviz eval --drafters "${ARMS#,}" --rollouts "$W/$s" --split all --out "$RESULTS/$s"
done
python -m specviz eval --drafters "dflash:$W/dflash-soft0,dflash:$W/dflash-soft0.5" \
  --rollouts "$W/gate-probe" --split all --out "$RESULTS/gate-probe"
