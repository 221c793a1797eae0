"""Speculative decoding as a Markov reward process (docs/methods/edr.md, EDR): exact expected
decoding rounds on a fixed target rollout, state occupancies and values.

Along a rollout y[0..L-1] (the target's reply after the prompt), a *state* n is the
number of tokens generated so far. From state n the drafter proposes up to K tokens; slot t
(1-based) drafts y[n + t - 1] and is accepted with probability a[n, t] (greedy: draft == y,
so 0 or 1; sampled: min(1, q(y)/p(y)) -- see docs/methods/edr.md), given every earlier slot was. The
round commits the j accepted tokens and one target token, so it moves to state n + j + 1;
the engine never drafts past the budget, so a[n, t] = 0 for t > L - n - 1.

With S[n, j] = prod_{t <= j} a[n, t] (prefix survival) and P[n, j] = S[n, j] - S[n, j+1]:

* values (backward): V[L] = 0, V[n] = 1 + sum_j P[n, j] V[n + j + 1] -- expected rounds to
  finish from n; EDR = V[0];
* occupancies (forward): d[0] = 1, d[m] = sum_{n, j: n + j + 1 = m} d[n] P[n, j] -- expected
  number of rounds that start at n; sum_n d[n] = EDR;
* per-position acceptance AR_k = sum_n d[n] S[n, k] / sum_n d[n] S[n, k-1].

Tensors carry an optional leading batch dimension (several rollouts of the same length, or
several drafters on one rollout); the dynamic programs loop over n only. For a deterministic
drafter under greedy verification the process is deterministic and EDR equals the number of
rounds of a real (or replayed) run exactly -- tested.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..drafters.base import DraftContext, Drafter, VerifyFeedback, clip_draft
from ..trace import Round


def budget_mask(L: int, K: int, device=None) -> torch.Tensor:
    """[L, K] bool: slot t of state n fits the budget (t <= L - n - 1)."""
    n = torch.arange(L, device=device).view(L, 1)
    t = torch.arange(1, K + 1, device=device).view(1, K)
    return t <= (L - n - 1)


def survival(a: torch.Tensor) -> torch.Tensor:
    """S[..., n, j] = prod_{t <= j} a[..., n, t], j = 0..K (S[..., 0] = 1); a clipped to [0, 1]
    and to the budget. Differentiable, on a's device."""
    L, K = a.shape[-2], a.shape[-1]
    a = a.clamp(0.0, 1.0) * budget_mask(L, K, a.device).to(a.dtype)
    return torch.cat([a.new_ones(*a.shape[:-1], 1), a.cumprod(-1)], -1)


def step_probs(a: torch.Tensor) -> torch.Tensor:
    """P[..., n, j] = probability that a round starting at n accepts exactly j tokens."""
    S = survival(a)
    return S - torch.cat([S[..., 1:], torch.zeros_like(S[..., :1])], -1)


def values(a: torch.Tensor) -> torch.Tensor:
    """V[..., n] for n = 0..L (V[..., L] = 0): expected rounds from state n to the end.
    Differentiable (no in-place writes: the EDR objective backpropagates through it)."""
    P = step_probs(a)
    L, J = P.shape[-2], P.shape[-1]
    V = [P.new_zeros(P.shape[:-2])] * (L + 1 + J)   # states past L are 0
    for n in range(L - 1, -1, -1):
        V[n] = 1.0 + (P[..., n, :] * torch.stack(V[n + 1:n + 1 + J], -1)).sum(-1)
    return torch.stack(V[:L + 1], -1)


@torch.no_grad()
def occupancy(a: torch.Tensor) -> torch.Tensor:
    """d[..., n]: expected number of rounds that start at state n (d[..., 0] = 1; no grad)."""
    P = step_probs(a)
    L, J = P.shape[-2], P.shape[-1]
    d = P.new_zeros(*P.shape[:-2], L + J)
    d[..., 0] = 1.0
    for n in range(L):
        d[..., n + 1:n + 1 + J] += d[..., n:n + 1] * P[..., n, :]
    return d[..., :L]


