#!/usr/bin/env bash
# The DSpark drafter bundled for the embedded SmolLM2-135M-Instruct
# (specviz/weights/dspark-smollm2-135m-instruct): the DFlash recipe's stage-0 drafter plus a
# zero-initialised rank-16 Markov head, fine-tuned with EDR (the exact expected-rounds objective,
# acceptance relaxed to the drafter's probability) on 164 greedy replies for 80 steps, the head
# at 20x the learning rate; judged on all 88 held-out replies.
#
#   bash recipes/dspark.sh                 # makes the DFlash stage 0 first when it is missing
#   INIT=FOLDER bash recipes/dspark.sh     # start from another DFlash checkpoint
#   INSTALL=1 bash recipes/dspark.sh       # and copy the result into specviz/weights/
# Settings: recipes/common.sh (DATA, WORK, THREADS, EVAL, INSTALL); OUT (default
# $WORK/dspark-smollm2-135m-instruct); STEPS (default 80).
. "$(dirname "$0")/common.sh"
OUT=${OUT:-$W/dspark-smollm2-135m-instruct}
INIT=${INIT:-$(first_drafter)}
eval_rollouts
edr_rollouts
finetune "$OUT" --objective edr --init "$INIT" --markov-rank 16 --rollouts "$W/edr-rollouts" \
  --eval "$W/eval-rollouts" --eval-rollouts 88
eval_pair "$W/eval/dspark" "$W/eval-rollouts" "dflash:$INIT" "dspark:$OUT"
install_artifact "$OUT" dspark-smollm2-135m-instruct config.json model.safetensors \
  finetune.json train_log.jsonl
