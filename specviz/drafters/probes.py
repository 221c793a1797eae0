"""Pausing a draft source that does not pay, with exponential back-off probes.

AdaPLD's retrieval sources (:class:`~specviz.drafters.adapld.control.SourceStats`) and a block
drafter's forward gate (:class:`~specviz.drafters.dflash.block_cut.ForwardGate`) both switch a
source off while its rounds commit fewer tokens than they cost, and try it again later: the first
probe ``gaps[0]`` rounds after the pause, each failed probe doubling the wait up to ``gaps[1]``, a
probe that pays switching it back on. This is that schedule, once.
"""
from __future__ import annotations

from dataclasses import dataclass, field

PROBE_GAPS = (4, 32)   # first re-probe after 4 rounds, doubling up to 32


@dataclass
class Paused:
    """On/off state of a draft source and when it is next probed (fields are keyword-only, so a
    subclass keeps its own positional fields)."""

    off: bool = field(default=False, kw_only=True)
    next_probe: int = field(default=0, kw_only=True)
    gap: int = field(default=PROBE_GAPS[0], kw_only=True)

    def due(self, round_index: int) -> bool:
        """Draft this round? (on, or paused and due for a probe)"""
        return not self.off or round_index >= self.next_probe

    def pause(self, now: int, gaps: tuple[int, int]) -> None:
        """Switch off: the first probe ``gaps[0]`` rounds after ``now``, the next gap doubled
        (up to ``gaps[1]``)."""
        self.off = True
        self.next_probe = now + gaps[0]
        self.gap = min(gaps[1], 2 * gaps[0])

    def probed(self, round_index: int, paid: bool, gaps: tuple[int, int]) -> None:
        """A probe ran in round ``round_index``: back on if it ``paid``, else wait ``gap`` more
        rounds and double the gap (up to ``gaps[1]``)."""
        if paid:
            self.off, self.gap = False, gaps[0]
        else:
            self.next_probe = round_index + 1 + self.gap
            self.gap = min(gaps[1], 2 * self.gap)
