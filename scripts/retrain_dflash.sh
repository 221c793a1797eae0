#!/usr/bin/env bash
# Issue 10: the bundled DFlash drafter continued on more greedy rollouts (2-core CPU timings in
# the README). Bench prompts (the first 10 per Spec-Bench category, 30 GSM8K, 30 MBPP, 25 Alpaca),
# the held-out rollouts and the AdaPLD dev rows are excluded. Needs runs/eval-rollouts and
# runs/edr-rollouts from scripts/make_training_data.sh (steps 1 and 3). Outputs in runs/.
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
D=${SPECVIZ_DATA:-../shared/data}
# 1. 1,080 more greedy replies (GSM8K rows 330-929, MBPP 180-399, Spec-Bench rows 28-79 of each
#    category), 128 new tokens, tapped hidden states (~25 min here)
python -m specviz train rollouts \
  --data $D/gsm8k_train.jsonl:930 --exclude $D/gsm8k_train.jsonl:330 \
  --data $D/mbpp.jsonl:400 --exclude $D/mbpp.jsonl:180 \
  --data $D/spec_bench_dev.jsonl:80 --exclude $D/spec_bench_dev.jsonl:28 \
  --out runs/more-rollouts --max-new-tokens 128 --batch-size 24 --holdout 0
# 2. continue the FIRST bundled drafter (the weights before this retraining, taken from git
#    history: the bundled folder now holds the result) on them + the 164 EDR rollouts; the
#    simulated held-out tau is measured on runs/eval-rollouts (all of it is the eval split)
OLD=runs/dflash-old
if [ ! -f $OLD/model.safetensors ]; then
  mkdir -p $OLD
  for f in config.json model.safetensors; do
    git show e3d290a:specviz/weights/dflash-smollm2-135m-instruct/$f > $OLD/$f
  done
fi
python -m specviz train dflash --rollouts runs/eval-rollouts \
  --prefill runs/more-rollouts --prefill runs/edr-rollouts \
  --init $OLD --out runs/dflash-c1 \
  --block-size 8 --layers 2 --steps ${STEPS:-1200} --batch-size 8 --anchors-per-seq 16 \
  --lr 4e-4 --gamma 4 --eval-every 200 --eval-rollouts 32 --save-dtype bfloat16
# 3. exact offline comparison on all 88 held-out rollouts
python -m specviz eval --drafters dflash,dflash:runs/dflash-c1 --rollouts runs/eval-rollouts \
  --out results/dflash_c1_eval
