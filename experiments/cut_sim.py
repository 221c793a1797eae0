"""Simulated speed of block-drafter variants on held-out rollouts (offline replay, greedy).

    python experiments/cut_sim.py runs/eval-rollouts COST_JSON dflash:cut=block dflash:cut=auto ...

Cost of a prompt = sum over rounds of step * c(verified tokens + 1) + the measured drafting
time; AR cost = step per token. c and step come from COST_JSON (a saved CostModel), so every
variant is judged on one clock. tau is exact (greedy verification against the rollout).
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specviz.analysis.replay import replay  # noqa: E402
from specviz.costs import CostModel, pin_model  # noqa: E402
from specviz.drafters import make_drafter  # noqa: E402
from specviz.models import load_target  # noqa: E402
from specviz.train.rollout_store import RolloutSet  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapld_dev import parse_variant, trace_cost  # noqa: E402  (experiments/adapld_dev.py)


def main(folder: str, cost_json: str, variants: list[str]) -> None:
    rs = RolloutSet(folder)
    cost = CostModel.from_dict(json.loads(Path(cost_json).read_text()))
    target = load_target("default")
    pin_model(target, cost)
    step = cost.step_time
    cats = [r.get("category") or "?" for r in rs.rows]
    print("curve", [(k, round(cost.relative(k), 2)) for k in (1, 2, 4, 8)], "step",
          round(step * 1e3, 1), "ms")
    for v in variants:
        method, params = parse_variant(v)
        agg = defaultdict(lambda: [0, 0, 0.0, 0])  # tokens, rounds, cost, paused rounds
        for i in range(len(rs.rows)):
            d = make_drafter(method, target, **params)
            tr = replay(d, rs.rollout(i), target, token_texts=False)
            c = trace_cost(tr.rounds, cost)
            n = sum(len(x.committed) for x in tr.rounds)
            p = sum(1 for x in tr.rounds if (x.extras.get("cut") or {}).get("paused"))
            for key in (cats[i], "all"):
                a = agg[key]
                a[0] += n
                a[1] += len(tr.rounds)
                a[2] += c
                a[3] += p
        print(v, "  ".join(f"{k}: tau {a[0] / a[1]:.2f} {a[0] * step / a[2]:.2f}x paused "
                           f"{a[3] / a[1]:.0%}" for k, a in sorted(agg.items())), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
