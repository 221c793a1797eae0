"""Prefill time of a 1,000-token prompt with the LM head on the last row only (specviz's
default) and on every row (before): docs/cpu-verify.md, "Two costs nobody asked for". Median of 6
sessions per mode, alternating. Run from the repository root:

    python experiments/prefill_ms.py
"""
from __future__ import annotations

import json
import statistics
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # OpenMP waiting as `python -m specviz`
os.environ.setdefault("GOMP_SPINCOUNT", "20000")     # sets it, before torch loads
import torch  # noqa: E402

import specviz.engine as engine  # noqa: E402
from specviz.drafters import make_drafter  # noqa: E402
from specviz.engine import DecodeSettings, Session  # noqa: E402
from specviz.models import load_target  # noqa: E402


def main(n: int = 1000) -> None:
    target = load_target("default")
    ids = torch.randint(100, 40000, (n,), generator=torch.Generator().manual_seed(0)).tolist()
    keep = engine.accepts_logits_to_keep
    ms: dict[str, list[float]] = {"last row": [], "every row": []}
    for mode in ("last row", "every row") * 2:
        engine.accepts_logits_to_keep = keep if mode == "last row" else (lambda model: False)
        for _ in range(3):
            s = Session(target, make_drafter("ar", target), ids, DecodeSettings(max_new_tokens=1))
            ms[mode].append(1000 * s.prefill_time)
    engine.accepts_logits_to_keep = keep
    print(json.dumps({"prompt_tokens": n, "prefill_ms": {k: round(statistics.median(v), 1)
                                                         for k, v in ms.items()}}))


if __name__ == "__main__":
    main()
