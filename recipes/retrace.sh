#!/usr/bin/env bash
# The ReTrace fusion bundled for the embedded SmolLM2-135M-Instruct
# (specviz/weights/retrace-smollm2-135m-instruct): the fusion trained on a frozen DFlash backbone
# -- the bundled drafter unless BACKBONE names another checkpoint -- for 20 steps at lr 3e-5,
# judged every 5 steps on held-out consecutive rounds; the best held-out checkpoint is kept, the
# untrained fusion (step 0, which drafts exactly what its backbone drafts) included.
#
#   bash recipes/retrace.sh                  # on the bundled DFlash drafter
#   INSTALL=1 bash recipes/retrace.sh        # and copy the result into specviz/weights/
# A fusion belongs to its backbone: after rebuilding the DFlash drafter, install it first
# (INSTALL=1 bash recipes/dflash.sh), then run this recipe. With BACKBONE=FOLDER the fusion's
# config names that folder instead of "bundled".
# Settings: recipes/common.sh (DATA, WORK, THREADS, INSTALL); OUT (default
# $WORK/retrace-smollm2-135m-instruct); STEPS (default 20). The training data are the DFlash
# recipe's stage-6 folders; missing ones are made here. Resumes when run again.
. "$(dirname "$0")/common.sh"
OUT=${OUT:-$W/retrace-smollm2-135m-instruct}
RUN=$W/retrace-run
eval_rollouts
magpie_s2
replay_rollouts
gsm 6100 6399
$TRAIN retrace --data "$W/gsm-6100-6399" --data "$W/replay-sb" --data "$W/replay-mbpp" \
  --data "$W/magpie-s2" --eval "$W/eval-rollouts" --out "$RUN" $(resume "$RUN") \
  ${BACKBONE:+--backbone "$BACKBONE"} --steps "${STEPS:-20}" --batch-size 4 \
  --anchors-per-seq 12 --lr 3e-5 --eval-every 5 --eval-sequences 32
mkdir -p "$OUT"
cp "$RUN"/best/{config.json,model.safetensors} "$RUN/train_log.jsonl" "$OUT/"
install_artifact "$OUT" retrace-smollm2-135m-instruct config.json model.safetensors \
  train_log.jsonl
