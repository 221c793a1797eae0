#!/usr/bin/env bash
# Rollouts for drafter training, specviz's generator (hidden states tapped while generating)
# against vLLM's batched offline engine plus one specviz prefill for the hidden states: 64
# GSM8K prompts, greedy, 128 new tokens, back to back; then whether the replies are identical.
#   bash experiments/served_rollouts.sh [OUT]      # default OUT: runs/served_rollouts
set -euo pipefail
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE
D=${SPECVIZ_DATA:-../shared/data}/gsm8k_train.jsonl:64
OUT=${1:-runs/served_rollouts}
rm -rf "$OUT/specviz" "$OUT/vllm"
echo "== specviz"; time python -m specviz train rollouts --data "$D" --max-new-tokens 128 --out "$OUT/specviz" --holdout 0
echo "== vllm"; time python -m specviz train rollouts --engine vllm --data "$D" --max-new-tokens 128 --out "$OUT/vllm" --holdout 0
python - "$OUT" <<'PY'
import sys
from specviz.train.rollout_store import RolloutSet
a, b = RolloutSet(sys.argv[1] + "/specviz"), RolloutSet(sys.argv[1] + "/vllm")
where = {r["key"]: i for i, r in enumerate(a.rows)}
same = sum(a.load(where[r["key"]])[0].tolist() == b.load(j)[0].tolist() for j, r in enumerate(b.rows))
print(f"identical prompt + reply: {same} of {len(b.rows)}")
PY
