"""Lossless checks for greedy speculative decoding (METHODS §0, "Lossless").

Greedy speculative output must equal plain greedy decoding token for token. A forward over k
tokens and k one-token forwards differ by ~1e-5 in logits, so an exact near-tie of the target's
top-2 logits can legitimately flip; :func:`compare_outputs` reports the first divergence and the
top-2 logit gap there so tests can accept only genuine near-ties.
"""
from __future__ import annotations

from dataclasses import dataclass

NEAR_TIE = 1e-3


@dataclass
class LosslessReport:
    identical: bool
    first_divergence: int | None = None   # index into the generated tokens
    top2_gap: float | None = None         # target's top-2 logit gap at the divergence
    near_tie: bool = False

    @property
    def ok(self) -> bool:
        return self.identical or self.near_tie


def compare_outputs(target, prompt_ids: list[int], reference: list[int], other: list[int],
                    tol: float = NEAR_TIE) -> LosslessReport:
    """Compare two greedy outputs of the same prompt. If they differ, recompute the target's
    logits at the first divergence (one full forward) and check it is a top-2 near-tie
    (``target=None``: report the divergence without that check)."""
    import torch

    n = min(len(reference), len(other))
    i = next((j for j in range(n) if reference[j] != other[j]), None)
    if i is None:  # same tokens; a length difference (one run cut short) is not a divergence
        return LosslessReport(len(reference) == len(other), None if len(reference) == len(other)
                              else n)
    if target is None:
        return LosslessReport(False, first_divergence=i)
    ids = torch.tensor([list(prompt_ids) + list(reference[:i])], device=target.device)
    with target.lock, torch.inference_mode():
        logits = target.model(input_ids=ids).logits[0, -1].float()
    top2 = torch.topk(logits, 2)
    gap = float(top2.values[0] - top2.values[1])
    pair = {reference[i], other[i]}
    near = gap < tol and pair <= set(top2.indices.tolist())
    return LosslessReport(False, first_divergence=i, top2_gap=gap, near_tie=near)
