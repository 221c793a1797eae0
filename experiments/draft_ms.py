"""Median drafter time of a drafted DFlash round (Round.t_draft) on real prompts of two kinds:
short (GSM8K rows 7400-7403) and long (Spec-Bench dev summarization / rag rows 12-14 of their
kind, 665-1376 tokens), cut="block" (every round drafted), 64 new tokens: the drafter's own
cost. Compare settings with the environment:

    W=float python experiments/draft_ms.py     # the checkpoint's float32 weights
    W=auto  python experiments/draft_ms.py     # int8 where measured faster (the default)
"""
from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # OpenMP waiting as `python -m specviz`
os.environ.setdefault("GOMP_SPINCOUNT", "20000")     # sets it, before torch loads
from specviz.drafters import make_drafter  # noqa: E402
from specviz.engine import DecodeSettings, Session  # noqa: E402
from specviz.models import load_target  # noqa: E402

DATA = Path(os.environ.get("SPECVIZ_DATA", Path(__file__).resolve().parents[2] / "shared/data"))


def prompts() -> dict[str, list[str]]:
    gsm = [json.loads(x)["question"] for x in open(DATA / "gsm8k_train.jsonl")][7400:7404]
    sb = [json.loads(x) for x in open(DATA / "spec_bench_dev.jsonl")]
    long = [r["turns"][0] for r in sb if r.get("category") in ("summarization", "rag")][12:15]
    return {"gsm8k": gsm, "long": long}


def main() -> None:
    target = load_target("default")
    d = make_drafter("dflash", target, cut="block", weights=os.environ.get("W", "auto"))
    s = DecodeSettings(max_new_tokens=64)
    ps = prompts()
    Session(target, d, ps["gsm8k"][0], s, method="dflash").run()   # warm-up
    out = {"weights": d.weights}
    for name, group in ps.items():
        t, n = [], []
        for p in group:
            tr = Session(target, d, p, s, method="dflash").run()
            t += [r.t_draft for r in tr.rounds if r.t_draft > 0.001]
            n.append(len(tr.prompt_ids))
        out[name] = {"t_draft_ms": round(1000 * statistics.median(t), 2), "rounds": len(t),
                     "prompt_tokens": n}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
