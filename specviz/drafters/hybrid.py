"""DFlash + lookup: a learned block and prompt lookup verified as one token tree (beyond the
papers; METHODS §1 + §3, in the spirit of multi-draft / tree speculation).

The two kinds of drafter fail in different places. Prompt lookup (PLD, AdaPLD) is right where the
reply copies its context -- translation keeps names and numbers, summaries and RAG answers quote
the source, code repeats identifiers -- and has nothing to say elsewhere; DFlash predicts the
next words from the target's hidden states but rarely copies long spans. Measured offline on the
88 held-out greedy rollouts (exact acceptance at every state): tau PLD 1.67, DFlash 1.76, and
2.62 when every round verifies BOTH drafts and keeps the longer accepted one.

On a CPU that costs little: a verify forward over two or more tokens runs matrix-matrix kernels,
so c(k) is a step at k = 2 and nearly flat after it (:mod:`specviz.costs`); a round that already
verifies a lookup tree pays only the curve's slope for the block's extra nodes. Each round:

1. the lookup drafter proposes (its own cost-aware length, branches, pauses);
2. the DFlash drafter proposes unless its forward gate pauses it, its cost-aware cut told how many
   lookup nodes share the verify forward (``BlockCut.choose(..., base)``);
3. the block's chain and the lookup's branches are merged into one trie, the block first (its
   nodes are 0..k-1, so its per-slot extras index the merged draft); one target forward
   verifies it (the engine's tree mask); the longest accepted path wins.

Each drafter then learns from the round as its OWN draft would have fared
(:func:`own_round`: under greedy verification exact -- its draft against the committed tokens;
when its draft matched every committed token the rest is unknown and the round is counted as
fully accepted up to there). DFlash's forward gate is told what the drafter ADDED: one token plus
the tokens it accepted beyond the lookup's, at one plus its forward and its nodes' share of the
verify cost -- so where lookup already drafts well (translation) the drafter pauses, and where
lookup has nothing it is judged exactly like plain DFlash.

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
from .adapld import AdaPLDDrafter
from .base import Draft, DraftContext, Drafter, VerifyFeedback
from .dflash import PARAMS as DFLASH_PARAMS
from .dflash import DFlashDrafter
from .pld import PLDDrafter
from .registry import MethodSpec, ParamSpec, params_by_name

LOOKUPS = {"adapld": AdaPLDDrafter, "pld": PLDDrafter}
PARAMS = params_by_name(
    ParamSpec("lookup", str, "adapld", choices=tuple(LOOKUPS), label="Lookup drafter",
              help="The model-free drafter whose draft shares each round's verify forward with "
                   "the DFlash block: adapld (with its history store) or plain pld."),
    DFLASH_PARAMS["checkpoint"], DFLASH_PARAMS["block_size"], DFLASH_PARAMS["cut"],
    DFLASH_PARAMS["weights"],
)


# --------------------------------------------------------------------------- pure helpers
def draft_tree(draft: Draft) -> TokenTree:
    """A draft as a token tree (a chain is a one-branch tree)."""
    return TokenTree.chain(draft.tokens) if draft.parents is None else \
        TokenTree(list(draft.tokens), list(draft.parents))


def branches(draft: Draft) -> list[list[int]]:
    """A draft's root-to-leaf token sequences, in leaf order (a chain: itself)."""
    tree = draft_tree(draft)
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
    or ``both``). The block's chain goes first, so its k tokens are nodes 0..k-1."""
    if not lookup.tokens:
        return block, ["block"] * len(block.tokens)
    if not block.tokens:
        return lookup, ["lookup"] * len(lookup.tokens)
    lookup_seqs = branches(lookup)
    tree = TokenTree.from_sequences([block.tokens] + lookup_seqs)
    source = ["block"] * len(block.tokens) + ["lookup"] * (len(tree) - len(block.tokens))
    for seq in lookup_seqs:          # block nodes a lookup branch also spells
        for node in matched_path(tree, seq):
            if node < len(block.tokens):
                source[node] = "both"
    q_token = list(block.q_token or [None] * len(block.tokens))
    q_token += [None] * (len(tree) - len(q_token))
    parents = None if tree.is_chain else list(tree.parents)
    return Draft(tokens=list(tree.tokens), parents=parents, q_token=q_token), source


