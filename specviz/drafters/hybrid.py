"""DFlash + lookup: a learned block and prompt lookup verified as one token tree (beyond the papers;
docs/methods/dflash.md, docs/methods/adapld.md, in the spirit of multi-draft / tree speculation).

The two kinds of drafter fail in different places. Prompt lookup (PLD, AdaPLD) is right where the
reply copies its context -- translation keeps names and numbers, summaries and RAG answers quote
the source, code repeats identifiers -- and has nothing to say elsewhere; DFlash predicts the
next words from the target's hidden states but rarely copies long spans. Measured offline on the
88 held-out greedy rollouts (exact acceptance at every state): tau PLD 1.67, DFlash 1.76, and
2.62 when every round verifies BOTH drafts and keeps the longer accepted one.

Each round:

1. the lookup drafter proposes (its own cost-aware length, branches, pauses);
2. the DFlash drafter proposes unless its forward gate pauses it; its cost-aware cut is told the
   lookup's draft (:class:`~.dflash.block_cut.SharedDraft`: its node count w and its estimated
   survival s_j, AdaPLD's a1, a2 for the round's source) and keeps the k slots maximising (1 +
   E[max]) / (c(w + k + 1) + d), P(max >= j) = s_j + b_j (1 - s_j) -- block nodes are worth little
   where lookup is likely right anyway, and on a CPU every verified node costs (the verify forward
   grows by a few % of a step per token, :mod:`specviz.costs`);
3. the block's draft -- a chain, or by default a tree of its slots' top words
   (:mod:`.dflash.block_tree`, sized by the same cut: a node at depth j adds P(node) (1 - s_j)) --
   and the lookup's branches are merged into one trie, the block first (its nodes keep their numbers
   0..k-1, so its per-node extras index the merged draft); one target forward verifies it (the
   engine's tree mask); the longest accepted path wins.

Each drafter then learns from the round as its OWN draft would have fared
(:func:`own_round`: under greedy verification exact -- its draft against the committed tokens;
when its draft matched every committed token the rest is unknown and the round is counted as
fully accepted up to there). DFlash's forward gate is told what the block ADDED: one token plus
the tokens it accepted beyond the lookup's, at one step plus R x (its forward + its nodes'
share of the verify), R = the lookup's own committed tokens per unit of cost in this run
(:class:`LookupRecord`, >= 1). So the block pauses where it does not beat the lookup's rate
(translation, summaries) and, where lookup has nothing, is judged exactly as plain DFlash is.

Lossless like every drafter here: all drafts are point masses (argmax) verified by the engine
(greedy longest path; SpecInfer-style multi-child sampling for trees). Under width-invariant
numerics (:mod:`specviz.numerics`) only a tree's first branch is verified exactly, so there the
round drafts the lookup's draft when it has one, else the block's (no merged tree).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

from ..trace import Round
from ..tree import TokenTree
from .adapld.drafter import AdaPLDDrafter
from .base import Draft, DraftContext, Drafter, VerifyFeedback, clip_draft
from .dflash.block_cut import SharedDraft
from .dflash.drafter import DFlashDrafter
from .dflash.params import PARAMS as DFLASH_PARAMS
from .pld import PLDDrafter
from .registry import MethodSpec, ParamSpec, params_by_name

LOOKUPS = {"adapld": AdaPLDDrafter, "pld": PLDDrafter}
DECAY = 0.9            # per round, for the lookup's acceptance and rate sums
PARAMS = params_by_name(
    ParamSpec("lookup", str, "adapld", choices=tuple(LOOKUPS), label="Lookup drafter",
              help="The model-free drafter whose draft shares each round's verify forward with "
                   "the DFlash block: adapld (with its history store) or plain pld."),
    DFLASH_PARAMS["checkpoint"], DFLASH_PARAMS["block_size"], DFLASH_PARAMS["cut"],
    DFLASH_PARAMS["weights"], DFLASH_PARAMS["tree"],
)


# --------------------------------------------------------------------------- pure helpers
def branches(draft: Draft) -> list[list[int]]:
    """A draft's root-to-leaf token sequences, in leaf order (a chain: itself)."""
    tree = draft.tree
    if tree.is_chain:
        return [list(tree.tokens)]
    return [[tree.tokens[i] for i in tree.path_to(leaf)] for leaf in tree.leaves()]


def matched_path(tree: TokenTree, committed: list[int]) -> list[int]:
    """The nodes of ``tree`` that spell a prefix of ``committed`` from the root: what the tree
    alone would have had accepted under greedy verification."""
    children = tree.children_map()
    path, parent = [], -1
    for tok in committed:
        nxt = next((c for c in children.get(parent, []) if tree.tokens[c] == int(tok)), None)
        if nxt is None:
            break
        path.append(nxt)
        parent = nxt
    return path


