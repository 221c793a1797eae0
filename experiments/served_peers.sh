#!/usr/bin/env bash
# The served peers on the same prompts in one run: vLLM plain decoding and vLLM ngram speculation
# (two local servers, `python -m specviz serve-vllm`), beside specviz's AR, PLD and AdaPLD;
# then vLLM's throughput at 1, 4 and 16 requests in flight. Greedy, 64 new tokens, the example
# prompts (4 per category). Start it on a quiet machine: nothing else should run.
#   bash experiments/served_peers.sh [OUT]       # default OUT: results/served_peers
set -euo pipefail
. .venv/bin/activate
OUT=${1:-results/served_peers}
mkdir -p "$OUT"
python -m specviz serve-vllm --port 8123 --log "$OUT/vllm-ngram.log" & NGRAM=$!
python -m specviz serve-vllm --port 8124 --speculative none --log "$OUT/vllm-ar.log" & PLAIN=$!
trap 'kill $NGRAM $PLAIN 2>/dev/null; wait' EXIT   # TERM: serve-vllm stops vLLM too
for port in 8123 8124; do
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 2; done
done
python -m specviz bench --methods ar,pld,adapld --data examples/prompts.jsonl:4 \
  --max-new-tokens 64 --endpoint vllm-ar=http://127.0.0.1:8124 \
  --endpoint vllm-ngram=http://127.0.0.1:8123 --concurrency 1,4,16 --out "$OUT"
rm -f "$OUT"/vllm-*.log
