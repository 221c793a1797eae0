#!/usr/bin/env bash
# The DFlash drafter bundled for the embedded SmolLM2-135M-Instruct
# (specviz/weights/dflash-smollm2-135m-instruct: 2 layers, block 8, context from target layers
# 1, 8, 14, 20, 27), rebuilt from this tree alone. Seven training stages, each continuing the
# weights of the stage before it on more greedy replies of the target, then the forward gate's
# state probe fitted for the result:
#
#   0  from random weights: 670 replies (GSM8K, MBPP, Alpaca, Spec-Bench), 1,600 steps
#   1  + 1,080 replies (GSM8K 330-929, MBPP 180-399, Spec-Bench 28-79) and 164 more, 1,200 steps
#   2  + the 1,573 history-store replies re-tapped at the drafter's layers, 1,400 steps
#   3  + GSM8K rows 4600-5799 and replay of Spec-Bench 28-59 / MBPP 30-179, 600 steps
#   4  + GSM8K rows 5800-7472 and the same replay, 600 steps
#   5  + 1,200 dialogue prompts the target writes itself (Magpie), replay, 750 steps
#   6  from stage 5: 2,400 more Magpie replies, replay, the target's top-8 soft labels, 2,000 steps
#   probe  420 replies no stage trained on; the state probe; the artifact in $OUT
#
# Usage (repository root):
#   bash recipes/dflash.sh                        # every stage, in order
#   STAGES="5 6 probe" bash recipes/dflash.sh     # some stages (the earlier ones must exist)
#   INSTALL=1 bash recipes/dflash.sh              # and copy the result into specviz/weights/
# Settings: recipes/common.sh (DATA, WORK, THREADS, EVAL, INSTALL); OUT (default
# $WORK/dflash-smollm2-135m-instruct); STEPS0..STEPS6, each stage's steps (defaults above;
# STEPS0 a multiple of 400); SCHEDULE0 (2400), the length of stage 0's learning-rate schedule.
# Stage N is written to $WORK/dflash-stageN and, with EVAL=1, compared with stage N-1 on
# held-out replies in $WORK/eval/stageN. Every command resumes where it stopped when the
# recipe runs again.
# Times, data and held-out results of the bundled run: recipes/README.md.
. "$(dirname "$0")/common.sh"
STAGES=${STAGES:-0 1 2 3 4 5 6 probe}
OUT=${OUT:-$W/dflash-smollm2-135m-instruct}
STEPS0=${STEPS0:-1600}
SCHEDULE0=${SCHEDULE0:-2400}

stage() { echo "$W/dflash-stage$1"; }

# eval_stage N SET: stage N against stage N-1 on the held-out replies $WORK/SET (EVAL=1)
eval_stage() {
  eval_pair "$W/eval/stage$1/$2" "$W/$2" "dflash:$(stage $(($1 - 1)))" "dflash:$(stage "$1")"
}