def merge(block: Draft, lookup: Draft) -> tuple[Draft, list[str]]:
    """One draft verifying both: (the merged draft, each node's source: ``block``, ``lookup``
    or ``both``). The block's chain or tree goes first, so its k nodes are nodes 0..k-1."""
    if not lookup.tokens:
        return block, ["block"] * len(block.tokens)
    if not block.tokens:
        return lookup, ["lookup"] * len(lookup.tokens)
    lookup_seqs = branches(lookup)
    tree = TokenTree.from_sequences(lookup_seqs, base=block.tree)
    source = ["block"] * len(block.tokens) + ["lookup"] * (len(tree) - len(block.tokens))
    for seq in lookup_seqs:          # block nodes a lookup branch also spells
        for node in matched_path(tree, seq):
            if node < len(block.tokens):
                source[node] = "both"
    q_token = list(block.q_token or [None] * len(block.tokens))
    q_token += [None] * (len(tree) - len(q_token))
    parents = None if tree.is_chain else list(tree.parents)
    return Draft(tokens=list(tree.tokens), parents=parents, q_token=q_token), source


def survival(a1: float, a2: float, depth: int) -> tuple[float, ...]:
    """P(accepted length >= j), j = 1..depth, of a chain whose first token is accepted with
    probability a1 and each next one, after an accepted one, with a2 (AdaPLD's model)."""
    return tuple(a1 * a2 ** (j - 1) for j in range(1, depth + 1))


@dataclasses.dataclass
class LookupRecord:
    """Decayed counts of the lookup drafter's own acceptance in a hybrid run: a1 = P(first
    token accepted), a2 = P(next | previous accepted) (a fallback where the lookup states no
    estimate of its own), and its committed tokens per unit of verify cost, R (>= 1: a plain
    step is always possible) -- the rate the block must beat to be worth its forward."""

    first: list[float] = dataclasses.field(default_factory=lambda: [1.0, 2.0])   # ok, n
    next: list[float] = dataclasses.field(default_factory=lambda: [1.0, 2.0])
    tokens: float = 1.0
    cost: float = 1.0

    @property
    def a1(self) -> float:
        return self.first[0] / self.first[1]

    @property
    def a2(self) -> float:
        return self.next[0] / self.next[1]

    @property
    def rate(self) -> float:
        return max(1.0, self.tokens / max(1e-9, self.cost))

    def observe(self, depth: int, accepted: int, cost: float) -> None:
        """One round: the lookup drafted a chain/tree of ``depth`` and had ``accepted`` tokens
        accepted (its own view), its verify costing ``cost`` one-token forwards."""
        for c in (self.first, self.next):
            c[0] *= DECAY
            c[1] *= DECAY
        if depth > 0:
            self.first[0] += float(accepted > 0)
            self.first[1] += 1.0
            reached = min(accepted + 1, depth) - 1      # next-token trials after an accept
            self.next[0] += float(min(accepted, depth) - (accepted > 0))
            self.next[1] += float(max(0, reached))
        self.tokens = DECAY * self.tokens + 1.0 + accepted
        self.cost = DECAY * self.cost + cost


def own_round(rnd: Round, draft: Draft) -> Round:
    """``rnd`` as ``draft`` alone would have fared under greedy verification: its draft, its
    accepted path along the committed tokens; a draft that matched every committed token is
    clipped there (:func:`~.base.clip_draft`) and counted as fully accepted (what followed is
    unknown)."""
    path = matched_path(draft.tree, list(rnd.committed))
    if path and len(path) >= len(rnd.committed):          # censored: clip at what is known
        draft = clip_draft(dataclasses.replace(draft), len(path))
        path = matched_path(draft.tree, list(rnd.committed))
    return dataclasses.replace(rnd, draft=list(draft.tokens), accepted=len(path),
                               parents=None if draft.parents is None else list(draft.parents),
                               accepted_path=path if draft.parents is not None else [],
                               extras=dict(draft.extras))


