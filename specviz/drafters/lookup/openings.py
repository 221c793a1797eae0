"""How the target opens its replies to prompts like this one: a reply-start source for AdaPLD
(beyond the paper, in the spirit of its semantic retrieval and of REST's datastore).

Why: at a reply's first round the context's last tokens are the chat template's
("<|im_start|>assistant\\n"), identical for every prompt, so n-gram lookup and the history
store's contexts say nothing about what comes next, and the round usually commits one token.
Yet the opening is predictable from *what the prompt asks*: an editing request is answered with
"```python\\n" and then the code, a GSM8K question with "To solve this problem, we need to".

Conventions: an :class:`OpeningIndex` holds, for every earlier prompt of the target's own greedy
rollouts, a sparse tf-idf vector of its tokens (the ``top_k`` highest-weighted distinct tokens,
L2-normalised; tf = 1 + log count, idf = log((N + 1) / (df + 1)) + 1) and the first
``length`` tokens of the target's reply (-1 padded). :meth:`OpeningIndex.opening` finds the
``neighbours`` most similar earlier prompts (cosine) and drafts their consensus: token by token,
the next token of the chain so far that carries at least ``majority`` of the neighbours'
similarity mass; the chain stops where they disagree. Deterministic counting, no model; tied to
one tokenizer like the history store that carries it (:mod:`.history_store`).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Sequence

import numpy as np

from .index import NgramIndex

TOP_K = 48          # distinct tokens kept per prompt vector
LENGTH = 12         # reply tokens kept per prompt
NEIGHBOURS = 8      # earlier prompts that vote on an opening
MAJORITY = 0.5      # share of the neighbours' similarity mass a token needs


@dataclass
class OpeningIndex:
    """Earlier prompts (sparse tf-idf rows) and the target's reply openings to them."""

    ids: np.ndarray        # (N, TOP_K) int32 token ids, -1 padded
    weights: np.ndarray    # (N, TOP_K) float32, each row L2-normalised
    openings: np.ndarray   # (N, LENGTH) int32 reply tokens, -1 padded
    idf_ids: np.ndarray    # (V,) int32 tokens seen in any prompt
    idf: np.ndarray        # (V,) float32 their idf
    n_prompts: int

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    # ------------------------------------------------------------------ query
    @cached_property
    def _idf_map(self) -> dict[int, float]:
        return dict(zip(self.idf_ids.tolist(), self.idf.tolist()))

    def vector(self, prompt: Sequence[int]) -> dict[int, float]:
        """The prompt's sparse tf-idf vector (an unseen token gets the largest idf)."""
        known = self._idf_map
        unseen = math.log(self.n_prompts + 1) + 1.0
        return _tfidf(Counter(int(t) for t in prompt), lambda t: known.get(t, unseen))

    def similar(self, prompt: Sequence[int], k: int = NEIGHBOURS) -> list[tuple[int, float]]:
        """[(row, cosine)] of the ``k`` most similar earlier prompts, best first (cosine > 0)."""
        q = self.vector(prompt)
        if not q or not len(self):
            return []
        keys = np.fromiter(q.keys(), dtype=np.int64)
        vals = np.fromiter(q.values(), dtype=np.float32)
        order = np.argsort(keys)
        keys, vals = keys[order], vals[order]
        pos = np.clip(np.searchsorted(keys, self.ids), 0, len(keys) - 1)
        hit = (keys[pos] == self.ids) & (self.ids >= 0)
        sims = (np.where(hit, vals[pos], 0.0) * self.weights).sum(1)
        top = np.argsort(-sims, kind="stable")[:k]
        return [(int(i), float(sims[i])) for i in top if sims[i] > 0]

    def opening(self, prompt: Sequence[int], length: int = LENGTH, eos=frozenset(),
                k: int = NEIGHBOURS, majority: float = MAJORITY) -> tuple[list[int], float]:
        """(the neighbours' consensus opening, the first token's share of their similarity
        mass); ([], 0.0) when they do not agree on a first token."""
        near = self.similar(prompt, k)
        total = sum(s for _, s in near)
        chain: list[int] = []
        first_share = 0.0
        while near and total > 0 and len(chain) < min(length, self.openings.shape[1]):
            i = len(chain)
            votes: Counter = Counter()
            for row, s in near:
                y = int(self.openings[row, i])
                if y >= 0:
                    votes[y] += s
            if not votes:
                break
            y, w = min(votes.items(), key=lambda kv: (-kv[1], kv[0]))
            if w / total < majority or y in eos:
                break
            first_share = first_share or w / total
            chain.append(y)
            near = [(row, s) for row, s in near if int(self.openings[row, i]) == y]
        return chain, first_share

    # ------------------------------------------------------------------ (de)serialisation
    def arrays(self) -> dict[str, np.ndarray]:
        return {"open_ids": self.ids, "open_weights": self.weights.astype(np.float16),
                "open_tokens": self.openings, "open_idf_ids": self.idf_ids,
                "open_idf": self.idf.astype(np.float16),
                "open_n": np.array(self.n_prompts, dtype=np.int64)}

    @classmethod
    def from_arrays(cls, z) -> "OpeningIndex | None":
        if "open_ids" not in z.files:   # a store saved before reply openings
            return None
        return cls(z["open_ids"].astype(np.int32), z["open_weights"].astype(np.float32),
                   z["open_tokens"].astype(np.int32), z["open_idf_ids"].astype(np.int32),
                   z["open_idf"].astype(np.float32), int(z["open_n"]))


