"""Training objectives for drafters on an acceptance matrix (docs/methods/edr.md, EDR: minimise the
expected number of decoding rounds directly).

The acceptance matrix a [..., L, K] is the one of :mod:`specviz.analysis.edr`: state n = 0..L-1
(tokens committed along a fixed target rollout), slot t = 1..K, a[n, t] = probability that slot
t is accepted given slots < t were; slots past the budget (t > L - n - 1) are masked. For
training it is built from the drafter's probabilities
(:func:`specviz.drafters.dflash.offline.acceptance_from_probs`) so that it
carries gradients. Objectives:

* :func:`edr_exact` -- EDR = V[0] by the (differentiable) backward value recursion of
  :func:`specviz.analysis.edr.values`;
* :func:`td_surrogate` -- the exact TD / policy-gradient surrogate: with the occupancies d[n]
  and values V[n] computed WITHOUT grad, ``sum_n d[n] sum_j P[n, j](a) V[n+j+1]`` has exactly
  the gradient of V[0] (differentiate V[n] = 1 + sum_j P[n, j] V[n+j+1] and unroll: each
  round start n is reached d[n] times). Round starts can be subsampled with probability
  proportional to d[n] and Horvitz-Thompson weights (unbiased);
* :func:`survival_surrogate` -- 1 - mean prefix survival, a block-local baseline.

DFlash's decay-weighted CE (``decay_ce``) is computed from logits and labels, not from an
acceptance matrix: it stays in :func:`specviz.train.dflash_train.sequence_loss`; the registry
:data:`OBJECTIVES` names it for completeness.
"""
from __future__ import annotations

import torch

from ..analysis.edr import occupancy, step_probs, survival, values
from ..errors import SettingsError

OBJECTIVES: dict[str, str] = {
    "decay_ce": "DFlash cross-entropy with slot weights exp(-(k-1)/gamma) "
                "(specviz.train.dflash_train.sequence_loss; from logits, not acceptance)",
    "edr": "expected decoding rounds V[0], exact TD gradient, optional occupancy-subsampled "
           "round starts (td_surrogate)",
    "survival": "1 - mean prefix survival over states and slots (survival_surrogate)",
}


# --------------------------------------------------------------------------- objectives
def edr_exact(a: torch.Tensor) -> torch.Tensor:
    """Expected decoding rounds V[0] of a [..., L, K] -> [...]; differentiable."""
    return values(a)[..., 0]


def round_terms(a: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """g[..., n] = sum_j P[n, j](a) V[n + j + 1]: the expected value after a round from n, with
    P carrying a's gradient and V (n = 0..L, detached) fixed."""
    P = step_probs(a)
    L, J = P.shape[-2], P.shape[-1]
    Vp = torch.cat([V, V.new_zeros(*V.shape[:-1], J)], -1)     # V past L = 0
    nxt = torch.arange(L, device=a.device).view(L, 1) + torch.arange(1, J + 1, device=a.device)
    return (P * Vp[..., nxt]).sum(-1)


def td_surrogate(a: torch.Tensor, num_starts: int | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Scalar whose gradient w.r.t. a is the exact gradient of EDR (summed over a's leading
    dims), and whose value is the (detached) EDR itself, for logging.

    ``num_starts`` = None: every round start, sum_n d[n] g[n] (d, V without grad).
    Otherwise ``num_starts`` states per rollout drawn with replacement with probability
    d[n] / sum(d), each term g[n] weighted by sum(d) / num_starts -- the Horvitz-Thompson
    estimate of the same sum, so the expected gradient is exact (the EDR paper subsamples at
    most 512 starts per rollout). ``generator`` seeds the draw (on a's device)."""
    with torch.no_grad():
        ad = a.detach()
        V, d = values(ad), occupancy(ad)
        edr = V[..., 0].sum()
    g = round_terms(a, V)
    if num_starts is None:
        surr = (d * g).sum()
    else:
        if num_starts < 1:
            raise SettingsError(f"num_starts must be >= 1 (got {num_starts})")
        L = d.shape[-1]
        dd, gg = d.reshape(-1, L), g.reshape(-1, L)
        idx = torch.multinomial(dd, num_starts, replacement=True, generator=generator)
        w = dd.sum(-1, keepdim=True) / num_starts
        surr = (w * gg.gather(-1, idx)).sum()
    return surr - surr.detach() + edr


def survival_surrogate(a: torch.Tensor) -> torch.Tensor:
    """1 - mean prefix survival: mean over states n and slots j = 1..K of S[n, j] (budget-
    masked slots count as 0), averaged over leading dims; in [0, 1]."""
    return 1.0 - survival(a)[..., 1:].mean()


def check_objective(name: str) -> str:
    """``name`` when it is a known objective, else a SettingsError listing the choices."""
    if name not in OBJECTIVES:
        raise SettingsError(f"unknown training objective {name!r}; choose one of "
                            + ", ".join(sorted(OBJECTIVES)))
    return name


def objective_loss(name: str, a: torch.Tensor | None = None, num_starts: int | None = None,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """The loss of objective ``name`` on acceptance matrix ``a`` ("edr": :func:`td_surrogate`,
    "survival": :func:`survival_surrogate`). "decay_ce" is computed from logits by
    :func:`specviz.train.dflash_train.sequence_loss` and raises here."""
    check_objective(name)
    if name == "decay_ce":
        raise SettingsError("decay_ce is computed from logits by "
                            "specviz.train.dflash_train.sequence_loss, not from an acceptance "
                            "matrix")
    if a is None:
        raise SettingsError(f"objective {name!r} needs an acceptance matrix")
    if name == "edr":
        return td_surrogate(a, num_starts, generator)
    return survival_surrogate(a)
