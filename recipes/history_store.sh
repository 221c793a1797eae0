#!/usr/bin/env bash
# AdaPLD's history store bundled for the embedded SmolLM2-135M-Instruct
# (specviz/weights/history-smollm2-135m-instruct.npz): the target's most frequent next token
# per one- to three-token context, and an index of how its replies open, counted from 1,620 of
# its greedy replies to prompts no bench and no AdaPLD dev set uses (store_rollouts in
# recipes/common.sh). The replies take most of the time; the count, seconds.
#
#   bash recipes/history_store.sh
#   INSTALL=1 bash recipes/history_store.sh     # and copy the result into specviz/weights/
# Settings: recipes/common.sh (DATA, WORK, THREADS, INSTALL); OUT (default
# $WORK/history-smollm2-135m-instruct.npz).
. "$(dirname "$0")/common.sh"
OUT=${OUT:-$W/history-smollm2-135m-instruct.npz}
store_rollouts
$TRAIN store --rollouts "$W/store-sb" "$W/store-mbpp" "$W/store-alpaca" "$W/store-edit" \
  "$W/store-gsm" --out "$OUT" --model-name "SmolLM2-135M-Instruct (embedded)"
if [ "$INSTALL" = 1 ]; then
  cp "$OUT" "$BUNDLE_DIR/history-smollm2-135m-instruct.npz"
  say "installed into $BUNDLE_DIR/history-smollm2-135m-instruct.npz"
else
  say "built $OUT (INSTALL=1 copies it to $BUNDLE_DIR/)"
fi
