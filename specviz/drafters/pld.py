"""Prompt lookup decoding (PLD), with transformers' ``PromptLookupCandidateGenerator`` semantics.

Match the last n tokens (n from ``max_matching_ngram_size`` down to 1) anywhere in
prompt + output, and copy the ``num_output_tokens`` tokens that followed the FIRST (oldest)
match; no match means no draft (a plain decoding step). Draft tokens after an EOS are dropped.
This is the training-free baseline that AdaPLD (docs/methods/adapld.md) improves on.
"""
from __future__ import annotations

import numpy as np

from .base import Draft, DraftContext, Drafter
from .registry import MethodSpec, ParamSpec, params_by_name

PARAMS = params_by_name(
    ParamSpec("max_matching_ngram_size", int, 2, range=(1, 16), label="Longest n-gram to match",
              help="PLD looks for the last n tokens (n from this value down to 1) earlier in "
                   "prompt + output."),
    ParamSpec("num_output_tokens", int, 10, range=(1, 128), label="Draft length",
              help="How many tokens after the match are copied as the draft (the most a round "
                   "can accept)."),
)


class PLDDrafter(Drafter):
    name = "pld"

    def __init__(self, max_matching_ngram_size: int = 2, num_output_tokens: int = 10,
                 eos_token_ids: set[int] | None = None):
        self.max_matching_ngram_size = PARAMS["max_matching_ngram_size"].check(
            max_matching_ngram_size)
        self.num_output_tokens = PARAMS["num_output_tokens"].check(num_output_tokens)
        self.eos_token_ids = set(eos_token_ids or ())

    def begin(self, target, prompt_ids, prefill_hidden=None):
        if not self.eos_token_ids:
            self.eos_token_ids = set(target.eos_token_ids)

    def config(self):
        return {"max_matching_ngram_size": self.max_matching_ngram_size,
                "num_output_tokens": self.num_output_tokens}

    def propose(self, ctx: DraftContext) -> Draft:
        ids = np.asarray(ctx.tokens, dtype=np.int64)
        n_total = len(ids)
        for n in range(min(self.max_matching_ngram_size, n_total - 1), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(ids, n)
            hits = np.flatnonzero((windows == ids[-n:]).all(axis=1))
            for idx in hits:
                start = int(idx) + n
                end = min(start + self.num_output_tokens, n_total)
                if start >= end:
                    continue
                chosen = ids[start:end].tolist()
                for j, t in enumerate(chosen):
                    if t in self.eos_token_ids:
                        chosen = chosen[:j]
                        break
                return Draft(tokens=chosen, extras={
                    "match": {"kind": "lexical", "ngram": n, "span": [int(idx), start],
                              "copy_from": [start, start + len(chosen)]}})
        return Draft(extras={"match": None})


SPECS = (MethodSpec("pld", PLDDrafter, "PLD", "Prompt lookup decoding (transformers semantics)",
                    params=tuple(PARAMS.values())),)