def position_acceptance(a: torch.Tensor, d: torch.Tensor | None = None) -> torch.Tensor:
    """AR_k for k = 1..K: occupancy-weighted P(slot k accepted | slots < k accepted)."""
    S = survival(a)
    d = occupancy(a) if d is None else d
    num = (d.unsqueeze(-1) * S[..., 1:]).sum(-2)
    den = (d.unsqueeze(-1) * S[..., :-1]).sum(-2)
    return torch.where(den > 0, num / den.clamp_min(1e-12), torch.zeros_like(num))


@dataclass
class MRPResult:
    """The Markov reward process of one drafter on one rollout."""

    edr: float                     # expected decoding rounds = V[0] = sum(d)
    #                                (the EDR paper counts states 1..L and writes (L+1)/EDR for the
    #                                mean accepted length; here states are 0..L-1 and it is L/EDR)
    tokens: int                    # L, the rollout's generated tokens
    occupancy: torch.Tensor        # d[n]
    value: torch.Tensor            # V[n], n = 0..L
    position_acceptance: torch.Tensor  # AR_k

    @property
    def mean_accepted_length(self) -> float:
        """Expected committed tokens per round (tau): L / EDR."""
        return self.tokens / self.edr if self.edr else 0.0


def evaluate(a: torch.Tensor) -> MRPResult:
    """EDR, occupancies, values and per-position acceptance from the acceptance matrix [L, K]."""
    a = a.double()
    d, V = occupancy(a), values(a)
    return MRPResult(float(V[0]), int(a.shape[-2]), d, V, position_acceptance(a, d))


def greedy_acceptance(drafts: Sequence[Sequence[int]], reply: Sequence[int],
                      K: int | None = None) -> torch.Tensor:
    """a[n, t] = 1 when the draft proposed at state n has y[n + t - 1] in slot t (greedy
    verification of a deterministic drafter), else 0. ``drafts[n]``: the draft at state n."""
    y = [int(x) for x in reply]
    L = len(y)
    K = K or max((len(dr) for dr in drafts), default=1) or 1
    a = torch.zeros(L, K, dtype=torch.float64)
    for n, dr in enumerate(drafts[:L]):
        for t, tok in enumerate(list(dr)[:K]):
            if n + t < L and int(tok) == y[n + t]:
                a[n, t] = 1.0
    return a


def sampled_acceptance(q_of_y: torch.Tensor, p_of_y: torch.Tensor) -> torch.Tensor:
    """Sampled verification (docs/methods/edr.md): a[n, t] = min(1, q(y_t) / p(y_t)), with q the
    drafter's and p the target's probability of the rollout's token y_t at that slot."""
    return torch.minimum(torch.ones_like(q_of_y), q_of_y / p_of_y.clamp_min(1e-12))


def state_drafts(drafter: Drafter, rollout, target=None) -> list[list[int]]:
    """The draft a drafter proposes at EVERY state n of ``rollout`` (an
    :class:`~specviz.analysis.replay.Rollout`), advancing it one committed token at a time
    (its observe() sees a round that committed y[n]; hidden-state drafters get the rollout's
    features). Exact for drafters that are Markov in n -- PLD, DFlash with ``cut="off"``;
    for drafters with a memory of past rounds (AdaPLD's statistics, a cost-aware cut) this is
    the draft after a token-by-token history, an approximation. Tree drafts count as their
    first branch."""
    y, P = [int(t) for t in rollout.tokens], int(rollout.prompt_len)
    L = len(y) - P
    hidden = drafter.hidden_state_layers is not None
    drafter.begin(target, y[:P], rollout.hidden_states(0, P - 1) if hidden and P > 1 else None)
    out = []
    for n in range(L):
        d = clip_draft(drafter.propose(DraftContext(y[:P + n], P, L - n - 1, n)), L - n - 1)
        out.append(_first_branch(d))
        rnd = Round(index=n, start=P + n, drafter=drafter.name, draft=[], accepted=0,
                    committed=[y[P + n]])
        drafter.observe(VerifyFeedback(
            round=rnd, logits=None, kept_rows=[0],
            hidden_states=rollout.hidden_states(P + n - 1, P + n) if hidden else None))
    return out


def _first_branch(d) -> list[int]:
    if d.parents is None:
        return [int(t) for t in d.tokens]
    out, cur = [], -1
    for i, p in enumerate(d.parents):
        if p == cur:
            out.append(int(d.tokens[i]))
            cur = i
    return out
