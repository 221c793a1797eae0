# Sourced by every recipe: settings, the virtualenv, and the data sets the recipes share (each a
# function that makes one folder of greedy target rollouts under $WORK; `train rollouts` resumes
# an interrupted folder and skips a finished one, so every function may run again).
#
# Settings (environment):
#   DATA     prompt files (default ../shared/data, or $SPECVIZ_DATA); read in place, never copied
#   WORK     working folder for rollouts, stages and evals (default runs/, git-ignored)
#   THREADS  torch / OpenMP threads (default: torch's choice, all cores)
#   EVAL     1 (default): the exact offline eval of each stage against the one before it
#   INSTALL  1: copy the finished artifact into specviz/weights/ (default 0: $WORK only)
set -euo pipefail
shopt -s inherit_errexit   # a failing command inside $(...) fails the recipe too
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
[ -f .venv/bin/activate ] && . .venv/bin/activate
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"   # see specviz/__main__.py
[ -n "${THREADS:-}" ] && export OMP_NUM_THREADS="$THREADS"
D=${DATA:-${SPECVIZ_DATA:-../shared/data}}
W=${WORK:-runs}
EVAL=${EVAL:-1}
INSTALL=${INSTALL:-0}
BUNDLE_DIR=specviz/weights
mkdir -p "$W"
TRAIN="python -m specviz train"
# greedy 128-token replies, tapped at the DFlash drafter's five target layers while generated
R="$TRAIN rollouts --max-new-tokens 128 --batch-size 24 --holdout 0 --layers 1,8,14,20,27"

say() { echo "[recipe] $*"; }

# resume FOLDER: "--resume" when FOLDER holds an interrupted training run
resume() { [ -f "$1/train_state.pt" ] && echo --resume || true; }

# eval_pair OUT ROLLOUTS A B: exact offline comparison of drafters A and B (e.g. dflash:FOLDER)
# on every rollout of ROLLOUTS, into OUT (EVAL=1)
eval_pair() {
  [ "$EVAL" = 1 ] || return 0
  [ -f "$1/eval.json" ] && return 0
  python -m specviz eval --drafters "$3,$4" --rollouts "$2" --split all --out "$1"
}

# install SRC DEST FILES...: copy FILES of SRC into specviz/weights/DEST (INSTALL=1)
install_artifact() {
  local src=$1 dest=$BUNDLE_DIR/$2
  shift 2
  [ "$INSTALL" = 1 ] || { say "built in $src (INSTALL=1 copies it to $dest)"; return 0; }
  mkdir -p "$dest"
  for f in "$@"; do cp "$src/$f" "$dest/"; done
  say "installed into $dest"
}

# The 88 held-out replies every drafter is judged on (GSM8K rows 1200-1223, MBPP rows 900-923,
# Spec-Bench dev rows 10-17 of each category): all in the eval split.
eval_rollouts() {
  [ -f "$W/eval-rollouts/manifest.jsonl" ] || $TRAIN rollouts \
    --data "$D/gsm8k_train.jsonl:1224" --exclude "$D/gsm8k_train.jsonl:1200" \
    --data "$D/mbpp.jsonl:924" --exclude "$D/mbpp.jsonl:900" \
    --data "$D/spec_bench_dev.jsonl:18" --exclude "$D/spec_bench_dev.jsonl:10" \
    --out "$W/eval-rollouts" --max-new-tokens 128 --batch-size 24 --holdout 0.9999
}

# 164 greedy training replies (GSM8K rows 1300-1379, MBPP 930-973, Spec-Bench rows 18-25 of each
# category): the first continued drafter's data and the EDR / DSpark fine-tunes' data.
edr_rollouts() {
  $TRAIN rollouts --data "$D/gsm8k_train.jsonl:1380" --exclude "$D/gsm8k_train.jsonl:1300" \
    --data "$D/mbpp.jsonl:974" --exclude "$D/mbpp.jsonl:930" \
    --data "$D/spec_bench_dev.jsonl:26" --exclude "$D/spec_bench_dev.jsonl:18" \
    --out "$W/edr-rollouts" --max-new-tokens 128 --batch-size 24 --holdout 0
}

# 1,080 greedy training replies (GSM8K rows 330-929, MBPP 180-399, Spec-Bench rows 28-79 of each
# category): the DFlash drafter's stage-1 data
more_rollouts() {
  $TRAIN rollouts --data "$D/gsm8k_train.jsonl:930" --exclude "$D/gsm8k_train.jsonl:330" \
    --data "$D/mbpp.jsonl:400" --exclude "$D/mbpp.jsonl:180" \
    --data "$D/spec_bench_dev.jsonl:80" --exclude "$D/spec_bench_dev.jsonl:28" \
    --out "$W/more-rollouts" --max-new-tokens 128 --batch-size 24 --holdout 0
}

# 1,620 greedy replies on prompts no bench and no AdaPLD dev set uses (Spec-Bench rows 28-79,
# MBPP 30-399, Alpaca 25-174, 240 code-editing prompts from MBPP rows 40-279, GSM8K 4000-4599),
# stored with one tapped layer: AdaPLD's history store is counted from them and the DFlash
# drafter's stage 2 re-taps them.
store_rollouts() {
  local S="$TRAIN rollouts --max-new-tokens 128 --batch-size 24 --holdout 0 --layers 27"
  $S --data "$D/spec_bench_dev.jsonl:80" --exclude "$D/spec_bench_dev.jsonl:28" --out "$W/store-sb"
  $S --data "$D/mbpp.jsonl:400" --exclude "$D/mbpp.jsonl:30" --out "$W/store-mbpp"
  $S --data "$D/alpaca_seed_tasks.jsonl" --exclude "$D/alpaca_seed_tasks.jsonl:25" \
    --out "$W/store-alpaca"
  $S --data "edit:$D/mbpp.jsonl:240:40" --out "$W/store-edit"
  $S --data "$D/gsm8k_train.jsonl:4600" --exclude "$D/gsm8k_train.jsonl:4000" --out "$W/store-gsm"
}

