"""The verify-cost curve c(k) of the embedded target and the DFlash drafter's forward, in one
process (issue 10: what the packed / fused linears change). Run once per kernel setting:

    SPECVIZ_LINEAR=default python scripts/verify_curve.py
    python scripts/verify_curve.py            # the measured kernels (the default)

Prints one JSON line: the load's kernel choice, the one-token step (ms), c(k) for k in 2..64
(median paired ratios, 3 s of forwards per k) and the drafter's block forward (ms, median).
"""
from __future__ import annotations

import json
import statistics
import time

import torch

from specviz.costs import calibrate
from specviz.drafters import make_drafter
from specviz.models import load_target


def drafter_ms(target, repeats: int = 30) -> float:
    d = make_drafter("dflash", target, cut="off")
    ids = [int(t) for t in target.tokenizer("def add(a, b):\n    return a + b\n" * 12)["input_ids"]]
    with torch.inference_mode():
        out = target.model(input_ids=torch.tensor([ids[:-1]]), output_hidden_states=True)
    d.begin(target, ids, out.hidden_states)
    d.block_logits(ids)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        d.block_logits(ids)
        ts.append(time.perf_counter() - t0)
    return 1000 * statistics.median(ts)


def main() -> None:
    target = load_target("default")
    cm = calibrate(target, budget_s=3.0)
    print(json.dumps({
        "kernels": target.kernels.summary() if target.kernels else "default linear kernels",
        "tune_s": round(target.kernels.tune_s, 2) if target.kernels else 0.0,
        "step_ms": round(1000 * cm.step_time, 1),
        "c": {int(k): round(float(c), 2) for k, c in cm.points if k > 1},
        "dflash_forward_ms": round(drafter_ms(target), 1)}))


if __name__ == "__main__":
    main()
