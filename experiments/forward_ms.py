"""Target forward time over k new tokens on a 300-token cache (the OpenMP-waiting table of the
CPU verify-cost notes). Median of 21 after 3 warm-ups; prints the load's kernel choice, ms per k
and c(k) = ms(k) / ms(1). Run with the environment to compare, e.g.

    GOMP_SPINCOUNT=0 python experiments/forward_ms.py      # passive waiting (sleep at once)
    python experiments/forward_ms.py                       # specviz's default bounded spin
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # OpenMP waiting as `python -m specviz`
os.environ.setdefault("GOMP_SPINCOUNT", "20000")     # sets it, before torch loads
import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from specviz.models import load_target  # noqa: E402


def forward_ms(model, k: int, context: int = 300, repeats: int = 21) -> float:
    g = torch.Generator().manual_seed(0)
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.randint(0, 49000, (1, context), generator=g), past_key_values=cache,
              use_cache=True)
        x = torch.randint(0, 49000, (1, k), generator=g)
        ts = []
        for i in range(repeats + 3):
            t0 = time.perf_counter()
            model(input_ids=x, past_key_values=cache, use_cache=True)
            cache.crop(-k)
            if i >= 3:
                ts.append(time.perf_counter() - t0)
    return 1000 * sorted(ts)[len(ts) // 2]


def main() -> None:
    target = load_target("default")
    ms = {k: forward_ms(target.model, k) for k in (1, 2, 4, 8)}
    print(json.dumps({"GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT"),
                      "kernels": target.kernels.summary() if target.kernels else None,
                      "ms": {k: round(v, 1) for k, v in ms.items()},
                      "c": {k: round(v / ms[1], 2) for k, v in ms.items()}}))


if __name__ == "__main__":
    main()
