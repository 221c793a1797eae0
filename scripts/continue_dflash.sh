#!/usr/bin/env bash
# Issue 10: continue the bundled DFlash drafter on fresh greedy GSM8K rollouts of the target
# (rows GSM_FROM..GSM_TO-1, never used by any drafter, bench, held-out or dev set) plus replayed
# replies it was trained on (Spec-Bench rows 28-59 per category, MBPP rows 30-179: against
# forgetting), tapped at the drafter's five layers while they are generated. Bench / held-out /
# dev prompts are excluded (see scripts/make_store.sh). Called by retrain_dflash_c3.sh and
# retrain_dflash_c4.sh, which set TAG, GSM_FROM, GSM_TO, PREV (folder of the drafter to
# continue) and PREV_COMMIT (the commit whose bundled drafter that is). Every step resumes when
# rerun; BUNDLE=1 adds step 5. 2-core CPU timings in docs/dflash.md.
: "${TAG:?}" "${GSM_FROM:?}" "${GSM_TO:?}" "${PREV:?}" "${PREV_COMMIT:?}"
. "$(dirname "$0")/rollouts_common.sh"   # D, L, R; step 1: the held-out runs/eval-rollouts
# 2. training rollouts (~140 new tokens/s): fresh GSM8K, then the replay sets
$R --data $D/gsm8k_train.jsonl:$GSM_TO --exclude $D/gsm8k_train.jsonl:$GSM_FROM --out runs/$TAG-gsm
$R --data $D/spec_bench_dev.jsonl:60 --exclude $D/spec_bench_dev.jsonl:28 --out runs/c3-sb
$R --data $D/mbpp.jsonl:180 --exclude $D/mbpp.jsonl:30 --out runs/c3-mbpp
# 3. continue the drafter bundled before this step (restored from git)
restore_bundled $PREV $PREV_COMMIT
OUT=runs/dflash-$TAG
python -m specviz train dflash --rollouts runs/eval-rollouts --prefill runs/$TAG-gsm \
  --prefill runs/c3-sb --prefill runs/c3-mbpp \
  --init $PREV --out $OUT $( [ -f $OUT/train_state.pt ] && echo --resume ) \
  --block-size 8 --layers 2 --steps ${STEPS:-600} --batch-size 8 --anchors-per-seq 16 \
  --lr 3e-4 --gamma 4 --eval-every 150 --eval-rollouts 32 --save-dtype bfloat16
# 4. exact offline comparison on all 88 held-out rollouts
python -m specviz eval --drafters dflash:$PREV,dflash:$OUT --rollouts runs/eval-rollouts \
  --out results/dflash_${TAG}_eval
# 5. bundle it and retrain the ReTrace fusion on it (~8-11 min; the step-40 checkpoint is bundled)
if [ "${BUNDLE:-0}" = 1 ]; then
  cp $OUT/{config.json,model.safetensors,train_log.jsonl} \
    specviz/weights/dflash-smollm2-135m-instruct/
  python -m specviz train retrace --data runs/$TAG-gsm --data runs/c3-sb --data runs/c3-mbpp \
    --eval runs/eval-rollouts --out runs/retrace-$TAG \
    $( [ -f runs/retrace-$TAG/train_state.pt ] && echo --resume ) \
    --steps 40 --batch-size 4 --anchors-per-seq 12 --lr 1e-4 --eval-every 10 --eval-sequences 32
  cp runs/retrace-$TAG/{config.json,model.safetensors,train_log.jsonl} \
    specviz/weights/retrace-smollm2-135m-instruct/
fi