def _tfidf(counts: Counter, idf, top_k: int = TOP_K) -> dict[int, float]:
    """The ``top_k`` largest tf-idf weights of a token count, L2-normalised (ties: smaller id)."""
    w = {t: (1.0 + math.log(c)) * idf(t) for t, c in counts.items()}
    kept = sorted(w.items(), key=lambda kv: (-kv[1], kv[0]))[:top_k]
    norm = math.sqrt(sum(v * v for _, v in kept)) or 1.0
    return {t: v / norm for t, v in kept}


def build_openings(pairs: Iterable[tuple[Sequence[int], Sequence[int]]],
                   top_k: int = TOP_K, length: int = LENGTH) -> OpeningIndex:
    """An index from (prompt tokens, the target's greedy reply) pairs."""
    prompts, replies = [], []
    for prompt, reply in pairs:
        prompts.append(Counter(int(t) for t in prompt))
        replies.append([int(t) for t in reply[:length]])
    n = len(prompts)
    df: Counter = Counter()
    for c in prompts:
        df.update(c.keys())
    idf = {t: math.log((n + 1) / (d + 1)) + 1.0 for t, d in df.items()}
    ids = np.full((n, top_k), -1, dtype=np.int32)
    weights = np.zeros((n, top_k), dtype=np.float32)
    openings = np.full((n, length), -1, dtype=np.int32)
    for i, (c, r) in enumerate(zip(prompts, replies)):
        vec = _tfidf(c, idf.__getitem__, top_k)
        ids[i, :len(vec)] = list(vec.keys())
        weights[i, :len(vec)] = list(vec.values())
        openings[i, :len(r)] = r
    keys = sorted(idf)
    return OpeningIndex(ids, weights, openings, np.array(keys, dtype=np.int32),
                        np.array([idf[t] for t in keys], dtype=np.float32), n)


def with_copy(index: NgramIndex, chain: Sequence[int], length: int, eos=frozenset()
              ) -> tuple[list[int], int | None]:
    """The opening ``chain`` continued by a copy from the context ``index`` holds (the prompt;
    AdaPLD's n-gram index, :class:`~.index.NgramIndex`), up to ``length`` tokens: the longest
    prefix chain[:j] whose last min(j, 3) >= 2 tokens occur in the context (the latest
    occurrence; n-grams longer than the index's ``max_n`` are not looked up) is followed by what
    came after them there -- "```python\\n" opens the code the prompt quoted. Returns (draft,
    copy_from): ``copy_from`` is where the draft's first token stands in the context when the
    whole draft is a copy (else None). No such prefix: (the chain, None)."""
    chain = [int(t) for t in chain][:length]
    ctx = index.tokens
    for j in range(len(chain), 1, -1):
        n = min(j, 3)
        ends = index.grams.get(tuple(chain[j - n:j])) if n <= index.max_n else None
        if not ends:
            continue
        q = ends[-1]
        cont = []
        for t in ctx[q:q + length - j]:
            if t in eos:
                break
            cont.append(t)
        draft = chain[:j] + cont
        return draft, (q - j if q >= j and ctx[q - j:q] == chain[:j] else None)
    return chain, None
