"""The verify-cost curve with and without the CPU GQA attention (specviz.attention), same process.

    python experiments/attention_ab.py [RUNS]

Loads the embedded target (dtype auto, as the app and bench do), then alternates RUNS times
(default 3): calibrate (3 s) with specviz's GQA attention, calibrate with transformers' SDPA.
Prints each curve; logits are equal either way (tests/test_attention.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specviz.attention import ATTENTION  # noqa: E402
from specviz.costs import calibrate  # noqa: E402
from specviz.models import load_target  # noqa: E402


def main(runs: int = 3) -> None:
    target = load_target()
    for _ in range(runs):
        for impl in (ATTENTION, "sdpa"):
            target.model.set_attn_implementation(impl)
            m = calibrate(target, budget_s=3.0)
            print(f"{impl:<18} step {m.step_time * 1e3:5.1f} ms  "
                  + "  ".join(f"c({k}) {c:.2f}" for k, c in m.points()), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
