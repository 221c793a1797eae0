"""What a rejected suffix could add at most (docs/methods/retrace.md, ReTrace).

ReTrace carries round r's rejected suffix into round r+1. Whatever the fusion learns, the
*tokens* of that suffix can help round r+1 only where the final text holds them where round
r+1 drafts. This module measures that ceiling on a saved trace: round r+1 accepted ``acc``
tokens of its own draft and then missed at position ``at = s1 + acc`` (s1: its first drafted
position); for every offset o, round r's rejected main-path tokens shifted by o positions are
laid over positions at, at + 1, ... and compared with the final text. Where they match, the
matching run is tokens round r+1 would have added had its draft taken the carried tokens from
its first miss on (greedy: each extra token is one more accepted slot; the round's own
accepted prefix is kept). A bound, not a method: which offset, and where in the tree to hang
such a branch, are unknown when drafting.

Conventions: the *main path* of a round is its draft for a chain, and for a DFlash tree the
chain of rank-0 nodes (each slot's top word; ``extras['tree_ranks']``; trees without ranks --
lookup branches -- are skipped). Its token at depth j (0-based) was drafted for position
``start + j``; the first main-path token off the accepted path sits at depth m, so the rejected
main tokens are depths >= m. For offset o the carried run at position ``at`` begins with the
main token at depth j0 = at - start - o (j0 >= m: only rejected tokens; o = +1 re-uses a
rejected token one position later, o = -1 skips one). ``tau_bound`` adds every round's best
gain to its committed tokens -- first order: the rounds after it are taken as they were.
Pure functions of :class:`~specviz.trace.Trace` records.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ..trace import Trace
from .alignment import final_tokens

BRANCH_OFFSETS = (-1, 0, 1, 2)


def main_path(r) -> tuple[list[int], int] | None:
    """(the round's main-path tokens, depth m of its first token off the accepted path), or
    None for a tree without slot ranks."""
    if not r.is_tree:
        return [int(t) for t in r.draft], int(r.accepted)
    ranks = (r.extras or {}).get("tree_ranks")
    if not isinstance(ranks, list) or len(ranks) != len(r.draft):
        return None
    nodes, cur = [], -1
    for i, (par, rank) in enumerate(zip(r.parents, ranks)):
        if int(par) == cur and int(rank) == 0:
            nodes.append(i)
            cur = i
    path = r.path
    m = 0
    while m < len(nodes) and m < len(path) and nodes[m] == path[m]:
        m += 1
    return [int(r.draft[i]) for i in nodes], m


def _match(branch: Sequence[int], final: Sequence[int], at: int) -> int:
    n = 0
    while n < len(branch) and at + n < len(final) and branch[n] == final[at + n]:
        n += 1
    return n


@dataclass
class BranchGain:
    """Round ``round`` + 1 with round ``round``'s rejected main path carried from its miss on."""

    round: int                      # r (the round whose suffix is carried)
    rejected: int                   # rejected main-path tokens of round r
    accepted_next: int              # what round r+1 accepted on its own
    gain: dict[int, int]            # offset -> tokens the carried run would have added

    @property
    def best(self) -> int:
        return max(self.gain.values(), default=0)


def branch_gains(trace: Trace, offsets: Sequence[int] = BRANCH_OFFSETS) -> list[BranchGain]:
    """One :class:`BranchGain` per round that has a rejected main path and a next round."""
    final = final_tokens(trace)
    rounds = trace.rounds
    out = []
    for r, nxt in zip(rounds, rounds[1:]):
        main, m = main_path(r) or ([], 0)
        if m >= len(main):            # no ranks (a lookup tree), or nothing rejected
            continue
        acc = int(nxt.accepted)
        at = int(nxt.start) + acc          # where round r+1 missed (its bonus token's position)
        gain = {}
        for o in offsets:
            j0 = at - int(r.start) - o
            gain[o] = _match(main[j0:], final, at) if m <= j0 < len(main) else 0
        out.append(BranchGain(int(r.index), len(main) - m, acc, gain))
    return out


@dataclass
class SuffixBound:
    """Over a set of traces: rounds, committed tokens, and what the branches would have added."""

    rounds: int = 0
    tokens: int = 0
    carried: int = 0                                   # rounds with a rejected main path
    by_offset: dict[int, int] = field(default_factory=dict)
    best: int = 0                                      # the best offset per round (an oracle)

    @property
    def tau(self) -> float | None:
        return self.tokens / self.rounds if self.rounds else None

    @property
    def tau_bound(self) -> float | None:
        """tau with every round's best branch gain added (first order, see the module doc)."""
        return (self.tokens + self.best) / self.rounds if self.rounds else None


def suffix_bound(traces: Iterable[Trace], offsets: Sequence[int] = BRANCH_OFFSETS) -> SuffixBound:
    out = SuffixBound(by_offset={o: 0 for o in offsets})
    for tr in traces:
        out.rounds += len(tr.rounds)
        out.tokens += sum(len(r.committed) for r in tr.rounds)
        for g in branch_gains(tr, offsets):
            out.carried += 1
            out.best += g.best
            for o, n in g.gain.items():
                out.by_offset[o] += n
    return out


def bound_rows(traces: dict[str, dict[str, list[Trace]]],
               offsets: Sequence[int] = BRANCH_OFFSETS) -> list[dict]:
    """Rows per method and category (``{method: {category: [traces]}}``) plus ``all``: rounds,
    tau, rounds with a rejected main path, tokens the carried suffix adds per offset and at the
    best offset, and tau with them."""
    rows = []
    for method, cats in traces.items():
        groups = list(cats.items()) + [("all", [t for trs in cats.values() for t in trs])]
        for cat, trs in groups:
            b = suffix_bound(trs, offsets)
            rows.append({"method": method, "category": cat, "rounds": b.rounds,
                         "tau": b.tau, "carried": b.carried,
                         **{f"gain_{o:+d}": b.by_offset[o] for o in offsets},
                         "gain_best": b.best, "tau_bound": b.tau_bound})
    return rows
