#!/usr/bin/env bash
# AdaPLD's bundled history store for the embedded model (issue 14): greedy replies on prompts
# that no bench and no AdaPLD dev set uses, then one count. About 45 min on a 2-core CPU
# (~50-85 tok/s of generation; the count takes seconds). Rollouts are resumable (run it again
# after an interruption); only the final .npz is committed. Run from the repository root.
#   bench prompts: Spec-Bench rows 0-9, GSM8K 0-29, MBPP 0-29, Alpaca 0-24, editing prompts
#                  from MBPP rows 700-719, 800-819, 900-919
#   dev prompts:   Spec-Bench rows 18-27, GSM8K 2000-2014 and 3000-3019, MBPP 400-419 and
#                  500-514, editing prompts from MBPP rows 600-639
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
D=${SPECVIZ_DATA:-../shared/data}
# one tapped layer only: the store needs the tokens, not the hidden states
R="python -m specviz train rollouts --max-new-tokens 128 --batch-size 24 --holdout 0 --layers 27"
$R --data $D/spec_bench_dev.jsonl:80 --exclude $D/spec_bench_dev.jsonl:28 --out runs/store-sb
$R --data $D/mbpp.jsonl:400 --exclude $D/mbpp.jsonl:30 --out runs/store-mbpp
$R --data $D/alpaca_seed_tasks.jsonl --exclude $D/alpaca_seed_tasks.jsonl:25 --out runs/store-alpaca
$R --data edit:$D/mbpp.jsonl:240:40 --out runs/store-edit
$R --data $D/gsm8k_train.jsonl:4600 --exclude $D/gsm8k_train.jsonl:4000 --out runs/store-gsm
python -m specviz train store \
  --rollouts runs/store-sb runs/store-mbpp runs/store-alpaca runs/store-edit runs/store-gsm \
  --out specviz/weights/history-smollm2-135m-instruct.npz \
  --model-name "SmolLM2-135M-Instruct (embedded)"
