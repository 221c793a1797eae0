"""Draft length that pays for itself, for block drafters (docs/methods/dflash.md).

A block drafter (DFlash) fills all its slots in one forward, but verifying a slot is not free on
a CPU: a target forward over k + 1 tokens costs c(k + 1) one-token forwards
(:mod:`specviz.costs`, measured on the loaded model). So only the prefix of the block whose
expected accepted tokens pay for the extra verify cost is sent to the target:

    E_k = sum_{j <= k} prod_{i <= j} p_i,     k* = argmax_k (1 + E_k) / (c(k + 1) + d)

with p_i the drafter's confidence in slot i (its top probability) times a per-slot calibration
factor learned online (accepted / confidence over the rounds that reached the slot: drafters are
rarely calibrated), and d the drafter's own forward in one-token-forward units (paid whatever
is kept). k* = 0 means a plain decoding step. Verification is unchanged, so output is too.

The drafter's forward itself is not free either (d above, ~0.1-0.3 of a step on a CPU), and it
is paid even when the cut keeps nothing. :class:`ForwardGate` decides, before the forward,
whether to run the drafter at all: it keeps decayed sums of the tokens that drafted rounds
committed and of what they cost (c(kept + 1) + d, in one-token forwards); while that rate stays
below a plain step's (1 token per unit), the drafter is paused -- rounds are plain decoding
steps with no drafter forward -- and probed after 4, 8, 16, 32 rounds. A probe that pays
switches it back on. On an accelerator (flat curve, d ~ 0) it almost never pauses.

What a drafted round cost is measured by default (DFlash's ``gate_cost="measured"``: the
round's own drafting and verify forward times over the current one-token step, both timed in
the run under the same load; offline replay has no timed forward and falls back to the model)
or modelled (``gate_cost="model"``: c(kept + 1) + d). Before the gate, a drafter with a
fitted state probe may also skip a forward the target's state says will not pay
(:mod:`.state_probe`, off by default).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ...costs import CostModel
from ..probes import PROBE_GAPS, Paused
from .block_tree import TreeNode, best_first

DECAY = 0.95     # per round, for the calibration sums
P_MAX = 0.995
GATE_DECAY = 0.9            # per drafted round, for the forward gate's sums
GATE_PRIOR = (7.5, 6.0)     # prior (tokens, cost): three rounds at 1.25 tokens per step


@dataclass
class ForwardGate(Paused):
    """Whether a round runs the drafter at all (see the module docstring)."""

    tokens: float = GATE_PRIOR[0]   # decayed tokens committed by drafted rounds
    cost: float = GATE_PRIOR[1]     # decayed cost of those rounds, in one-token forwards

    @property
    def rate(self) -> float:
        """Tokens per one-token forward of the drafted rounds (a plain step: 1.0)."""
        return self.tokens / max(1e-9, self.cost)

    def wants(self, round_index: int) -> bool:
        """Run the drafter this round? (on, or paused and due for a probe)"""
        return self.due(round_index)

    def observe(self, round_index: int, committed: int, cost: float) -> None:
        """A drafted round committed ``committed`` tokens at ``cost`` one-token forwards."""
        if self.off:                        # a probe: judged on its own outcome
            self.probed(round_index, committed >= cost, PROBE_GAPS)
            if not self.off:
                self.tokens, self.cost = GATE_PRIOR[0] + committed, GATE_PRIOR[1] + cost
            return
        self.tokens = GATE_DECAY * self.tokens + committed
        self.cost = GATE_DECAY * self.cost + cost
        if self.rate < 1.0:
            self.pause(round_index + 1, PROBE_GAPS)


@dataclass
class SharedDraft:
    """Another draft verified in the same forward as the block: its node count and its
    estimated survival P(accepted length >= j) at depths j = 1, 2, ... (:mod:`..hybrid`)."""

    width: int
    survival: tuple[float, ...] = ()


@dataclass
class BlockCut:
    """Chooses how many of a block's slots to verify (see the module docstring)."""

    cost: CostModel
    acc: list[float] = field(default_factory=list)   # decayed accepted count per slot
    conf: list[float] = field(default_factory=list)  # decayed confidence sum per slot
    draft_cost: float = 0.0                          # drafter forward, in one-token forwards
    gate: ForwardGate | None = None                  # pause the drafter where it does not pay

    def factor(self, i: int) -> float:
        a = self.acc[i] if i < len(self.acc) else 0.0
        c = self.conf[i] if i < len(self.conf) else 0.0
        return (a + 1.0) / (c + 1.0)

    def calibrated(self, i: int, c: float) -> float:
        """Slot ``i``'s (0-based) confidence ``c`` times its calibration factor, capped."""
        return min(P_MAX, max(0.0, float(c) * self.factor(i)))

    def expected(self, confidence: Sequence[float]) -> list[float]:
        """E_k for k = 0 .. len(confidence)."""
        out, surv = [0.0], 1.0
        for i, c in enumerate(confidence):
            surv *= self.calibrated(i, c)
            out.append(out[-1] + surv)
        return out

    def choose(self, confidence: Sequence[float], shared: "SharedDraft | None" = None
               ) -> tuple[int, list[float]]:
        """(slots to keep, expected committed tokens per unit of cost for each k). With a
        ``shared`` draft in the same verify forward (a hybrid's lookup tree) the round commits
        the longer of the two accepted paths: P(max >= j) = s_j + b_j (1 - s_j) for the other
        draft's survival s_j and the block's b_j (taken as independent), and the block's k slots
        cost c(width + k + 1)."""
        e = self.expected(confidence)
        base, other = (shared.width, list(shared.survival)) if shared is not None else (0, [])
        gain = [0.0]
        for j in range(1, len(e)):
            s_j = other[j - 1] if j - 1 < len(other) else 0.0
            gain.append(gain[-1] + (e[j] - e[j - 1]) * (1.0 - s_j))
        value = [(1.0 + sum(other) + gain[k]) / (self.cost.relative(base + k + 1)
                                                 + self.draft_cost) for k in range(len(e))]
        best = max(range(len(value)), key=lambda k: (value[k], -k))
        return best, value

    def choose_tree(self, topk_p: Sequence[Sequence[float]], max_nodes: int,
                    shared: "SharedDraft | None" = None) -> tuple[list[TreeNode], list[float]]:
        """A draft tree for a block whose slots have top-word probabilities ``topk_p`` [k, R]
        (:mod:`.block_tree`): the best-first nodes of the calibrated probabilities, as many as
        maximise (1 + E_N) / (c(N + 1) + d), N <= ``max_nodes``; and that value for each N.
        With a ``shared`` draft (as in :meth:`choose`): a node at depth j adds its P times
        (1 - s_j) -- paths of one depth are disjoint, so P(block >= j) is their sum -- and the
        verify covers the other draft's nodes too."""
        p = [[self.calibrated(i, c) for c in row] for i, row in enumerate(topk_p)]
        nodes = best_first(p, max_nodes)
        base, other = (shared.width, list(shared.survival)) if shared is not None else (0, [])
        e = [0.0]
        for n in nodes:
            s_j = other[n.slot - 1] if n.slot - 1 < len(other) else 0.0
            e.append(e[-1] + n.prob * (1.0 - s_j))
        value = [(1.0 + sum(other) + e[n]) / (self.cost.relative(base + n + 1) + self.draft_cost)
                 for n in range(len(e))]
        best = max(range(len(value)), key=lambda n: (value[n], -n))
        return nodes[:best], value

    def wants_forward(self, round_index: int) -> bool:
        """Run the drafter this round? Always, without a :class:`ForwardGate`."""
        return self.gate is None or self.gate.wants(round_index)

    def observe(self, confidence: Sequence[float], kept: int, accepted: int,
                draft_s: float = 0.0, round_index: int = 0, committed: int | None = None,
                gate_cost: float | None = None, nodes: int | None = None) -> None:
        """Learn from a verified round: slots 1..accepted+1 of the kept prefix were reached
        (a tree's ``confidence``: the drafted children's mass at each judged depth,
        :func:`.block_tree.path_confidence`; its ``nodes``: how many were verified).
        The gate is told the round committed ``committed`` tokens (default accepted + 1) at
        ``gate_cost`` one-token forwards (default c(nodes + 1) + d, nodes = kept for a chain;
        a hybrid passes what the drafter added to its lookup tree, :mod:`..hybrid`)."""
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
        if self.gate is not None:
            done = accepted + 1 if committed is None else committed
            width = kept if nodes is None else nodes
            cost = self.cost.relative(width + 1) + self.draft_cost if gate_cost is None \
                else gate_cost
            self.gate.observe(round_index, done, cost)
