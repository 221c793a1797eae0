"""Lossless checks for greedy speculative decoding (docs/architecture.md, "Lossless").

Greedy speculative output must equal plain greedy decoding token for token. A forward over k
tokens and k one-token forwards differ by ~1e-5 in logits, so an exact near-tie of the target's
top-2 logits can legitimately flip; :func:`compare_outputs` reports the first divergence and the
top-2 logit gap there so tests can accept only genuine near-ties.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

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


# ---------------------------------------------------------------- lossless verdict
@dataclass(frozen=True)
class LosslessVerdict:
    """How a set of speculative runs compares with plain decoding (AR) on the same prompts."""

    greedy: bool
    compared: int = 0     # runs compared token for token with AR (0 in sampling mode)
    identical: int = 0    # ... whose output equals AR's exactly
    near_ties: int = 0    # ... that differ, first at a top-2 near-tie of the target's logits

    @property
    def different(self) -> int:
        return self.compared - self.identical

    @property
    def ok(self) -> bool | None:
        """True when every difference is a near-tie; None when nothing was compared."""
        if not self.greedy or not self.compared:
            return None
        return self.identical + self.near_ties == self.compared

    @property
    def count(self) -> str:
        """``identical/compared`` (e.g. ``"9/10"``), empty when nothing was compared."""
        return f"{self.identical}/{self.compared}" if self.greedy and self.compared else ""

    @property
    def level(self) -> str:
        """How to show :attr:`message`: ``success``, ``warning`` or ``info``."""
        if self.ok is None:
            return "info"
        return "warning" if self.different else "success"

    @property
    def message(self) -> str:
        """One human sentence: the verdict."""
        return lossless_message(self)


def lossless_verdict(results: Iterable[LosslessReport | bool | None],
                     greedy: bool = True) -> LosslessVerdict:
    """Verdict over the non-baseline runs: each result is a
    :class:`~specviz.analysis.lossless.LosslessReport` (from ``compare_outputs``), or a plain
    bool "identical to AR" when no near-tie check was made; None entries are skipped.
    Sampling mode (``greedy=False``) compares nothing."""
    if not greedy:
        return LosslessVerdict(greedy=False)
    reps = [r if isinstance(r, LosslessReport) else LosslessReport(bool(r))
            for r in results if r is not None]
    return LosslessVerdict(greedy=True, compared=len(reps),
                           identical=sum(r.identical for r in reps),
                           near_ties=sum(bool(r.near_tie) and not r.identical for r in reps))


def lossless_message(v: LosslessVerdict) -> str:
    """The one-line verdict the Compare page and the CLI print."""
    if not v.greedy:
        return "Sampling mode: outputs are random draws, so they are not compared with AR."
    if not v.compared:
        return "Greedy mode: no speculative run to compare with plain decoding yet."
    if not v.different:
        return ("Greedy mode: every method produced exactly the same tokens as plain decoding "
                f"({v.count} runs identical; speculative decoding is lossless).")
    ties = (f"; {v.near_ties} of them first differ at a top-2 near-tie of the target's logits"
            if v.near_ties else "")
    return (f"{v.different} of {v.compared} run(s) differ from plain decoding{ties}. In float "
            "arithmetic a verify pass over several tokens can break near-ties differently from "
            "a one-token step; see the per-prompt results.")