def own_round(rnd: Round, draft: Draft) -> Round:
    """``rnd`` as ``draft`` alone would have fared under greedy verification: its draft, its
    accepted path along the committed tokens; a draft that matched every committed token is
    clipped there and counted as fully accepted (what followed is unknown)."""
    tree = draft_tree(draft)
    path = matched_path(tree, list(rnd.committed))
    tokens, parents = list(draft.tokens), None if draft.parents is None else list(draft.parents)
    if path and len(path) >= len(rnd.committed):          # censored: clip at what is known
        keep = [i for i, d in enumerate(tree.depths) if d <= len(path)]
        remap = {old: new for new, old in enumerate(keep)}
        tokens = [tree.tokens[i] for i in keep]
        if parents is not None:
            parents = [remap.get(tree.parents[i], -1) for i in keep]
            path = [remap[i] for i in path]
    accepted = len(path)
    return dataclasses.replace(rnd, draft=tokens, parents=parents, accepted=accepted,
                               accepted_path=path if parents is not None else [],
                               extras=dict(draft.extras))


# --------------------------------------------------------------------------- the drafter
class HybridDrafter(Drafter):
    """DFlash's block and a lookup drafter's draft, verified together (module docstring)."""

    name = "dflash_adapld"

    def __init__(self, target=None, lookup: str = "adapld", checkpoint: str | None = None,
                 block_size: int | None = None, cut: str = "auto", weights: str = "float"):
        self.lookup_name = PARAMS["lookup"].check(lookup)
        self.block = DFlashDrafter(target, checkpoint=checkpoint, block_size=block_size,
                                   cut=cut, weights=weights)
        self.lookup = LOOKUPS[self.lookup_name]()
        self.hidden_state_layers = self.block.hidden_state_layers
        self.first_branch_only = False
        self._drafts: tuple[Draft, Draft, float] | None = None

    def begin(self, target, prompt_ids, prefill_hidden=None):
        self.block.begin(target, prompt_ids, prefill_hidden)
        self.lookup.begin(target, prompt_ids, prefill_hidden)
        self.first_branch_only = int(getattr(target, "min_width", 1) or 1) > 1
        self._drafts = None

    def propose(self, ctx: DraftContext) -> Draft:
        lookup = self.lookup.propose(ctx)
        if self.first_branch_only and lookup.tokens:
            self.block.propose(dataclasses.replace(ctx, max_draft=0))   # keeps its context
            self._drafts = (Draft(), lookup, 0.0)
            return self._extras(lookup, Draft(), lookup, ["lookup"] * len(lookup.tokens))
        self.block.shared_width = 0 if self.first_branch_only else len(lookup.tokens)
        t0 = time.perf_counter()
        block = self.block.propose(ctx)
        block_s = time.perf_counter() - t0
        if self.first_branch_only:
            lookup = Draft(extras=lookup.extras)
        self._drafts = (block, lookup, block_s)
        merged, source = merge(block, lookup)
        return self._extras(merged, block, lookup, source)

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
        cut = self.block.pop_cut()
        if cut is None or self.block.cut is None:
            return
        block_conf, kept = cut
        acc = own_round(rnd, block).accepted
        gained = max(0, acc - (own_lookup.accepted if lookup.tokens else 0))
        c = self.block.cut.cost
        width = len(rnd.draft)
        share = c.relative(width + 1) - c.relative(len(lookup.tokens) + 1)
        self.block.cut.observe(block_conf, kept, acc, block_s, int(rnd.index),
                               committed=1 + gained,
                               gate_cost=1.0 + self.block.cut.draft_cost + max(0.0, share))

    def config(self) -> dict[str, Any]:
        return {"lookup": self.lookup_name, **self.block.config(),
                **{f"lookup.{k}": v for k, v in self.lookup.config().items()}}


SPECS = (MethodSpec("dflash_adapld", HybridDrafter, "DFlash + AdaPLD",
                    "DFlash's block and AdaPLD's lookup tree verified together in one target "
                    "forward (the longer accepted path wins)", kind="learned", needs_target=True,
                    params=tuple(PARAMS.values()),
                    hint="The **AdaPLD** page shows the lookup's matches; the decode page "
                         "colours which drafter proposed each node."),)
