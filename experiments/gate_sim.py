"""Forward-gate variants of the DFlash drafter, compared on one clock by offline replay.

    python experiments/gate_sim.py ROLLOUT_DIR [COST_JSON]

Replays the bundled drafter (cut="auto") on every greedy rollout in ROLLOUT_DIR with the gate
swapped for each variant: the bundled ``ForwardGate`` (three-round prior, decay 0.9 per drafted
round, a paying probe restarts from the prior) and :class:`AgedGate` variants (below). Speed =
AR cost / cost, with cost = every round's verify forward on the saved curve (COST_JSON, written
on first use after a 3 s calibration) plus the measured drafting time, as experiments/cut_sim.py
does; tau is exact.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import specviz.drafters.dflash.drafter as dflash_mod  # noqa: E402
from adapld_dev import trace_cost  # noqa: E402
from specviz.analysis.replay import replay  # noqa: E402
from specviz.costs import CostModel, calibrate, pin_model  # noqa: E402
from specviz.drafters import make_drafter  # noqa: E402
from specviz.drafters.dflash.block_cut import ForwardGate  # noqa: E402
from specviz.drafters.probes import PROBE_GAPS  # noqa: E402
from specviz.models import load_target  # noqa: E402
from specviz.train.rollout_store import RolloutSet  # noqa: E402


@dataclass
class AgedGate(ForwardGate):
    """The variant tried against the bundled gate: evidence decayed per round of TEXT (paused
    rounds age it too), a probe folded into the aged sums and judged with them (no reset to
    the prior), and optionally (``resume``) a restart from the prior when a probe switches the
    drafter back on."""

    decay: float = 0.8
    last_round: int | None = None
    resume: tuple | None = None

    def observe(self, round_index: int, committed: int, cost: float) -> None:
        age = 1 if self.last_round is None else max(1, round_index - self.last_round)
        w = self.decay ** age
        self.tokens, self.cost = w * self.tokens + committed, w * self.cost + cost
        self.last_round = round_index
        if self.off:
            self.probed(round_index, self.rate >= 1.0, PROBE_GAPS)
            if not self.off and self.resume:
                self.tokens, self.cost = self.resume[0] + committed, self.resume[1] + cost
        elif self.rate < 1.0:
            self.pause(round_index + 1, PROBE_GAPS)


def variants():
    yield "bundled ForwardGate", ForwardGate
    yield "aged p1.25/1 d0.8", lambda: AgedGate(tokens=1.25, cost=1.0, decay=0.8)
    for decay in (0.8, 0.9):
        yield f"aged+resume p7.5/6 d{decay}", (lambda decay=decay: AgedGate(
            tokens=7.5, cost=6.0, decay=decay, resume=(7.5, 6.0)))
    yield "aged+resume p2.5/2 d0.9", lambda: AgedGate(tokens=2.5, cost=2.0, decay=0.9,
                                                       resume=(2.5, 2.0))


def main(folder: str, cost_json: str = "runs/gate_sim_clock.json") -> None:
    rs = RolloutSet(folder)
    target = load_target("default")
    if Path(cost_json).exists():
        cost = CostModel.from_dict(json.loads(Path(cost_json).read_text()))
    else:
        cost = calibrate(target, budget_s=3.0)
        Path(cost_json).write_text(json.dumps(cost.to_dict()))
    pin_model(target, cost)
    step = cost.step_time
    print("curve", [(k, round(cost.relative(k), 2)) for k in (1, 2, 4, 8)], "step",
          round(step * 1e3, 1), "ms", flush=True)
    cats = [r.get("category") or "?" for r in rs.rows]
    for name, gate in variants():
        agg = defaultdict(lambda: [0, 0, 0.0, 0])   # tokens, rounds, cost, paused rounds
        dflash_mod.ForwardGate = gate
        for i in range(len(rs.rows)):
            tr = replay(make_drafter("dflash", target, cut="auto"), rs.rollout(i), target,
                        token_texts=False)
            n = sum(len(x.committed) for x in tr.rounds)
            p = sum(1 for x in tr.rounds if (x.extras.get("cut") or {}).get("paused"))
            for key in (cats[i], "all"):
                a = agg[key]
                a[0], a[1], a[2], a[3] = a[0] + n, a[1] + len(tr.rounds), \
                    a[2] + trace_cost(tr.rounds, cost), a[3] + p
        print(f"{name:20s}", "  ".join(f"{k}: {a[0] / a[1]:.2f} {a[0] * step / a[2]:.3f}x "
                                       f"paused {a[3] / a[1]:.0%}" for k, a in sorted(agg.items())),
              flush=True)
    dflash_mod.ForwardGate = ForwardGate


if __name__ == "__main__":
    main(*sys.argv[1:3])
