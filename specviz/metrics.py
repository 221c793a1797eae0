"""The ONE definition of each headline metric (docs/guide.md: rounds, tau, speedup, lossless).

Bench tables, the Compare page, the CLI summary, :class:`~specviz.trace.Trace` and the README
all compute their numbers here, so two views of the same runs can never disagree.

- **tau** — committed tokens per round (= per target forward). The papers write it as the mean of
  (accepted + 1); the two agree on every round except one cut short by EOS or by the token
  budget, where fewer than accepted + 1 tokens are committed. Counting committed tokens makes
  tau × forwards = generated tokens exactly.
- **target forwards** — one per round: a round is ONE target forward over [last committed
  token, draft…]. The prompt's prefill is not counted (plain decoding pays it too).
- **speedup** — baseline (AR) wall time ÷ method wall time, measured in the same run.
- **tokens/s** — generated tokens ÷ seconds.
- **lossless verdict** — greedy speculative output must equal plain greedy decoding token for
  token; a divergence at a top-2 near-tie of the target's logits is float noise, not a bug
  (:func:`specviz.analysis.lossless.compare_outputs`). Sampling output is a random draw: not
  compared.
"""
from __future__ import annotations

from typing import Sequence

#: one-line explanations of the metrics, for table headers and tooltips
METRIC_HELP = {
    "tau": "Committed tokens per round (= per target forward); plain decoding has tau = 1",
    "target_forwards": "One target forward per round; the prompt's prefill is not counted",
    "speedup_vs_ar": "AR wall time ÷ this wall time, measured in the same run",
    "identical_to_ar": "Greedy mode: the output equals plain decoding token for token (on "
                       "every prompt); empty in sampling mode",
}


def tau(new_tokens: int, rounds: int) -> float:
    """Acceptance length tau: committed (generated) tokens per round; 0.0 with no rounds.

    Plain decoding has tau = 1. A round that drafted k tokens and had all accepted commits
    k + 1 (the bonus token) — unless EOS or ``max_new_tokens`` cut it, then only what was
    committed counts."""
    return new_tokens / rounds if rounds else 0.0


def target_forwards(rounds: Sequence) -> int:
    """Target forward passes of the decoding loop: one per round, the prefill not counted."""
    return len(rounds)


def rounds_tau(rounds: Sequence) -> float:
    """:func:`tau` of a list of :class:`~specviz.trace.Round` records (committed per round)."""
    return tau(sum(len(r.committed) for r in rounds), target_forwards(rounds))


def speedup(baseline_wall: float | None, method_wall: float | None) -> float | None:
    """Wall-clock speedup vs the baseline run (AR) of the same prompts in the same process:
    baseline wall ÷ method wall. None when either time is missing or not positive."""
    if baseline_wall is None or method_wall is None or baseline_wall <= 0 or method_wall <= 0:
        return None
    return baseline_wall / method_wall


def tokens_per_s(new_tokens: int, seconds: float | None) -> float | None:
    """Throughput: generated tokens ÷ seconds; None when no time was measured."""
    if seconds is None or seconds <= 0:
        return None
    return new_tokens / seconds