# --------------------------------------------------------------------------- the drafter
class HybridDrafter(Drafter):
    """DFlash's block and a lookup drafter's draft, verified together (module docstring)."""

    name = "dflash_adapld"

    def __init__(self, target=None, lookup: str = "adapld", checkpoint: str | None = None,
                 block_size: int | None = None, cut: str = "auto", weights: str = "float",
                 tree: int | None = None, model=None):
        self.lookup_name = PARAMS["lookup"].check(lookup)
        self.block = DFlashDrafter(target, checkpoint=checkpoint, model=model,
                                   block_size=block_size, cut=cut, weights=weights, tree=tree)
        self.lookup = LOOKUPS[self.lookup_name]()
        self.hidden_state_layers = self.block.hidden_state_layers
        self.first_branch_only = False
        self.record = LookupRecord()
        self._drafts: tuple[Draft, Draft, float] | None = None

    def begin(self, target, prompt_ids, prefill_hidden=None):
        self.block.begin(target, prompt_ids, prefill_hidden)
        self.lookup.begin(target, prompt_ids, prefill_hidden)
        self.first_branch_only = int(getattr(target, "min_width", 1) or 1) > 1
        self.record = LookupRecord()
        self._drafts = None

    def propose(self, ctx: DraftContext) -> Draft:
        lookup = clip_draft(self.lookup.propose(ctx), max(0, int(ctx.max_draft)))
        if self.first_branch_only and lookup.tokens:   # the block's context follows in observe
            self._drafts = (Draft(), lookup, 0.0)
            return self._extras(lookup, Draft(), lookup, ["lookup"] * len(lookup.tokens))
        self.block.shared = None if self.first_branch_only or not lookup.tokens else \
            SharedDraft(len(lookup.tokens), self.lookup_survival(lookup))
        t0 = time.perf_counter()
        block = clip_draft(self.block.propose(ctx), max(0, int(ctx.max_draft)))
        block_s = time.perf_counter() - t0
        if self.first_branch_only:
            lookup = Draft(extras=lookup.extras)
        self._drafts = (block, lookup, block_s)
        merged, source = merge(block, lookup)
        return self._extras(merged, block, lookup, source)

    def lookup_survival(self, lookup: Draft) -> tuple[float, ...]:
        """P(lookup's accepted length >= j) along its first branch: AdaPLD's own estimate for
        the round's source (``alpha``) where it states one, else this run's record."""
        ex = lookup.extras or {}
        depth = int(ex.get("draft_len") or 0) or len(branches(lookup)[0])
        alpha = ex.get("alpha")
        a1, a2 = (float(alpha[0]), float(alpha[1])) if alpha else (self.record.a1, self.record.a2)
        return survival(a1, a2, depth)

    @staticmethod
    def _extras(merged: Draft, block: Draft, lookup: Draft, source: list[str]) -> Draft:
        """The merged draft with both drafters' extras (the block's per-slot lists index nodes
        0..k-1) and ``hybrid``: how many nodes each drafted and each node's source."""
        out = dataclasses.replace(merged, extras={**lookup.extras, **block.extras})
        out.extras["hybrid"] = {"block_nodes": len(block.tokens),
                                "lookup_nodes": len(lookup.tokens), "source": source}
        return out

    def observe(self, feedback: VerifyFeedback) -> None:
        rnd = feedback.round
        block, lookup, block_s = self._drafts or (Draft(), Draft(), 0.0)
        self._drafts = None
        own_lookup = own_round(rnd, lookup)
        self.lookup.observe(dataclasses.replace(feedback, round=own_lookup))
        self.block.observe_context(feedback)
        c = self.block.cut.cost if self.block.cut is not None else None
        lookup_cost = c.relative(len(lookup.tokens) + 1) if c is not None else 1.0
        rate = self.record.rate                   # what the block must beat (before this round)
        self.record.observe(lookup.tree.depth if lookup.tokens else 0,
                            own_lookup.accepted, lookup_cost)
        path = matched_path(block.tree, list(rnd.committed))   # the block's own nodes
        view = self.block.pop_cut(path)
        if view is None or c is None:
            return
        block_conf, kept, nodes = view
        acc = len(path)                          # matched_path stops at the committed
        if nodes and len(path) >= len(rnd.committed):   # censored: judged only up to there
            block_conf, kept = block_conf[:acc], min(kept, acc)
        gained = max(0, acc - own_lookup.accepted)
        share = max(0.0, c.relative(len(rnd.draft) + 1) - lookup_cost)
        # the gate pauses the block where what it adds per unit of its own cost (its forward and
        # its share of the verify) falls below the lookup's own rate
        self.block.cut.observe(block_conf, kept, acc, block_s, int(rnd.index),
                               committed=1 + gained,
                               gate_cost=1.0 + rate * (self.block.cut.draft_cost + share))

    def config(self) -> dict[str, Any]:
        return {"lookup": self.lookup_name, **self.block.config(),
                **{f"lookup.{k}": v for k, v in self.lookup.config().items()}}


SPECS = (MethodSpec("dflash_adapld", HybridDrafter, "DFlash + AdaPLD",
                    "DFlash's block and AdaPLD's lookup tree verified together in one target "
                    "forward (the longer accepted path wins)", kind="learned", needs_target=True,
                    params=tuple(PARAMS.values()),
                    hint="The **AdaPLD** page shows the lookup's matches and the merged tree "
                         "(hover a node: which drafter proposed it)."),)
