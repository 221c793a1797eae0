#!/usr/bin/env bash
# Issue 10, item 1: do the target's soft labels (its top-k next-token probabilities, `train
# soft-labels`) make a better drafter from the same text? Both arms repeat the c6 recipe exactly
# (scripts/retrain_dflash_c6.sh, step 3: c5 continued 750 steps on the same rollouts, same
# seed, lr, batch) and differ only in --soft-weight; the c6 drafter itself is the hard-label arm
# (soft weight 0). Judged by the exact simulated tau on the held-out sets (runs/eval-rollouts,
# runs/eval-magpie3, and runs/gate-probe: 420 replies to prompts in no drafter's training), as
# every drafter in the README. One torch thread per arm, two arms at once. BUNDLE=1 adds step 4.
set -euo pipefail
. .venv/bin/activate
DATA="--prefill runs/c6-magpie --prefill runs/c3-sb --prefill runs/c3-mbpp --prefill runs/c6-gsm \
  --prefill runs/c5-alpaca"
# 1. soft labels (top-8) beside every training folder (~600 tokens/s; resumes)
python -m specviz train soft-labels --rollouts runs/c6-magpie --rollouts runs/c3-sb \
  --rollouts runs/c3-mbpp --rollouts runs/c6-gsm --rollouts runs/c5-alpaca
# 2. the arms (c5 restored from git by retrain_dflash_c6.sh)
arm() {  # soft-weight
  OUT=runs/dflash-soft$1
  OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 python -m specviz train dflash \
    --rollouts runs/eval-rollouts $DATA --init runs/dflash-c5 --out $OUT \
    $( [ -f $OUT/train_state.pt ] && echo --resume ) --soft-weight $1 \
    --block-size 8 --layers 2 --steps ${STEPS:-750} --batch-size 8 --anchors-per-seq 16 \
    --lr 3e-4 --gamma 4 --eval-every 250 --eval-rollouts 32 --save-dtype bfloat16 \
    > runs/soft$1.log 2>&1
}
for W in ${WEIGHTS:-0.5 1.0}; do arm $W & done
wait
# 3. exact offline comparison on the held-out sets
ARMS=$(for W in ${WEIGHTS:-0.5 1.0}; do printf ",dflash:runs/dflash-soft%s" $W; done)
for S in eval-rollouts eval-magpie3; do
  python -m specviz eval --drafters dflash:runs/dflash-c6$ARMS --rollouts runs/$S --split all \
    --out results/dflash_soft_eval/$S
done
python -m specviz eval --drafters dflash:runs/dflash-c6,dflash:runs/dflash-soft0.5 \
  --rollouts runs/gate-probe --split all --out results/dflash_soft_eval/gate-probe
# 4. bundle the soft-weight-0.5 drafter; retrain the ReTrace fusion on it (as the c6 recipe's
#    step 5) and refit the forward gate's state probe for its weights (scripts/make_gate_probe_data.sh)
if [ "${BUNDLE:-0}" = 1 ]; then
  W=specviz/weights/dflash-smollm2-135m-instruct
  cp runs/dflash-soft0.5/{config.json,model.safetensors,train_log.jsonl} $W/
  python -m specviz train gate-probe --rollouts runs/gate-probe
  python -m specviz train retrace --data runs/c6-gsm --data runs/c3-sb --data runs/c3-mbpp \
    --data runs/c6-magpie --eval runs/eval-rollouts --out runs/retrace-soft \
    $( [ -f runs/retrace-soft/train_state.pt ] && echo --resume ) \
    --steps 20 --batch-size 4 --anchors-per-seq 12 --lr 3e-5 --eval-every 5 --eval-sequences 32
  cp runs/retrace-soft/best/{config.json,model.safetensors} runs/retrace-soft/train_log.jsonl \
    specviz/weights/retrace-smollm2-135m-instruct/
fi
