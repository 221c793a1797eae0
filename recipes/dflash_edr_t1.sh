#!/usr/bin/env bash
# The DFlash drafter fine-tuned for sampling, bundled as
# specviz/weights/dflash-edr-t1-smollm2-135m-instruct (`--param checkpoint=NAME`): the DFlash
# recipe's stage-0 drafter fine-tuned with EDR under sampled acceptance at temperature 1 (a
# drafted token y is kept with probability min(1, q(y)/p(y)), the target's p stored in the
# rollouts) on 304 replies sampled at T = 1, 80 steps; judged on 88 held-out replies sampled at
# T = 1 (the prompts of the greedy held-out set).
#
#   bash recipes/dflash_edr_t1.sh          # makes the DFlash stage 0 first when it is missing
#   INIT=FOLDER bash recipes/dflash_edr_t1.sh
#   INSTALL=1 bash recipes/dflash_edr_t1.sh
# Settings: recipes/common.sh (DATA, WORK, THREADS, EVAL, INSTALL); OUT (default
# $WORK/dflash-edr-t1-smollm2-135m-instruct); STEPS (default 80).
. "$(dirname "$0")/common.sh"
OUT=${OUT:-$W/dflash-edr-t1-smollm2-135m-instruct}
INIT=${INIT:-$(first_drafter)}
sampled_rollouts
finetune "$OUT" --objective edr --init "$INIT" --rollouts "$W/edr-rollouts-t1" \
  --eval "$W/eval-rollouts-t1" --eval-rollouts 32
eval_pair "$W/eval/dflash-edr-t1" "$W/eval-rollouts-t1" "dflash:$INIT" "dflash:$OUT"
install_artifact "$OUT" dflash-edr-t1-smollm2-135m-instruct config.json model.safetensors \
  finetune.json train_log.jsonl
