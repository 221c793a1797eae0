"""AdaPLD's adaptive control (docs/methods/adapld.md): how long a draft should be, given what each
retrieval source has delivered and what a longer verify costs on this machine.

* :class:`SourceStats` — decayed acceptance counts per retrieval source: a1 = P(first drafted
  token accepted), a2 = P(next accepted | previous accepted); the draft length D maximises
  expected committed tokens per unit of verify cost, (1 + a1 (1 - a2^D) / (1 - a2)) / c(D + 1).
* ``specviz.costs.cost_curve`` — c(k): ``"auto"`` is the verify-cost model measured on the loaded
  target (:mod:`specviz.costs`: calibrated at start, refined online by the engine from the rounds'
  own forwards; flat on an accelerator); ``"flat"`` the accelerator curve; ``"cpu"`` the fixed curve
  measured once on a busy 2-core CPU with torch on one thread (kept to reproduce earlier tables and
  for deterministic tests).
* :func:`stats_key`, ``WEAK`` — which record a round's draft is judged on (the source, split by
  whether its candidates agree), and the sceptical prior and sparse probes of weak evidence.
* :class:`CopyFollower` — long copies: when a round's copied span was accepted in full and the
  target's own token continued it too, the next round continues from the same span (it has been
  right so far) instead of searching again, and the draft doubles (D, 2D, 4D ... up to
  ``max_copy``) while the copy keeps being accepted; the first rejection ends the streak, and the
  normal search and control take over again (fall back fast). Where a broken copy is re-found,
  the skipped source span and what the target wrote instead are learned as an edit
  (:mod:`..lookup.copy_edits`), and later copies apply it (a renamed name at its next use).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ...costs import CostModel
from ..lookup.copy_edits import EditedCopy, EditMemory
from ..lookup.index import copy_tokens
from ..probes import PROBE_GAPS, Paused

EMA_DECAY = 0.85
PRIOR = (1.2, 0.8, 1.4, 0.6)   # pseudo-counts (s1, f1, s2, f2): a1 = 0.6, a2 = 0.7 at the start
@dataclass
class SourceStats(Paused):
    """Decayed acceptance counts of one retrieval source (for its best-ranked branch), plus its
    on/off state (:class:`~specviz.drafters.probes.Paused`). a1 = P(first token accepted),
    a2 = P(next accepted | previous accepted)."""

    s1: float = PRIOR[0]
    f1: float = PRIOR[1]
    s2: float = PRIOR[2]
    f2: float = PRIOR[3]

    @property
    def a1(self) -> float:
        return self.s1 / (self.s1 + self.f1)

    @property
    def a2(self) -> float:
        return self.s2 / (self.s2 + self.f2)

    def expected_accepted(self, d: int) -> float:
        a1, a2 = self.a1, min(self.a2, 0.999)
        return a1 * (1.0 - a2 ** d) / (1.0 - a2)

    def best_length(self, max_len: int, cost: CostModel) -> tuple[int, float]:
        """(draft length maximising expected tokens per unit of verify cost, that ratio)."""
        best = (1, -1.0)
        for d in range(1, max(1, max_len) + 1):
            thr = (1.0 + self.expected_accepted(d)) / cost.relative(d + 1)
            if thr > best[1] + 1e-9:
                best = (d, thr)
        return best

    def update(self, accepted: int, full: bool) -> None:
        self.s1 *= EMA_DECAY
        self.f1 *= EMA_DECAY
        if accepted >= 1:
            self.s1 += 1.0
            self.s2 = self.s2 * EMA_DECAY + (accepted - 1)
            self.f2 *= EMA_DECAY
            if not full:
                self.f2 += 1.0
        else:
            self.f1 += 1.0


#: weak evidence: one matched token, candidates that disagree on the next token, or a
#: semantic match (used only when lexical matching found at most one token). Such a source
#: starts from a sceptical prior (a1 = 0.25, a2 = 0.5, two rounds of weight), not from the
#: pooled record, which long exact copies make optimistic: on a steep verify-cost curve it then
#: waits for a probe instead of drafting at once; where verifying is nearly free it still drafts
WEAK = ("lex1", "lex1~", "lex2~", "sem", "semfree", "hist")
WEAK_PRIOR = (0.5, 1.5, 1.0, 1.0)
#: a paused weak source is re-probed after 16 rounds, doubling up to 64 (a strong one: 4 .. 32):
#: a probe costs a verify forward, and a weak source seldom turns into a paying one
WEAK_PROBE_GAPS = (16, 64)


def probe_gaps(source: str) -> tuple[int, int]:
    """(first, longest) rounds between probes of a paused source."""
    return WEAK_PROBE_GAPS if source in WEAK else PROBE_GAPS


def stats_key(source: str, cands: Sequence) -> str:
    """The adaptive control's key for a round: the retrieval source, split by whether the
    candidates agree on the next token. Matches whose copies disagree are far less
    often right than unanimous ones of the same n-gram length (measured on dev rollouts: first
    token right 10-30 % vs 30-70 % for 1-grams), so they keep their own acceptance record."""
    if source.startswith("lex") and len({c.tokens[0] for c in cands if c.tokens}) > 1:
        return source + "~"
    return source


#: evidence a new run inherits from earlier runs of the same model on this machine, in rounds:
#: enough to start a source where its record stands, little enough that the new prompt's own
#: rounds outweigh it after a few rounds (prompts differ more than machines)
EXPERIENCE_WEIGHT = 4.0
_EXPERIENCE: dict[tuple, dict[str, tuple]] = {}


def experience(key: tuple | None) -> dict[str, tuple]:
    """The per-source record that runs of one model (``key``: :func:`specviz.costs.model_key`)
    in this process share: ``source -> (a1, a2, off, gap)`` of the last run that used the
    source. Like the verify-cost model, it is measured where it is used, not tuned anywhere."""
    return _EXPERIENCE.setdefault(key or (), {})


def clear_experience() -> None:
    _EXPERIENCE.clear()


def remember(store: dict[str, tuple], source: str, st: "SourceStats") -> None:
    store[source] = (st.a1, st.a2, st.off, st.gap)


def inherited(store: dict[str, tuple], source: str, round_index: int) -> "SourceStats | None":
    """A source's starting stats from ``store`` (None when no earlier run used it): its
    acceptance estimates with ``EXPERIENCE_WEIGHT`` rounds of weight, and, if it ended switched
    off, switched off until a probe after its last probe gap."""
    rec = store.get(source)
    if rec is None:
        return None
    a1, a2, off, gap = rec
    w = EXPERIENCE_WEIGHT
    st = SourceStats(w * a1, w * (1 - a1), w * a2, w * (1 - a2))
    if off:
        # the pause keeps its back-off (offline: capping it at 4 or 8 rounds probed more than
        # it won)
        st.off, st.gap = True, int(gap)
        st.next_probe = round_index + st.gap
    return st


def harmonic(k: int) -> float:
    return sum(1.0 / i for i in range(1, k + 1))


COPY_PRIOR = (1.8, 0.2, 3.6, 0.4)  # a copy in step is usually right: a1 = 0.9, a2 = 0.9
RESYNC = (-2, 24, 6)  # after a break, look for the copy again at anchor-2 .. anchor+24, 6 rounds
INSERT_CONTEXT = 2    # an inserted span is learned as an edit of the 2 source tokens before it


@dataclass
class CopyFollower:
    """Where the copy that has been right so far continues (see the module docstring).

    ``pointer``: the context position whose token the next generated token should equal (the
    copy is in step); ``streak``: consecutive rounds whose copied draft was accepted in full;
    ``anchor``: where an interrupted copy stood -- an edit (a renamed identifier, an inserted
    comment) breaks the copy for a few tokens, after which the text resumes a little further
    on in the same span, so the next rounds look for it there first (``resync``). ``broke_at``:
    (source position, context position) where the copy and the target's text parted; when the
    copy is re-found, the two spans in between are learned as an edit (``memory``)."""

    max_copy: int = 64
    pointer: int | None = None
    streak: int = 0
    anchor: int | None = None
    anchor_age: int = 0
    stats: SourceStats = field(default_factory=lambda: SourceStats(*COPY_PRIOR))
    memory: EditMemory = field(default_factory=EditMemory)
    broke_at: tuple[int, int] | None = None
    last_copy: EditedCopy | None = None  # the copy drafted this round (edits applied)
    _drafted: int = 0  # length of the copy drafted this round (0: this round did not follow)

    def length(self, base: int, cost: CostModel, margin: float = 0.0) -> int:
        """Draft length of a followed copy: at most ``base`` doubled per round of the streak
        (up to ``max_copy``), and no longer than pays for itself under ``cost``. A copy
        re-found after a break (no streak: a guess) is drafted only while the copy's record
        beats plain decoding by ``margin``; else 0 (the round goes to the search and its
        control)."""
        cap = min(self.max_copy, base * 2 ** min(self.streak, 6))
        d, thr = self.stats.best_length(cap, cost)
        return d if self.streak or thr >= 1.0 + margin else 0

    def resync(self, tokens: Sequence[int], max_n: int = 4) -> int | None:
        """Re-find an interrupted copy near its anchor: the position right after the longest
        match (>= 2 tokens, or 1 token at most 4 past the anchor) of the context's suffix; what
        lies between the break and the match is learned as an edit."""
        if self.anchor is None:
            return None
        L, best = len(tokens), (0, None)
        for q in range(max(1, self.anchor + RESYNC[0]), min(L - 1, self.anchor + RESYNC[1])):
            m = 0
            while m < max_n and q - 1 - m >= 0 and tokens[q - 1 - m] == tokens[L - 1 - m]:
                m += 1
            ok = m >= 2 or (m == 1 and q <= self.anchor + 4)
            if ok and m > best[0]:
                best = (m, q)
        if best[1] is not None:
            self._learn_edit(tokens, best[1], best[0])
        return best[1]

    def _learn_edit(self, tokens: Sequence[int], q: int, m: int) -> None:
        """The copy broke at ``broke_at`` and resumes at ``q`` (its last ``m`` tokens matched):
        source[break .. q - m] was rewritten as context[break .. L - m]."""
        if self.broke_at is None:
            return
        (src, out), self.broke_at = self.broke_at, None
        L = len(tokens)
        if src == q - m and out < L - m:  # an insertion: keyed by the tokens before it
            k = INSERT_CONTEXT
            if src >= k and out >= k and tokens[src - k:src] == tokens[out - k:out]:
                src, out = src - k, out - k
        if src <= q - m and out <= L - m:
            self.memory.learn(tokens[src:q - m], tokens[out:L - m])

    def next_copy(self, tokens: Sequence[int], length: int, eos) -> list[int]:
        """The next ``length`` tokens of the followed span, learned edits applied (empty when
        there is none)."""
        p = self.pointer
        self.last_copy = None
        if p is None or not 0 < p < len(tokens) or tokens[p - 1] != tokens[-1]:
            return []
        if self.memory.edits:
            edited = self.memory.apply(tokens, p, length, eos)
            if edited.edits:
                self.last_copy = edited
                return list(edited.tokens)
        cont = copy_tokens(tokens, p, length, eos)  # may run past the context (a loop)
        self.last_copy = EditedCopy(cont, [(p + i, p + i + 1) for i in range(len(cont))],
                                    [None] * len(cont))
        return cont

    def drafted(self, n: int) -> None:
        self._drafted = n

    def observe(self, copy_from: int | None, draft_len: int, accepted: int,
                committed: Sequence[int], context: Sequence[int]) -> None:
        """After a chain round copied ``draft_len`` tokens from ``copy_from``: keep following
        when everything was accepted and the target's own token continued the span too;
        otherwise remember where the copy broke (the anchor for :meth:`resync`)."""
        followed, self._drafted = self._drafted, 0
        copy, self.last_copy = self.last_copy, None
        if followed:
            self.stats.update(accepted, accepted >= draft_len)
        if copy_from is None or draft_len == 0:
            self._lost()
            return
        if followed and copy is not None and copy.tokens:
            nxt, wrong = copy.source_after(min(accepted, draft_len), copy_from)
            self.memory.forget(wrong)    # the target wrote something else where it applied
        else:
            nxt = copy_from + min(accepted, draft_len)
        if accepted >= draft_len and nxt < len(context) and len(committed) > draft_len \
                and int(committed[draft_len]) == int(context[nxt]):
            self.pointer, self.anchor, self.anchor_age = nxt + 1, nxt + 1, 0
            self.streak = self.streak + 1 if followed else 1
            self.broke_at = None
        else:
            self.pointer, self.streak = None, 0
            if accepted or followed:
                self.anchor, self.anchor_age = nxt, 0
                self.broke_at = (nxt, len(context) - len(committed) + min(accepted, draft_len))
            else:
                self._lost()

    def _lost(self) -> None:
        self.pointer, self.streak = None, 0
        self.anchor_age += 1
        if self.anchor_age > RESYNC[2]:
            self.anchor = self.broke_at = None
