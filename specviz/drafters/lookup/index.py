"""Lexical retrieval for prompt lookup (docs/methods/adapld.md, AdaPLD idea 1): an incremental
n-gram index over prompt + output and the ranked candidates a suffix match proposes.

Conventions: positions are absolute (prompt included); an n-gram's *end* ``e`` is the position
right after it, where its copy starts. A copy never includes the current
position and stops before an EOS token; one that reaches the end of the context continues with
its own tokens (an overlapping copy). Candidates are plain records (:class:`Candidate`) that the
drafter turns into chains or token trees.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Sequence

MAX_MATCHES_PER_NGRAM = 64     # most recent occurrences examined per suffix n-gram
RECENCY_SCALE = 64.0           # tokens; recency term = 1 / (1 + distance / scale)
W_NGRAM, W_RECENCY, W_VOTES = 0.5, 0.2, 0.3


def copy_tokens(tokens: Sequence[int], start: int, length: int, eos) -> list[int]:
    """Up to ``length`` tokens copied from ``start``, stopping before an EOS: what a copy from
    ``start`` drafts. A copy that reaches the end of the context continues with its own tokens
    (an overlapping LZ77 copy: ``out[i] = (tokens + out)[start + i]``), so a text caught in a
    loop of period ``len(tokens) - start`` is drafted to full length, not cut at the end."""
    L = len(tokens)
    if not 0 <= start < L:
        return []
    out: list[int] = []
    for i in range(length):
        j = start + i
        t = int(tokens[j]) if j < L else out[j - L]
        if t in eos:
            break
        out.append(t)
    return out


class NgramIndex:
    """Incremental index of a growing token list: n-gram tuple -> sorted end positions.

    ``grams[(t_{e-n}, ..., t_{e-1})]`` lists every ``e`` (the position right after the n-gram,
    i.e. where its copy starts). :meth:`sync` only indexes tokens appended since the last
    call; ``positions_indexed`` counts how many positions were ever indexed (tests use it to
    prove there is no rescan).
    """

    def __init__(self, min_n: int = 1, max_n: int = 4):
        self.min_n, self.max_n = int(min_n), int(max_n)
        self.tokens: list[int] = []
        self.grams: dict[tuple[int, ...], list[int]] = {}
        self.positions_indexed = 0
        self.resets = 0

    def reset(self) -> None:
        self.tokens = []
        self.grams = {}
        self.resets += 1

    def extend(self, new_tokens: Sequence[int]) -> None:
        toks = self.tokens
        grams = self.grams
        lo, hi = self.min_n, self.max_n
        for t in new_tokens:
            toks.append(int(t))
            end = len(toks)
            for n in range(lo, min(hi, end) + 1):
                key = tuple(toks[end - n:end])
                lst = grams.get(key)
                if lst is None:
                    grams[key] = [end]
                else:
                    lst.append(end)
            self.positions_indexed += 1

    def sync(self, tokens: Sequence[int]) -> int:
        """Index what ``tokens`` added since the last call; returns the number of new tokens.
        Tokens only ever get appended; if ``tokens`` does not extend what was indexed
        (checked on the last few indexed tokens) the index is rebuilt."""
        n = len(self.tokens)
        k = min(4, n)
        if len(tokens) < n or (k and list(tokens[n - k:n]) != self.tokens[n - k:]):
            self.reset()
            n = 0
        if len(tokens) > n:
            self.extend(tokens[n:])
        return len(tokens) - n

    def ends(self, gram: Sequence[int]) -> list[int]:
        return self.grams.get(tuple(int(t) for t in gram), [])

    @classmethod
    def build(cls, tokens: Sequence[int], min_n: int = 1, max_n: int = 4) -> "NgramIndex":
        idx = cls(min_n, max_n)
        idx.extend(tokens)
        return idx


@dataclass
class Candidate:
    kind: str                    # "lexical" | "semantic" | "history" (the target's own replies)
    tokens: list[int]            # the copy to propose
    span: tuple[int, int]        # matched window in the context (absolute positions)
    score: float
    ngram: int | None = None
    similarity: float | None = None
    votes: int = 1

    def to_extra(self, length: int | None = None) -> dict:
        """JSON-ready record; ``length``: how many copied tokens were drafted."""
        s, e = self.span
        toks = self.tokens if length is None else self.tokens[:length]
        copied = None if self.kind == "history" else [int(e), int(e) + len(toks)]
        return {"kind": self.kind, "span": [int(s), int(e)],
                "copy_from": copied, "score": round(self.score, 4),
                "ngram": self.ngram,
                "similarity": None if self.similarity is None else round(self.similarity, 4),
                "votes": int(self.votes), "tokens": [int(t) for t in toks]}


def lexical_candidates(index: NgramIndex, length: int, eos: set[int] | frozenset = frozenset(),
                       max_ngram: int | None = None, min_ngram: int | None = None,
                       ) -> tuple[int, list[Candidate]]:
    """Lexical retrieval on ``index.tokens``: (longest matched n or 0, ranked candidates).

    Candidates come from every earlier occurrence (64 most recent per n) of the suffix n-grams
    from the longest matched n down to ``min_ngram``; identical copies are merged (their
    votes add up). Score = 0.5 n/max_ngram + 0.2 recency + 0.3 votes, votes being the fraction
    of examined matches whose copy starts with the same one/two tokens."""
    L = len(index.tokens)
    top = index.max_n if max_ngram is None else max_ngram
    lo = index.min_n if min_ngram is None else min_ngram
    best_n, raw = _suffix_matches(index, length, eos, min(top, L - 1), lo)
    if not raw:
        return 0, []
    return best_n, _absorb_prefixes(_ranked(raw, L, max(1, top)))


def _suffix_matches(index: NgramIndex, length: int, eos, hi: int, lo: int
                    ) -> tuple[int, list[tuple[int, int, list[int]]]]:
    """(longest n with a copy or 0, (n, end, copy) per match): the suffix
    n-grams from ``hi`` down to ``lo``, each end examined once (by its longest n), most recent
    first; matches with an empty copy are left out."""
    toks = index.tokens
    L = len(toks)
    best_n = 0
    raw: list[tuple[int, int, list[int]]] = []   # (n, end, copy)
    seen_ends: set[int] = set()
    for n in range(hi, lo - 1, -1):
        found = False
        for e in reversed(_recent_ends(index.grams.get(tuple(toks[L - n:])), L)):
            if e in seen_ends:
                continue
            seen_ends.add(e)
            cont = copy_tokens(toks, e, length, eos)
            if cont:
                raw.append((n, e, cont))
                found = True
        if found and not best_n:
            best_n = n
    return best_n, raw


def _recent_ends(ends: list[int] | None, L: int) -> list[int]:
    """The most recent ``MAX_MATCHES_PER_NGRAM`` of a sorted ``ends`` list, the current
    position ``L`` itself dropped."""
    if not ends:
        return []
    cut = bisect_left(ends, L)                # drop the current position itself
    return ends[max(0, cut - MAX_MATCHES_PER_NGRAM):cut]


def _vote_shares(raw: list[tuple[int, int, list[int]]]) -> list[float]:
    """Per match: the mean of the shares of matches whose copy starts with the same
    first token and with the same first two tokens."""
    first: dict[int, int] = {}
    first2: dict[tuple[int, ...], int] = {}
    for _, _, c in raw:
        first[c[0]] = first.get(c[0], 0) + 1
        first2[tuple(c[:2])] = first2.get(tuple(c[:2]), 0) + 1
    total = len(raw)
    return [(first[c[0]] + first2[tuple(c[:2])]) / (2.0 * total) for _, _, c in raw]


def _ranked(raw: list[tuple[int, int, list[int]]], L: int, norm_n: int) -> list[Candidate]:
    """The matches scored and merged by copy (votes add up; the best-scoring match's
    span and n stay), best first (ties: the most recent)."""
    merged: dict[tuple[int, ...], Candidate] = {}
    for (n, e, c), votes in zip(raw, _vote_shares(raw)):
        recency = 1.0 / (1.0 + (L - e) / RECENCY_SCALE)
        score = W_NGRAM * n / norm_n \
            + W_RECENCY * recency + W_VOTES * votes
        key = tuple(c)
        old = merged.get(key)
        if old is None:
            merged[key] = Candidate("lexical", c, (e - n, e), score, ngram=n)
        else:
            old.votes += 1
            if score > old.score:
                old.score, old.span, old.ngram = score, (e - n, e), n
    return sorted(merged.values(), key=lambda c: (-c.score, -c.span[1]))


def _absorb_prefixes(ranked: list[Candidate]) -> list[Candidate]:
    """A copy cut short (by an EOS) is extended by a match predicting the same tokens
    and more (same prediction, more tokens to draft), keeping the better score and adding the
    votes; a prefix of a better candidate adds nothing and is dropped."""
    cands: list[Candidate] = []
    for c in ranked:
        for k in cands:
            if len(c.tokens) > len(k.tokens) and c.tokens[:len(k.tokens)] == k.tokens:
                k.tokens, k.span, k.ngram = c.tokens, c.span, c.ngram
                k.votes += c.votes
                break
            if c.tokens == k.tokens[:len(c.tokens)]:
                break          # a prefix of a better candidate: adds nothing
        else:
            cands.append(c)
    return cands
