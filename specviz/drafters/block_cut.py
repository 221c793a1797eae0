"""Draft length that pays for itself, for block drafters (issue 10, item 3; METHODS §1).

A block drafter (DFlash) fills all its slots in one forward, but verifying a slot is not free on
a CPU: a target forward over k + 1 tokens costs c(k + 1) one-token forwards
(:mod:`specviz.costs`, measured on the loaded model). So only the prefix of the block whose
expected accepted tokens pay for the extra verify cost is sent to the target:

    E_k = sum_{j <= k} prod_{i <= j} p_i,     k* = argmax_k (1 + E_k) / (c(k + 1) + d)

with p_i the drafter's confidence in slot i (its top probability) times a per-slot calibration
factor learned online (accepted / confidence over the rounds that reached the slot: drafters are
rarely calibrated), and d the drafter's own forward in one-token-forward units (paid whatever
is kept). k* = 0 means a plain decoding step. Verification is unchanged, so output is too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..costs import CostModel

DECAY = 0.95     # per round, for the calibration sums
P_MAX = 0.995


@dataclass
class BlockCut:
    """Chooses how many of a block's slots to verify (see the module docstring)."""

    cost: CostModel
    acc: list[float] = field(default_factory=list)   # decayed accepted count per slot
    conf: list[float] = field(default_factory=list)  # decayed confidence sum per slot
    draft_cost: float = 0.0                          # drafter forward, in one-token forwards

    def factor(self, i: int) -> float:
        a = self.acc[i] if i < len(self.acc) else 0.0
        c = self.conf[i] if i < len(self.conf) else 0.0
        return (a + 1.0) / (c + 1.0)

    def expected(self, confidence: Sequence[float]) -> list[float]:
        """E_k for k = 0 .. len(confidence)."""
        out, surv = [0.0], 1.0
        for i, c in enumerate(confidence):
            surv *= min(P_MAX, max(0.0, float(c) * self.factor(i)))
            out.append(out[-1] + surv)
        return out

    def choose(self, confidence: Sequence[float]) -> tuple[int, list[float]]:
        """(slots to keep, expected committed tokens per unit of cost for each k)."""
        e = self.expected(confidence)
        value = [(1.0 + e[k]) / (self.cost.relative(k + 1) + self.draft_cost)
                 for k in range(len(e))]
        best = max(range(len(value)), key=lambda k: (value[k], -k))
        return best, value

    def observe(self, confidence: Sequence[float], kept: int, accepted: int,
                draft_s: float = 0.0) -> None:
        """Learn from a verified round: slots 1..accepted+1 of the kept prefix were reached."""
        n = len(confidence)
        while len(self.acc) < n:
            self.acc.append(0.0)
            self.conf.append(0.0)
        self.acc = [a * DECAY for a in self.acc]
        self.conf = [c * DECAY for c in self.conf]
        for i in range(min(kept, accepted + 1)):
            self.acc[i] += 1.0 if i < accepted else 0.0
            self.conf[i] += float(confidence[i])
        step = self.cost.step_time
        if step > 0 and draft_s > 0:
            self.draft_cost = 0.8 * self.draft_cost + 0.2 * draft_s / step
