"""Prompt lookup decoding (PLD), with transformers' ``PromptLookupCandidateGenerator`` semantics.

Match the last n tokens (n from ``max_matching_ngram_size`` down to 1) anywhere in
prompt + output, and copy the ``num_output_tokens`` tokens that followed the FIRST (oldest)
match; no match means no draft (a plain decoding step). Draft tokens after an EOS are dropped.
This is the training-free baseline that AdaPLD (METHODS §3) improves on.
"""
from __future__ import annotations

import numpy as np

from ..errors import SettingsError
from .base import Draft, DraftContext, Drafter


class PLDDrafter(Drafter):
    name = "pld"

    def __init__(self, max_matching_ngram_size: int = 2, num_output_tokens: int = 10,
                 eos_token_ids: set[int] | None = None):
        if not 1 <= int(max_matching_ngram_size) <= 16:
            raise SettingsError("max_matching_ngram_size must be between 1 and 16")
        if not 1 <= int(num_output_tokens) <= 128:
            raise SettingsError("num_output_tokens must be between 1 and 128")
        self.max_matching_ngram_size = int(max_matching_ngram_size)
        self.num_output_tokens = int(num_output_tokens)
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
