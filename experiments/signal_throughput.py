"""Tokens of exact training signal per second on this machine: batched greedy generation
(rollouts) vs one batched prefill over reference texts (prefill labels).

    python experiments/signal_throughput.py --out results/signal/throughput.json
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install
from specviz.models import load_target  # noqa: E402
from specviz.train.prefill import load_pairs, make_prefill_set  # noqa: E402
from specviz.train.rollouts import generate_batch, parse_layers  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="../shared/data/gsm8k_train.jsonl")
    ap.add_argument("--skip", type=int, default=100, help="rows skipped (bench prompts)")
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    target = load_target("default")
    layers = parse_layers(None, target.model.config.num_hidden_layers)
    pairs = load_pairs(a.data)[a.skip:a.skip + a.n]
    with tempfile.TemporaryDirectory() as d:
        pf = make_prefill_set(target, pairs, d, layer_ids=layers)
        from specviz.train.rollout_store import RolloutSet
        rs = RolloutSet(d)
        exact = 0
        for i in range(len(rs)):
            from safetensors import safe_open
            r = rs.rows[i]
            with safe_open(f"{d}/{r['shard']}", framework="pt") as f:
                t = f.get_tensor(r["name"] + ".tokens").long()
                g = f.get_tensor(r["name"] + ".greedy").long()
            p = r["prompt_len"]
            exact += int((t[p:] == g[p - 1:-1]).sum())
    prompts = [target.encode_prompt(x.prompt) for x in pairs[:24]]
    t0 = time.perf_counter()
    res = generate_batch(target, prompts, 64, layers)
    gen_s = time.perf_counter() - t0
    gen_tok = sum(len(r) for r in res.replies)
    rec = {"threads": torch.get_num_threads(),
           "generation": {"prompts": len(prompts), "new_tokens": gen_tok, "seconds": round(gen_s, 2),
                          "signal_tokens_per_s": round(gen_tok / gen_s, 1),
                          "note": "every generated token is one labelled anchor with all B-1 slots exact"},
           "prefill": {"texts": pf["texts"], "tokens": pf["tokens"], "reply_tokens": pf["reply_tokens"],
                       "seconds": round(pf["seconds"], 2),
                       "tokens_per_s": round(pf["tokens_per_s"], 1),
                       "anchor_tokens_per_s": round(pf["reply_tokens"] / pf["seconds"], 1),
                       "text_follows_greedy": round(exact / max(1, pf["reply_tokens"]), 3),
                       "note": "every reply token is one anchor with slot 1 exact; slot k exact while the text follows greedy"}}
    print(json.dumps(rec, indent=2))
    if a.out:
        open(a.out, "w").write(json.dumps(rec, indent=2) + "\n")


if __name__ == "__main__":
    main()
