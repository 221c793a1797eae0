"""AdaPLD's drafts that need no search (docs/methods/adapld.md, ideas 5 and 7; beyond the paper): a
long copy that has been right so far, and the opening of a reply.

* **Long copies** (editing and extraction tasks repeat long spans of the input). When a round's copy
  was accepted in full and the target's own token continued the same span, the next round follows
  that span (source ``copy``) instead of searching again, doubling the draft each round
  (``max_draft`` x 2, 4, 8 ... up to ``max_copy``, default 64) while it keeps being accepted; the
  first rejection drops back to the search and control. Where a broken copy is re-found a few tokens
  on, the skipped source span and what the target wrote instead are learned as an edit
  (:mod:`..lookup.copy_edits`), and later copies apply it (a renamed identifier at its next use).
  The follower itself is :class:`~.control.CopyFollower`.
* **Reply openings** (with the history store): in a reply's first round the context ends with the
  chat template, the same for every prompt, so lookup has nothing to go on. The store also indexes
  its earlier prompts (:mod:`..lookup.openings`: sparse tf-idf vectors); the first round drafts the
  consensus opening of the 8 most similar ones (source ``open``, e.g. "```python\n" for an editing
  request) and, where the opening leads into text the prompt quotes, continues it by a copy of that
  text (:func:`..lookup.openings.with_copy`).

A mixin of :class:`~specviz.drafters.adapld.drafter.AdaPLDDrafter`: it reads the drafter's index,
follower, store and settings, and writes the round's :class:`~.feedback.Pending`.
"""
from __future__ import annotations

from typing import Sequence

from ..base import Draft, DraftContext
from ..lookup.index import Candidate
from ..lookup.openings import with_copy
from .feedback import ON_MARGIN, Pending


class SearchShortcuts:
    """_opening (a reply's first round) and _follow (a long copy): a Draft, or None to search."""

    def _opening(self, tokens: Sequence[int], depth_cap: int) -> Draft | None:
        """The reply's opening as the target opened replies to the most similar earlier prompts
        (the history store's :class:`~..lookup.openings.OpeningIndex`), continued by a copy from the
        prompt where the opening leads into text the prompt quotes; None without a consensus."""
        index = getattr(self.store, "openings", None)
        if not self.open_replies or index is None or not self._usable("open", 0):
            return None
        chain, share = index.opening(tokens, depth_cap, self.eos_token_ids)
        if not chain:
            return None
        self.index.sync(tokens)
        draft, copy_from = with_copy(self.index, chain, depth_cap, self.eos_token_ids)
        self._pending = Pending("open", False, len(draft), copy_from=copy_from)
        L = len(tokens)
        cand = Candidate("history", draft, (L, L), float(share), ngram=0)
        extras = self._extras("history", "open", [cand], None, n_branches=1,
                              draft_len=len(draft), nodes=len(draft))
        extras["opening"] = len(chain)
        return Draft(tokens=draft, extras=extras)

    def _follow(self, ctx: DraftContext) -> Draft | None:
        """A long copy: the span that was right last round, continued -- or re-found near
        where an edit interrupted it (CopyFollower)."""
        fol = self.follower
        if not self.adaptive or self.max_copy <= self.max_draft:
            return None
        tokens = ctx.tokens
        self.index.sync(tokens)
        if fol.pointer is None:
            fol.pointer = fol.resync(tokens, self.max_ngram)
        cont = fol.next_copy(tokens, min(fol.length(self.max_draft, self.cost_model,
                                                       ON_MARGIN), int(ctx.max_draft)),
                                self.eos_token_ids)
        if not cont:
            fol.pointer, fol.streak = None, 0
            return None
        p, L = fol.pointer, len(tokens)
        n = self._copied_ngram(tokens, p)
        cand = Candidate("lexical", cont, (p - n, p), 1.0, ngram=n)
        self._pending = Pending("copy", False, len(cont), copy_from=p)
        fol.drafted(len(cont))
        extras = self._extras("lexical", "copy", [cand], [L - n, L], n_branches=1,
                              draft_len=len(cont), nodes=len(cont))
        extras["streak"] = fol.streak
        if fol.last_copy is not None and fol.last_copy.edits:
            extras["edits"] = [[list(s), list(r)] for s, r in fol.last_copy.edits]
        return Draft(tokens=cont, extras=extras)

    def _copied_ngram(self, tokens: Sequence[int], p: int) -> int:
        """How many tokens (1 .. ``max_ngram``) before the copy's source ``p`` match the
        context's suffix: the n-gram the copy is recorded as matching."""
        L = len(tokens)
        n = 1
        while n < self.max_ngram and p - 1 - n >= 0 and tokens[p - 1 - n] == tokens[L - 1 - n]:
            n += 1
        return n
