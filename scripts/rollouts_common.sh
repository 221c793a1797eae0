# Shared by the drafter recipes (sourced): the data folder, the tapped layers, the greedy
# 128-token rollout command R, and the 88 held-out rollouts (runs/eval-rollouts) for the exact
# simulated tau (scripts/make_training_data.sh step 1).
set -euo pipefail
. .venv/bin/activate
D=${SPECVIZ_DATA:-../shared/data}
L=1,8,14,20,27
R="python -m specviz train rollouts --max-new-tokens 128 --batch-size 24 --holdout 0 --layers $L"
[ -f runs/eval-rollouts/manifest.jsonl ] || python -m specviz train rollouts \
  --data $D/gsm8k_train.jsonl:1224 --exclude $D/gsm8k_train.jsonl:1200 \
  --data $D/mbpp.jsonl:924 --exclude $D/mbpp.jsonl:900 \
  --data $D/spec_bench_dev.jsonl:18 --exclude $D/spec_bench_dev.jsonl:10 \
  --out runs/eval-rollouts --max-new-tokens 128 --batch-size 24 --holdout 0.9999
# restore_bundled FOLDER COMMIT: the DFlash drafter bundled at COMMIT, into FOLDER (once)
restore_bundled() {
  if [ ! -f "$1/model.safetensors" ]; then
    mkdir -p "$1"
    for f in config.json model.safetensors; do
      git show "$2:specviz/weights/dflash-smollm2-135m-instruct/$f" > "$1/$f"
    done
  fi
}
