#!/usr/bin/env bash
# Issue 12, EDR as the paper trains it: sampled acceptance at T = 1 (METHODS §4).
# 1. sampled target rollouts (temperature 1) that store p(y_t): held-out (the prompts of
#    runs/eval-rollouts) and training (prompts no bench, eval or earlier drafter used);
# 2. DFlash and DSpark (bundled DFlash + a zero rank-16 Markov head) fine-tuned with EDR and with
#    decay-CE from the same weights for the same steps, one torch thread each, two at a time;
# 3. offline comparison on the sampled held-out rollouts (sampled acceptance) and on the greedy
#    ones (runs/eval-rollouts from scripts/make_training_data.sh).
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
D=${SPECVIZ_DATA:-../shared/data}
OUT=${1:-results/edr_sampled}
mkdir -p "$OUT"
python -m specviz train rollouts --data $D/gsm8k_train.jsonl:1224 --exclude $D/gsm8k_train.jsonl:1200 \
  --data $D/mbpp.jsonl:924 --exclude $D/mbpp.jsonl:900 \
  --data $D/spec_bench_dev.jsonl:18 --exclude $D/spec_bench_dev.jsonl:10 \
  --out runs/eval-rollouts-t1 --max-new-tokens 128 --batch-size 24 --holdout 0.9999 \
  --temperature 1 --seed 1
python -m specviz train rollouts --data $D/gsm8k_train.jsonl:1500 --exclude $D/gsm8k_train.jsonl:1300 \
  --data $D/mbpp.jsonl:974 --exclude $D/mbpp.jsonl:930 \
  --data $D/spec_bench_dev.jsonl:30 --exclude $D/spec_bench_dev.jsonl:18 \
  --out runs/edr-rollouts-t1 --max-new-tokens 128 --batch-size 24 --holdout 0 \
  --temperature 1 --seed 0
ft() {  # objective out [extra args]
  OMP_NUM_THREADS=1 python -m specviz train finetune --objective "$1" \
    --init specviz/weights/dflash-smollm2-135m-instruct --rollouts runs/edr-rollouts-t1 \
    --eval runs/eval-rollouts-t1 --out "$2" --steps 80 --batch-size 4 --num-starts 48 --lr 2e-4 \
    --eval-every 40 --eval-rollouts 32 --seed 0 "${@:3}"
}
for obj in edr decay_ce; do
  ft $obj runs/ft1-$obj > runs/ft1-$obj.log 2>&1 &
  ft $obj runs/ds1-$obj --markov-rank 16 > runs/ds1-$obj.log 2>&1 &
  wait
done
DR=dflash,dflash:runs/ft1-decay_ce,dflash:runs/ft1-edr,dspark:runs/ds1-decay_ce,dspark:runs/ds1-edr
python -m specviz eval --drafters $DR --rollouts runs/eval-rollouts-t1 --out "$OUT/eval_t1"
python -m specviz eval --drafters $DR --rollouts runs/eval-rollouts --out "$OUT/eval_greedy"