# continue_stage N FROM STEPS LR EVAL_EVERY FOLDER... [-- EXTRA ARGS]: stage N = stage FROM
# trained STEPS more steps on the greedy replies in the FOLDERs (block 8, 2 layers, 8 replies x
# 16 anchors a step, slot weights decaying with gamma 4)
continue_stage() {
  local n=$1 init out steps=$3 lr=$4 every=$5 args=()
  init=$(stage "$2")
  out=$(stage "$1")
  shift 5
  while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=(--prefill "$W/$1"); shift; done
  [ $# -gt 0 ] && shift
  [ -f "$out/stage.done" ] && { say "stage $n done ($out)"; return 0; }
  $TRAIN dflash --rollouts "$W/eval-rollouts" "${args[@]}" --init "$init" --out "$out" \
    $(resume "$out") --block-size 8 --layers 2 --steps "$steps" --batch-size 8 \
    --anchors-per-seq 16 --lr "$lr" --gamma 4 --eval-every "$every" --eval-rollouts 32 \
    --save-dtype bfloat16 "$@"
  touch "$out/stage.done"
}

stage0() {
  local out
  out=$(stage 0)
  # 670 greedy 256-token replies (GSM8K rows 30-329, MBPP 30-179, Alpaca 25-174, Spec-Bench
  # rows 10-23 of each category); 5 % of them held out for the simulated tau
  $TRAIN rollouts --data "$D/gsm8k_train.jsonl:330" --data "$D/mbpp.jsonl:180" \
    --data "$D/alpaca_seed_tasks.jsonl" --data "$D/spec_bench_dev.jsonl:24" \
    --exclude "$D/gsm8k_train.jsonl:30" --exclude "$D/mbpp.jsonl:30" \
    --exclude "$D/alpaca_seed_tasks.jsonl:25" --exclude "$D/spec_bench_dev.jsonl:10" \
    --out "$W/first-rollouts" --max-new-tokens 256 --batch-size 24 --holdout 0.05
  [ -f "$out/stage.done" ] && { say "stage 0 done ($out)"; return 0; }
  # A cosine schedule over SCHEDULE0 steps, kept at its step-STEPS0 checkpoint (the bundled run's
  # held-out tau was flat from step 1200 on while its training loss kept falling): train until
  # that checkpoint is saved (with the eval every 400 steps), stop, then write it as the drafter
  # (--resume with --steps STEPS0: nothing is left to train).
  local args=(--rollouts "$W/first-rollouts" --out "$out" --block-size 8 --layers 2
              --save-dtype bfloat16)
  if ! grep -qs "\"step\": $STEPS0, \"eval_tau\"" "$out/train_log.jsonl"; then
    $TRAIN dflash "${args[@]}" $(resume "$out") --steps "$SCHEDULE0" --batch-size 8 \
      --anchors-per-seq 16 --lr 8e-4 --gamma 4 --eval-every 400 --eval-rollouts 32 &
    local pid=$! stopped=0
    until grep -qs "\"step\": $((STEPS0 + 10)), " "$out/train_log.jsonl"; do
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    if kill -0 "$pid" 2>/dev/null; then kill "$pid"; stopped=1; fi
    wait "$pid" || [ "$stopped" = 1 ]
  fi
  if [ "$SCHEDULE0" -gt "$STEPS0" ] &&
      grep -qs "\"step\": $((STEPS0 + 400)), \"eval_tau\"" "$out/train_log.jsonl"; then
    echo "stage 0 ran past step $STEPS0's checkpoint; remove $out and run again" >&2
    exit 1
  fi
  $TRAIN dflash "${args[@]}" --resume --steps "$STEPS0"
  touch "$out/stage.done"
}

stage1() {
  eval_rollouts
  edr_rollouts
  more_rollouts
  continue_stage 1 0 "${STEPS1:-1200}" 4e-4 200 more-rollouts edr-rollouts
  eval_stage 1 eval-rollouts
}

stage2() {
  eval_rollouts
  store_rollouts
  # the store's replies re-tapped at the drafter's five layers, one batched prefill each
  $TRAIN prefill --rollouts "$W/store-gsm" --rollouts "$W/store-mbpp" \
    --rollouts "$W/store-alpaca" --rollouts "$W/store-edit" --rollouts "$W/store-sb" \
    --out "$W/retap" --max-tokens 768
  continue_stage 2 1 "${STEPS2:-1400}" 4e-4 250 retap
  eval_stage 2 eval-rollouts
}

stage3() {
  eval_rollouts
  gsm 4600 5799
  replay_rollouts
  continue_stage 3 2 "${STEPS3:-600}" 3e-4 150 gsm-4600-5799 replay-sb replay-mbpp
  eval_stage 3 eval-rollouts
}

stage4() {
  eval_rollouts
  gsm 5800 7472
  replay_rollouts
  continue_stage 4 3 "${STEPS4:-600}" 3e-4 150 gsm-5800-7472 replay-sb replay-mbpp
  eval_stage 4 eval-rollouts
}

# Stages 5 and 6 add dialogue prompts the target writes itself (`magpie` in common.sh): 1,200 of
# seed 0 for stage 5, 2,400 of seed 2 for stage 6; 60 of seed 1 and 60 of seed 3 are held out.
stage5() {
  eval_rollouts
  magpie magpie-prompts 1200 0
  magpie magpie-eval 60 1 magpie-prompts
  # held out: Alpaca rows 150-174, the 60 Magpie prompts of seed 1
  $R --data "$D/alpaca_seed_tasks.jsonl" --exclude "$D/alpaca_seed_tasks.jsonl:150" \
    --out "$W/eval-alpaca"
  $R --data "$W/magpie-eval.jsonl" --out "$W/eval-magpie"
  replay_rollouts
  gsm 5800 6099
  $R --data "$W/magpie-prompts.jsonl" --out "$W/magpie-s0"
  continue_stage 5 4 "${STEPS5:-750}" 3e-4 150 magpie-s0 replay-sb replay-mbpp gsm-5800-6099 \
    alpaca-25-149
  for s in eval-rollouts eval-alpaca eval-magpie; do
    eval_stage 5 "$s"
  done
}

stage6() {
  eval_rollouts
  magpie_s2
  $R --data "$W/magpie-eval3.jsonl" --out "$W/eval-magpie3"
  replay_rollouts
  gsm 6100 6399
  local data=(magpie-s2 replay-sb replay-mbpp gsm-6100-6399 alpaca-25-149) folders=()
  for f in "${data[@]}"; do folders+=(--rollouts "$W/$f"); done
  # the target's top-8 next-token probabilities beside every training folder (soft labels)
  $TRAIN soft-labels "${folders[@]}"
  continue_stage 6 5 "${STEPS6:-2000}" 3e-4 500 "${data[@]}" -- --soft-weight 0.5
  for s in eval-rollouts eval-magpie3; do
    eval_stage 6 "$s"
  done
}

probe() {
  gate_probe_rollouts
  eval_stage 6 gate-probe
  mkdir -p "$OUT"
  cp "$(stage 6)"/{config.json,model.safetensors,train_log.jsonl} "$OUT/"
  # the forward gate's state probe, written beside the drafter (state_probe.safetensors)
  $TRAIN gate-probe --rollouts "$W/gate-probe" --checkpoint "$OUT"
  install_artifact "$OUT" dflash-smollm2-135m-instruct config.json model.safetensors \
    train_log.jsonl state_probe.safetensors
}

for s in $STAGES; do
  say "DFlash stage $s"
  case $s in
    0|1|2|3|4|5|6) "stage$s" ;;
    probe) probe ;;
    *) echo "unknown stage '$s' (0-6 or probe)" >&2; exit 2 ;;
  esac
done
