#!/usr/bin/env bash
# Issue 10, fifth continuation (eleventh session): the bundled DFlash drafter continued on
# dialogue the target writes itself -- Magpie prompts (`train prompts`: its chat template up to a
# user turn, sampled) with greedy replies -- plus replay of what it was trained on (Spec-Bench
# rows 28-59 per category, MBPP rows 30-179, GSM8K rows 5800-6099, Alpaca rows 25-149) against
# forgetting. Held out: runs/eval-rollouts (GSM8K, MBPP, Spec-Bench), Alpaca rows 150-174
# (runs/eval-alpaca) and 60 Magpie prompts of another seed (runs/eval-magpie). Bench prompts
# (Spec-Bench rows 0-9, GSM8K 0-29, MBPP 0-29, Alpaca 0-24) are in no set. Every step resumes
# when rerun; BUNDLE=1 adds step 5. 2-core CPU timings in docs/dflash.md.
. "$(dirname "$0")/rollouts_common.sh"   # D, L, R; step 1: the held-out runs/eval-rollouts
# 1. (cont.) held-out dialogue: Alpaca rows 150-174, Magpie prompts of another seed
$R --data $D/alpaca_seed_tasks.jsonl --exclude $D/alpaca_seed_tasks.jsonl:150 --out runs/eval-alpaca
[ -f runs/magpie-prompts.jsonl ] || python -m specviz train prompts --count 1200 --seed 0 \
  --out runs/magpie-prompts.jsonl
[ -f runs/magpie-eval.jsonl ] || python -m specviz train prompts --count 60 --seed 1 \
  --exclude runs/magpie-prompts.jsonl --out runs/magpie-eval.jsonl
$R --data runs/magpie-eval.jsonl --out runs/eval-magpie
# 2. training rollouts: replay sets, then the Magpie dialogue (~150 new tokens/s)
$R --data $D/spec_bench_dev.jsonl:60 --exclude $D/spec_bench_dev.jsonl:28 --out runs/c3-sb
$R --data $D/mbpp.jsonl:180 --exclude $D/mbpp.jsonl:30 --out runs/c3-mbpp
$R --data $D/gsm8k_train.jsonl:6100 --exclude $D/gsm8k_train.jsonl:5800 --out runs/c5-gsm
$R --data $D/alpaca_seed_tasks.jsonl:150 --exclude $D/alpaca_seed_tasks.jsonl:25 --out runs/c5-alpaca
$R --data runs/magpie-prompts.jsonl --out runs/c5-magpie
# 3. continue the drafter bundled before this step (restored from git)
PREV=runs/dflash-c4
restore_bundled $PREV ${PREV_COMMIT:-8f1ef54}
OUT=runs/dflash-c5
python -m specviz train dflash --rollouts runs/eval-rollouts --prefill runs/c5-magpie \
  --prefill runs/c3-sb --prefill runs/c3-mbpp --prefill runs/c5-gsm --prefill runs/c5-alpaca \
  --init $PREV --out $OUT $( [ -f $OUT/train_state.pt ] && echo --resume ) \
  --block-size 8 --layers 2 --steps ${STEPS:-600} --batch-size 8 --anchors-per-seq 16 \
  --lr 3e-4 --gamma 4 --eval-every 150 --eval-rollouts 32 --save-dtype bfloat16
# 4. exact offline comparison on the held-out sets
for S in eval-rollouts eval-alpaca eval-magpie; do
  python -m specviz eval --drafters dflash:$PREV,dflash:$OUT --rollouts runs/$S --split all \
    --out results/dflash_c5_eval/$S
done
# 5. bundle it and retrain the ReTrace fusion on it, keeping the best held-out checkpoint
#    (OUT/best: at lr 1e-4 the held-out round r+1 accepted fell from the first eval on)
if [ "${BUNDLE:-0}" = 1 ]; then
  cp $OUT/{config.json,model.safetensors,train_log.jsonl} \
    specviz/weights/dflash-smollm2-135m-instruct/
  python -m specviz train retrace --data runs/c5-gsm --data runs/c3-sb --data runs/c3-mbpp \
    --data runs/c5-magpie --eval runs/eval-rollouts --out runs/retrace-c5b \
    $( [ -f runs/retrace-c5b/train_state.pt ] && echo --resume ) \
    --steps 20 --batch-size 4 --anchors-per-seq 12 --lr 3e-5 --eval-every 5 --eval-sequences 32
  cp runs/retrace-c5b/best/{config.json,model.safetensors} runs/retrace-c5b/train_log.jsonl \
    specviz/weights/retrace-smollm2-135m-instruct/
fi
