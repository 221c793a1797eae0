"""Rejected-suffix alignment (docs/methods/retrace.md, ReTrace's probe): what were the tokens a
round rejected worth?

For every chain round with a rejected suffix, each rejected draft token (slot s, predicted
absolute position P = round start + s - 1) is compared with the token finally committed at
P + offset for offsets -3 .. +3, and -- where the drafter recorded them in ``extras['topk']`` --
the final token at P with the drafter's top-k at that slot. A rejected token that matches the
final text one or two positions later was right but mis-aligned (the drafter skipped or
repeated a token): the signal ReTrace carries into the next round. Slot 1 of the rejected
suffix is the first rejected token itself (under greedy verification it never matches at
offset 0: the target chose otherwise there).

Pure functions of :class:`~specviz.trace.Trace` records; works for any chain method (PLD,
AdaPLD, DFlash). Tree rounds are skipped (a tree's rejected nodes have no single position
order).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ..trace import Trace

OFFSETS = tuple(range(-3, 4))


@dataclass
class RejectedToken:
    """One rejected draft token and what the final text holds around its position."""

    round: int
    slot: int                        # 1-based position in the rejected suffix
    position: int                    # absolute position it was drafted for
    token: int
    matches: dict[int, bool]         # offset -> draft token == final token at position+offset
    topk_hit: bool | None = None     # final token at position in the drafter's top-k (None:
    #                                  not recorded)
    partner: bool = False            # the next round drafted a token for this position

    @property
    def exact(self) -> bool:
        return self.matches.get(0, False)

    @property
    def best_offset(self) -> int | None:
        """The matching offset nearest 0 (ties: the later one), or None."""
        hits = [o for o, m in self.matches.items() if m]
        return min(hits, key=lambda o: (abs(o), -o)) if hits else None


def final_tokens(trace: Trace) -> list[int]:
    """Prompt + every committed token: the text each position finally holds."""
    return [int(t) for t in trace.prompt_ids] + [int(t) for t in trace.output_ids]


def _drafted_positions(r) -> set[int]:
    return {r.start + i for i in range(len(r.draft))} if not r.is_tree else set()


def rejected_tokens(trace: Trace, offsets: Sequence[int] = OFFSETS) -> list[RejectedToken]:
    """Every rejected token of every chain round, aligned with the final text."""
    final = final_tokens(trace)
    out = []
    rounds = trace.rounds
    for i, r in enumerate(rounds):
        if r.is_tree or not r.rejected_suffix:
            continue
        nxt = _drafted_positions(rounds[i + 1]) if i + 1 < len(rounds) else set()
        topk = (r.extras or {}).get("topk")
        for j, tok in enumerate(r.rejected_suffix):
            node = r.accepted + j
            pos = r.start + node
            matches = {o: 0 <= pos + o < len(final) and final[pos + o] == int(tok)
                       for o in offsets}
            hit = None
            if isinstance(topk, list) and node < len(topk) and pos < len(final):
                hit = final[pos] in [int(x) for x in topk[node]]
            out.append(RejectedToken(r.index, j + 1, pos, int(tok), matches, hit, pos in nxt))
    return out


@dataclass
class AlignmentSummary:
    """Rates over a set of rejected tokens (None where nothing was counted)."""

    rejected: int = 0
    exact: float | None = None
    best_offset: float | None = None
    topk: float | None = None
    partner: float | None = None
    by_offset: dict[int, float] = field(default_factory=dict)


def _rate(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def summarize(tokens: Iterable[RejectedToken]) -> AlignmentSummary:
    toks = list(tokens)
    if not toks:
        return AlignmentSummary()
    offsets = sorted({o for t in toks for o in t.matches})
    recorded = [t.topk_hit for t in toks if t.topk_hit is not None]
    return AlignmentSummary(
        rejected=len(toks), exact=_rate([t.exact for t in toks]),
        best_offset=_rate([t.best_offset is not None for t in toks]),
        topk=_rate(recorded), partner=_rate([t.partner for t in toks]),
        by_offset={o: _rate([t.matches.get(o, False) for t in toks]) for o in offsets})


def by_slot(tokens: Iterable[RejectedToken]) -> dict[int, AlignmentSummary]:
    """The summary per slot of the rejected suffix (1 = the first rejected token)."""
    groups: dict[int, list[RejectedToken]] = {}
    for t in tokens:
        groups.setdefault(t.slot, []).append(t)
    return {s: summarize(g) for s, g in sorted(groups.items())}


def by_category(traces: dict[str, list[Trace]]) -> dict[str, AlignmentSummary]:
    """The summary per prompt category (``{category: [traces]}``), plus ``all``."""
    out, every = {}, []
    for cat, trs in traces.items():
        toks = [t for tr in trs for t in rejected_tokens(tr)]
        every += toks
        out[cat] = summarize(toks)
    out["all"] = summarize(every)
    return out


def table_rows(traces: dict[str, dict[str, list[Trace]]]) -> list[dict]:
    """Rows of the alignment table: per method (``{method: {category: [traces]}}``), per slot
    of the rejected suffix and for all slots: rejected tokens, exact / best-offset / top-k match
    rates, and how often the next round drafted a token at that position."""
    rows = []
    for method, cats in traces.items():
        toks = [t for trs in cats.values() for tr in trs for t in rejected_tokens(tr)]
        groups = list(by_slot(toks).items()) + [("all", summarize(toks))]
        for slot, s in groups:
            rows.append({"method": method, "slot": slot, "rejected": s.rejected, "exact": s.exact,
                         "best_offset": s.best_offset, "topk": s.topk, "partner": s.partner})
        for cat, trs in cats.items():
            s = summarize(t for tr in trs for t in rejected_tokens(tr))
            rows.append({"method": method, "slot": f"all ({cat})", "rejected": s.rejected,
                         "exact": s.exact, "best_offset": s.best_offset, "topk": s.topk,
                         "partner": s.partner})
    return rows
