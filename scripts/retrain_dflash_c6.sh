#!/usr/bin/env bash
# Issue 10, sixth continuation (twelfth session): the bundled drafter (c5) continued on twice
# as much Magpie dialogue as it had -- 2,400 new prompts the target writes itself (`train
# prompts --seed 2`, none equal to c5's seed-0 prompts or to the held-out seed-3 set), greedy
# replies -- plus replay (Spec-Bench rows 28-59 per category, MBPP rows 30-179, GSM8K rows
# 6100-6399, Alpaca rows 25-149) against forgetting. Held out: runs/eval-rollouts (GSM8K, MBPP,
# Spec-Bench), Alpaca rows 150-174 (runs/eval-alpaca; in the first drafter's training, in
# neither c5's nor c6's), 60 Magpie prompts of seed 3 (runs/eval-magpie3). Bench prompts
# (Spec-Bench rows 0-9, GSM8K 0-29, MBPP 0-29, Alpaca 0-24) are in no set. Every step resumes
# when rerun; BUNDLE=1 adds step 5. 2-core CPU timings in docs/dflash.md.
. "$(dirname "$0")/rollouts_common.sh"   # D, L, R; step 1: the held-out runs/eval-rollouts
P="python -m specviz train prompts"
# 1. (cont.) held-out dialogue: Alpaca rows 150-174; Magpie prompts of seed 3 (not in seed 0)
$R --data $D/alpaca_seed_tasks.jsonl --exclude $D/alpaca_seed_tasks.jsonl:150 --out runs/eval-alpaca
[ -f runs/magpie-prompts.jsonl ] || $P --count 1200 --seed 0 --out runs/magpie-prompts.jsonl
[ -f runs/magpie-eval3.jsonl ] || $P --count 60 --seed 3 --exclude runs/magpie-prompts.jsonl \
  --out runs/magpie-eval3.jsonl
$R --data runs/magpie-eval3.jsonl --out runs/eval-magpie3
# 2. training rollouts: new Magpie dialogue, then the replay sets (~200 new tokens/s)
[ -f runs/magpie-prompts2.jsonl ] || $P --count ${COUNT:-2400} --seed 2 \
  --exclude runs/magpie-prompts.jsonl --exclude runs/magpie-eval3.jsonl \
  --out runs/magpie-prompts2.jsonl
$R --data runs/magpie-prompts2.jsonl --out runs/c6-magpie
$R --data $D/spec_bench_dev.jsonl:60 --exclude $D/spec_bench_dev.jsonl:28 --out runs/c3-sb
$R --data $D/mbpp.jsonl:180 --exclude $D/mbpp.jsonl:30 --out runs/c3-mbpp
$R --data $D/gsm8k_train.jsonl:6400 --exclude $D/gsm8k_train.jsonl:6100 --out runs/c6-gsm
$R --data $D/alpaca_seed_tasks.jsonl:150 --exclude $D/alpaca_seed_tasks.jsonl:25 --out runs/c5-alpaca
# 3. continue the drafter bundled before this step (restored from git)
PREV=runs/dflash-c5
restore_bundled $PREV ${PREV_COMMIT:-bf358d6}
OUT=runs/dflash-c6
python -m specviz train dflash --rollouts runs/eval-rollouts --prefill runs/c6-magpie \
  --prefill runs/c3-sb --prefill runs/c3-mbpp --prefill runs/c6-gsm --prefill runs/c5-alpaca \
  --init $PREV --out $OUT $( [ -f $OUT/train_state.pt ] && echo --resume ) \
  --block-size 8 --layers 2 --steps ${STEPS:-750} --batch-size 8 --anchors-per-seq 16 \
  --lr 3e-4 --gamma 4 --eval-every 250 --eval-rollouts 32 --save-dtype bfloat16
# 4. exact offline comparison on the held-out sets
for S in eval-rollouts eval-alpaca eval-magpie3; do
  python -m specviz eval --drafters dflash:$PREV,dflash:$OUT --rollouts runs/$S --split all \
    --out results/dflash_c6_eval/$S
done
# 5. bundle it and retrain the ReTrace fusion on it, keeping the best held-out checkpoint
if [ "${BUNDLE:-0}" = 1 ]; then
  cp $OUT/{config.json,model.safetensors,train_log.jsonl} \
    specviz/weights/dflash-smollm2-135m-instruct/
  python -m specviz train retrace --data runs/c6-gsm --data runs/c3-sb --data runs/c3-mbpp \
    --data runs/c6-magpie --eval runs/eval-rollouts --out runs/retrace-c6 \
    $( [ -f runs/retrace-c6/train_state.pt ] && echo --resume ) \
    --steps 20 --batch-size 4 --anchors-per-seq 12 --lr 3e-5 --eval-every 5 --eval-sequences 32
  cp runs/retrace-c6/best/{config.json,model.safetensors} runs/retrace-c6/train_log.jsonl \
    specviz/weights/retrace-smollm2-135m-instruct/
fi