# magpie NAME COUNT SEED [EXCLUDED NAME...]: COUNT dialogue prompts the target writes itself
# (`train prompts`, sampled with SEED), none equal to a prompt of the excluded files
magpie() {
  local name=$1 count=$2 seed=$3 ex=()
  shift 3
  for e in "$@"; do ex+=(--exclude "$W/$e.jsonl"); done
  [ -f "$W/$name.jsonl" ] || $TRAIN prompts --count "$count" --seed "$seed" "${ex[@]}" \
    --out "$W/$name.jsonl"
}

# gsm FIRST LAST: greedy replies to GSM8K rows FIRST..LAST, in $WORK/gsm-FIRST-LAST
gsm() {
  $R --data "$D/gsm8k_train.jsonl:$(($2 + 1))" --exclude "$D/gsm8k_train.jsonl:$1" \
    --out "$W/gsm-$1-$2"
}

# Replies the DFlash drafter was trained on in its first stages, replayed in later ones against
# forgetting: Spec-Bench rows 28-59 of each category, MBPP rows 30-179, Alpaca rows 25-149.
replay_rollouts() {
  $R --data "$D/spec_bench_dev.jsonl:60" --exclude "$D/spec_bench_dev.jsonl:28" \
    --out "$W/replay-sb"
  $R --data "$D/mbpp.jsonl:180" --exclude "$D/mbpp.jsonl:30" --out "$W/replay-mbpp"
  $R --data "$D/alpaca_seed_tasks.jsonl:150" --exclude "$D/alpaca_seed_tasks.jsonl:25" \
    --out "$W/alpaca-25-149"
}

# The Magpie prompt files: 1,200 of seed 0, 60 of seed 3 (held out) and 2,400 of seed 2, each
# excluding the prompts of the files before it; magpie_s2 adds the 2,400's greedy replies
# ($WORK/magpie-s2).
magpie_s2_prompts() {
  magpie magpie-prompts 1200 0
  magpie magpie-eval3 60 3 magpie-prompts
  magpie magpie-prompts2 2400 2 magpie-prompts magpie-eval3
}
magpie_s2() {
  magpie_s2_prompts
  $R --data "$W/magpie-prompts2.jsonl" --out "$W/magpie-s2"
}

# first_drafter: the DFlash recipe's stage 0, the drafter the EDR fine-tunes start from (made by
# `STAGES=0 bash recipes/dflash.sh` when missing); prints its folder
first_drafter() {
  [ -f "$W/dflash-stage0/stage.done" ] || STAGES=0 bash recipes/dflash.sh >&2
  echo "$W/dflash-stage0"
}

# finetune RUN ARGS...: `train finetune` into RUN (80 steps of 4 rollouts x 48 round starts, lr
# 2e-4, seed 0 unless ARGS say otherwise); skipped when RUN is finished. No resume: an
# interrupted fine-tune starts again.
finetune() {
  local run=$1
  shift
  [ -f "$run/finetune.json" ] && { say "fine-tune done ($run)"; return 0; }
  $TRAIN finetune --out "$run" --steps "${STEPS:-80}" --batch-size 4 --num-starts 48 --lr 2e-4 \
    --eval-every 40 --seed 0 "$@"
}

# 420 greedy replies to prompts in no DFlash stage's training and no held-out set (Spec-Bench
# rows 60-79 of each category, GSM8K 6400-6479, MBPP 600-679, 160 Magpie prompts of seed 4): the
# forward gate's state probe is fitted on them; $WORK/gate-probe
gate_probe_rollouts() {
  magpie_s2_prompts
  magpie magpie-probe4 160 4 magpie-prompts magpie-prompts2 magpie-eval3
  $R --data "$D/spec_bench_dev.jsonl:80" --exclude "$D/spec_bench_dev.jsonl:60" \
    --data "$D/gsm8k_train.jsonl:6480" --exclude "$D/gsm8k_train.jsonl:6400" \
    --data "$D/mbpp.jsonl:680" --exclude "$D/mbpp.jsonl:600" \
    --data "$W/magpie-probe4.jsonl" --out "$W/gate-probe"
}

# Replies sampled at temperature 1, storing the target's p(y): $WORK/eval-rollouts-t1 (held out:
# the prompts of $WORK/eval-rollouts, seed 1) and $WORK/edr-rollouts-t1 (training: GSM8K rows
# 1300-1499, MBPP 930-973, Spec-Bench rows 18-29 of each category, seed 0)
sampled_rollouts() {
  local s="--max-new-tokens 128 --batch-size 24 --temperature 1"
  $TRAIN rollouts --data "$D/gsm8k_train.jsonl:1224" --exclude "$D/gsm8k_train.jsonl:1200" \
    --data "$D/mbpp.jsonl:924" --exclude "$D/mbpp.jsonl:900" \
    --data "$D/spec_bench_dev.jsonl:18" --exclude "$D/spec_bench_dev.jsonl:10" \
    --out "$W/eval-rollouts-t1" --holdout 0.9999 --seed 1 $s
  $TRAIN rollouts --data "$D/gsm8k_train.jsonl:1500" --exclude "$D/gsm8k_train.jsonl:1300" \
    --data "$D/mbpp.jsonl:974" --exclude "$D/mbpp.jsonl:930" \
    --data "$D/spec_bench_dev.jsonl:30" --exclude "$D/spec_bench_dev.jsonl:18" \
    --out "$W/edr-rollouts-t1" --holdout 0 --seed 0 $s
}
