"""AdaPLD's retrieval order (docs/methods/adapld.md): which source drafts a round.

A lexical match of two or more tokens goes first, unless the history store knows a longer
context that disagrees with it and is more probable (``_rival``). Otherwise the sources that go
on one token of context -- the semantic window match, the history store, the 1-gram copy --
compete on their first-token record in the run; the ones not drafted are scored on the round's
committed tokens (``shadow``, :meth:`~.feedback.RoundControl.observe`), since the
target's next token does not depend on the draft. A mixin of
:class:`~specviz.drafters.adapld.drafter.AdaPLDDrafter`: it reads the drafter's indexes, store and
records.
"""
from __future__ import annotations

from typing import Sequence

from ..lookup import semantic
from ..lookup.index import Candidate, lexical_candidates
from .control import stats_key


class SourceArbitration:
    """retrieve -> (source key, retrieval kind, ranked candidates, suffix span)."""

    def retrieve(self, tokens: Sequence[int], length: int, round_index: int = 0
                 ) -> tuple[str, str, list[Candidate], list[int] | None]:
        """(source key, retrieval kind, ranked candidates, suffix span) for the current context.

        Order: a lexical match of >= 2 tokens; else the sources that go on one token of
        context -- (semantic on) windows similar to the suffix that end with the same last
        token, (a history store loaded) what the target most often wrote next in its own
        replies, and the single-token lexical match: the one with the best record in this run
        (first-token acceptance a1; ties in that order) goes first, the others become
        alternative branches and are scored on the round's committed tokens (``shadow``:
        greedy or sampled, the target's next token does not depend on the draft, so every
        proposing source gets a record on every such round, not only the one drafted); else
        (semantic on) any window above the higher unaligned threshold. A source that the
        adaptive control switched off is skipped (the semantic embeddings are caught up
        later)."""
        self.index.sync(tokens)
        best_n, lex = lexical_candidates(self.index, length, self.eos_token_ids, self.max_ngram,
                                         self.min_ngram)
        if best_n >= 2:
            return self._long_match(tokens, length, round_index, best_n, lex)
        opts, lex1 = self._one_token_options(tokens, length, round_index, best_n, lex)
        if opts:
            return self._best_option(opts, lex, lex1, round_index)
        return self._unaligned(tokens, length, round_index) or ("", "none", [], None)

    def _long_match(self, tokens: Sequence[int], length: int, round_index: int, best_n: int,
                    lex: list[Candidate]) -> tuple[str, str, list[Candidate], list[int]]:
        """A lexical match of >= 2 tokens (``lex2`` / ``lex3``), or the history store's chain
        before it where that is the more probable (``_rival``)."""
        L = len(tokens)
        source = "lex3" if best_n >= 3 else "lex2"
        hist = self._rival(tokens, length, round_index, source, best_n, lex)
        if hist is not None:
            return "hist", "history", [hist] + lex, [L - int(hist.ngram), L]
        return source, "lexical", lex, [L - best_n, L]

    def _one_token_options(self, tokens: Sequence[int], length: int, round_index: int,
                           best_n: int, lex: list[Candidate]
                           ) -> tuple[list[tuple], list[Candidate]]:
        """((source key, kind, candidates, suffix) of each source that goes on one token of
        context and proposes something -- aligned semantic windows, the history store, the
        1-gram copy --, the 1-gram candidates among them)."""
        L = len(tokens)
        sem: list[Candidate] = []
        if best_n == 1 and self.windex is not None and self._usable("sem", round_index):
            sem = semantic.semantic_candidates(
                self.windex, tokens, length, max(1, self.max_branches), self.sim_threshold,
                self.eos_token_ids, aligned=True, index=self.index)
        hist = self._history_candidate(tokens, length, round_index)
        lex1 = lex if best_n == 1 and (self.shadow or not (sem or hist)) else []
        opts = [o for o in (("sem", "semantic", sem, [L - self.window, L]),
                            ("hist", "history", [hist] if hist else [],
                             [L - int(hist.ngram), L] if hist else None),
                            ("lex1", "lexical", lex1, [L - 1, L])) if o[2]]
        return opts, lex1

    def _best_option(self, opts: list[tuple], lex: list[Candidate], lex1: list[Candidate],
                     round_index: int) -> tuple[str, str, list[Candidate], list[int] | None]:
        """The option with the best first-token record in this run goes first (ties: the
        options' order); the others become alternatives and are scored on the round's committed
        tokens (``shadow``, observe)."""
        best = max(opts, key=lambda o: self.source_stats(stats_key(o[0], o[2]),
                                                         round_index).a1)
        rest = [o for o in opts if o is not best]
        if self.shadow:
            self._shadow = [(stats_key(o[0], o[2]), list(o[2][0].tokens)) for o in rest]
        source, kind, cands, suffix = best
        alts = [c for o in rest for c in o[2]]
        if source == "hist" and not lex1:   # shadow off: the 1-gram copies stay alternatives
            alts += lex
        return source, kind, cands + alts, suffix

    def _unaligned(self, tokens: Sequence[int], length: int, round_index: int
                   ) -> tuple[str, str, list[Candidate], list[int]] | None:
        """(semantic on) windows above the higher unaligned threshold (``semfree``: no shared
        last token); None where there are none or the source is paused."""
        if self.windex is None or not self._usable("semfree", round_index):
            return None
        sem = semantic.semantic_candidates(
            self.windex, tokens, length, max(1, self.max_branches), self.free_threshold,
            self.eos_token_ids, aligned=False)
        if not sem:
            return None
        L = len(tokens)
        return "semfree", "semantic", sem, [L - self.window, L]

    def _rival(self, tokens: Sequence[int], length: int, round_index: int, source: str,
               best_n: int, lex: list[Candidate]) -> Candidate | None:
        """The history store's chain when it should go before a lexical match: its context is
        longer than the match (a three-token context against a 2-gram), it disagrees on the
        next token, and its share of that context in the target's own replies is above the
        lexical source's first-token acceptance in this run -- the more probable first token
        goes first. E.g. a reply that opens a code fence after a prompt whose only fence
        closed one: the prompt says "\n\n", the target's replies say "python". None
        otherwise (the lexical match stands)."""
        if not self.arbitrate or not lex or not lex[0].tokens:
            return None
        hist = self._history_candidate(tokens, length, round_index)
        if hist is None or int(hist.ngram) <= best_n or hist.tokens[0] == lex[0].tokens[0]:
            return None
        st = self.source_stats(stats_key(source, lex), round_index)
        return hist if hist.score > st.a1 else None

    def _history_candidate(self, tokens: Sequence[int], length: int, round_index: int
                           ) -> Candidate | None:
        """The history store's chain for the context's last 1-3 tokens (None: no store, no
        entry, or the source is paused)."""
        if self.store is None or not self._usable("hist", round_index):
            return None
        chain, n = self.store.chain(tokens, length, self.eos_token_ids)
        if not chain:
            return None
        share = self.store.next_token(*self.store.context(tokens))[1]
        L = len(tokens)
        return Candidate("history", chain, (L - n, L), float(share), ngram=n)
