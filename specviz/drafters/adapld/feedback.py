"""AdaPLD's control of each round (docs/methods/adapld.md, idea 4): which record judges a round's
source, how long the round drafts, and what the verify taught.

The estimates themselves (:class:`~.control.SourceStats`: a1, a2 and the draft length D that
maximises expected committed tokens per unit of verify cost) live in :mod:`.control`; this is the
drafter's side of them, a mixin of :class:`~specviz.drafters.adapld.drafter.AdaPLDDrafter` (it reads
the drafter's settings, stats and cost model):

* :meth:`RoundControl.source_stats` — a source's record. Weak evidence (``lex1``, ``lex1~``,
  ``lex2~``, ``sem``, ``semfree``) starts from a sceptical prior (a1 = 0.25) and, once paused, is
  re-probed 16 .. 64 rounds apart; ``lex2`` / ``lex3`` start from the default prior (a1 = 0.6),
  any other source (``lex3~``) from the pooled estimate of all sources.
* :meth:`RoundControl._plan` — the round's draft length D, whether it is a probe, and how many
  alternative branches it may add.
* :meth:`RoundControl.observe` — the verify's lesson. When even D = 1 does not beat plain
  decoding by 3 %, the source is switched off (empty drafts, ``retrieval: "off"``) and re-probed
  after 4, 8, 16, 32 rounds (weak sources: 16, 32, 64). Alternative branches are kept only while
  their expected gain (an EMA of the extra tokens an alternative branch delivered, per
  alternative) pays for their extra nodes. The sources proposed but not drafted are scored on
  the round's committed tokens (``shadow``, :mod:`.retrieve`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ..base import VerifyFeedback
from .control import (EMA_DECAY, WEAK, WEAK_PRIOR, SourceStats, harmonic, inherited, probe_gaps,
                      remember)

if TYPE_CHECKING:
    from ...trace import Round

ON_MARGIN = 0.03               # a draft must beat plain decoding by 3% of a step to be worth it
#: sources judged on their own record from the start (the default prior), not on the pooled
#: estimate: an exact match of two or more tokens is the evidence lookup rests on, and one
#: failing semantic source must not pause it before it was ever tried
OWN_PRIOR = ("lex2", "lex3")
PROBE_MAX = 64                 # longest probe draft (the prior's best length up to this)
POOLED = "*"                   # the experience record's key for the pooled stats
ALT_GAIN_PRIOR = 0.25          # prior extra accepted tokens per alternative branch (harmonic)
ALT_GAIN_DRIFT = 0.02          # per chain round, alt_gain drifts back towards the prior


@dataclass
class Pending:
    """What a round drafted, kept for :meth:`RoundControl.observe` to judge."""

    source: str
    probe: bool
    first_len: int
    n_alts: int = 0
    copy_from: int | None = None   # where the best branch's copy starts in the context


def common_prefix(toks: Sequence[int], committed: Sequence[int]) -> int:
    """How many of ``toks`` the target wrote too, from the first on."""
    m = 0
    while m < min(len(toks), len(committed)) and toks[m] == committed[m]:
        m += 1
    return m


def first_branch(pend: Pending, rnd: Round, accepted: int) -> tuple[int, int]:
    """(length, accepted tokens) of the round's best-ranked branch: all of a chain; in a tree,
    nodes 0..first_len-1 (inserted first, as a chain)."""
    if rnd.parents is None:
        return len(rnd.draft), accepted
    first_len = 0
    while first_len < min(len(rnd.parents), pend.first_len) \
            and rnd.parents[first_len] == first_len - 1:
        first_len += 1
    path = list(rnd.accepted_path)
    first_acc = 0
    while first_acc < min(len(path), first_len) and path[first_acc] == first_acc:
        first_acc += 1
    return first_len, min(first_acc, accepted)


class RoundControl:
    """source_stats -> plan a round; observe -> learn from its verify."""

    # ------------------------------------------------------------------ records
    def source_stats(self, source: str, round_index: int = 0) -> SourceStats:
        """Stats of one retrieval source (``learn``: inherited from earlier runs first). A source
        seen for the first time starts from the default prior (``lex2`` / ``lex3``), from the
        sceptical prior (weak evidence, ``WEAK``), or else from the pooled estimate of all
        sources (weight of two rounds), so after a run of rejections a new kind of match does
        not get a fresh optimistic budget; if its start does not pay, it starts switched off
        (first probe after :func:`probe_gaps` rounds)."""
        st = self.stats.get(source)
        if st is None and self.learn:
            st = inherited(self.record, source, round_index)
            if st is not None:
                self.stats[source] = st
        if st is None and source in OWN_PRIOR:
            st = self.stats[source] = SourceStats()
        if st is None:
            if source in WEAK:
                st = SourceStats(*WEAK_PRIOR)
            else:
                g = self.pooled
                st = SourceStats(2.0 * g.a1, 2.0 * (1.0 - g.a1), 2.0 * g.a2, 2.0 * (1.0 - g.a2))
            if self.adaptive and st.best_length(self.max_draft, self.cost_model)[1] < 1.0 + ON_MARGIN:
                st.pause(round_index, probe_gaps(source))
            self.stats[source] = st
        return st

    def _usable(self, source: str, round_index: int) -> bool:
        st = self.source_stats(source, round_index)
        return not (self.adaptive and self._paused(st, round_index))

    @staticmethod
    def _paused(st: SourceStats, round_index: int) -> bool:
        """Switched off and not yet due for a probe."""
        return not st.due(round_index)

    # ------------------------------------------------------------------ plan
    def _plan(self, st: SourceStats, depth_cap: int, round_index: int
              ) -> tuple[int, bool, int] | None:
        """(draft length D, is it a probe, most alternative branches) for a round whose best
        match comes from the source ``st``; None while that source is paused. A probe of a
        switched-off source drafts a chain as long as the default prior would."""
        alts = self.max_branches - 1 if self.branches and not self.first_branch_only else 0
        if not self.adaptive:
            return depth_cap, False, alts
        if st.off:
            if self._paused(st, round_index):
                return None
            return SourceStats().best_length(min(depth_cap, PROBE_MAX), self.cost_model)[0], \
                True, 0
        return st.best_length(depth_cap, self.cost_model)[0], False, alts

    # ------------------------------------------------------------------ observe
    def observe(self, feedback: VerifyFeedback) -> None:
        """Learn from the verify: the sources not drafted, then the drafted best-ranked branch
        (the pooled and its source's record, the alternatives' gain, on / off)."""
        pend, self._pending = self._pending, None
        rnd = feedback.round
        self._score_shadow(rnd)
        if pend is None or not rnd.draft:
            return
        a = int(rnd.accepted)
        first_len, first_acc = first_branch(pend, rnd, a)
        self.follower.observe(pend.copy_from, first_len, first_acc, rnd.committed,
                              list(self.index.tokens) + list(rnd.committed))
        self.pooled.update(first_acc, first_acc >= first_len)
        remember(self.record, POOLED, self.pooled)
        if pend.source == "copy":  # a followed copy: its own streak, not a source's statistics
            return
        st = self.source_stats(pend.source, rnd.index)
        st.update(first_acc, first_acc >= first_len)
        self._learn_alt_gain(pend, rnd, a - first_acc)
        if not self.adaptive:
            return
        self._switch(st, pend.source, rnd.index)
        remember(self.record, pend.source, st)

    def _score_shadow(self, rnd: Round) -> None:
        """The sources proposed but not drafted, scored on what the target wrote."""
        shadow, self._shadow = self._shadow, []
        for key, toks in shadow:
            m = common_prefix(toks, rnd.committed)
            # m == len(committed): what followed is unknown (censored), so no failure counted
            self.source_stats(key, rnd.index).update(m, m >= min(len(toks), len(rnd.committed)))

    def _learn_alt_gain(self, pend: Pending, rnd: Round, extra: int) -> None:
        """The alternatives' expected gain: ``extra`` tokens they delivered beyond the best
        branch, per alternative (harmonic), or a drift back to the prior on a chain round."""
        if rnd.parents is not None and pend.n_alts:
            gain = max(0, extra) / harmonic(pend.n_alts)
            self.alt_gain = EMA_DECAY * self.alt_gain + (1.0 - EMA_DECAY) * gain
        else:  # no evidence this round: drift slowly back to the prior
            self.alt_gain += ALT_GAIN_DRIFT * (ALT_GAIN_PRIOR - self.alt_gain)

    def _switch(self, st: SourceStats, source: str, round_index: int) -> None:
        """Switch ``source`` off when even its best draft length does not pay; a probe's outcome
        switches it back on or schedules the next probe."""
        _, thr = st.best_length(self.max_draft, self.cost_model)
        gaps = probe_gaps(source)
        if st.off:                                   # this was a probe
            st.probed(round_index, thr >= 1.0 + ON_MARGIN, gaps)
        elif thr < 1.0 + ON_MARGIN:
            st.pause(round_index + 1, gaps)
