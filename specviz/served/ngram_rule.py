"""vLLM's n-gram proposer rule, in plain Python: the draft a served ngram run proposed at a step.

vLLM (``vllm/v1/spec_decode/ngram_proposer.py``, ``_find_longest_matched_ngram_and_propose_tokens``)
reports only how many tokens each verify step drafted and accepted. Its proposer is a pure
function of the context (prompt + every committed token), so the drafted tokens can be rebuilt
exactly: find the longest n-gram, ``prompt_lookup_min <= n <= prompt_lookup_max``, that ends the
context and also occurs earlier in it (its earliest occurrence when several match equally long),
and propose up to ``num_speculative_tokens`` tokens that followed it, never past
``max_model_len``. This is the same KMP scan over the reversed context as vLLM's, so ties break
the same way; the served tests compare it with vLLM's own function on random contexts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class NgramConfig:
    """vLLM's ``speculative_config`` for ``method: ngram`` (its names)."""
    num_speculative_tokens: int = 10
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 2
    max_model_len: int = 8192

    def to_dict(self) -> dict:
        return {"method": "ngram", "num_speculative_tokens": self.num_speculative_tokens,
                "prompt_lookup_min": self.prompt_lookup_min,
                "prompt_lookup_max": self.prompt_lookup_max}


def longest_earliest_match(tokens: Sequence[int], min_n: int, max_n: int) -> tuple[int, int]:
    """(n, start of the continuation) of the longest n-gram (``min_n <= n <= max_n``) ending the
    context that also occurs earlier, its earliest occurrence; (0, -1) when none does."""
    total = len(tokens)
    if total < min_n or max_n < 1:
        return 0, -1
    rev = list(tokens[::-1])
    lps = [0] * max_n   # lps[i] = longest proper prefix of rev[:i+1] that is also its suffix
    longest, position, prev, i = 0, 0, 0, 1
    while i < total:
        if rev[prev] == rev[i]:
            prev += 1
            if prev >= longest:          # '>=': the latest i in rev = the earliest occurrence
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:
                prev = lps[max_n - 1]
            i += 1
        elif prev != 0:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return 0, -1
    return longest, total - 1 - position + longest


def propose(context: Sequence[int], cfg: NgramConfig) -> list[int]:
    """The tokens vLLM's ngram proposer drafts after ``context`` (empty: no draft this step)."""
    total = len(context)
    k = min(cfg.num_speculative_tokens, cfg.max_model_len - total)
    if total < cfg.prompt_lookup_min or k <= 0:
        return []
    n, start = longest_earliest_match(context, cfg.prompt_lookup_min, cfg.prompt_lookup_max)
    if n == 0:
        return []
    return [int(t) for t in context[start:start + min(k, total - start)]]
