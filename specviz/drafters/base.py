"""The drafter interface every strategy plugs into (speculative decoding, step 1).

Shaped like transformers' ``CandidateGenerator``: ``propose`` returns candidate tokens (a chain,
or a tree given by parent indices) and ``observe`` receives the verified round, including the
target's logits and (on request) hidden states from the same verify forward, so drafters such
as DFlash can reuse target signals without an extra forward.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..tree import TokenTree


@dataclass
class DraftContext:
    """What a drafter sees when it proposes: every committed token id so far."""

    tokens: list[int]
    prompt_len: int
    max_draft: int      # the engine will truncate a longer draft to this many tokens (depth)
    round_index: int


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] | None = None          # tree drafts: parent of each node (-1 = root)
    q: torch.Tensor | None = None             # [k, V] drafter distribution for sampled chains
    q_token: list[float | None] | None = None  # drafter prob of each drafted token (display)
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def tree(self) -> TokenTree:
        """The draft as a token tree (a chain is the one-branch tree)."""
        return TokenTree.chain(self.tokens) if self.parents is None else \
            TokenTree(list(self.tokens), list(self.parents))


@dataclass
class VerifyFeedback:
    """Everything the verify forward computed, handed back to the drafter after a round."""

    round: Any                          # specviz.trace.Round
    logits: torch.Tensor | None         # [1 + k, V] target logits over [last token, draft...]
    #                                     (None in offline replay: no target forward ran)
    hidden_states: tuple | None = None  # HF hidden_states of the verify forward (if requested)
    kept_rows: list[int] | None = None  # rows of the verify input that are now committed


def clip_draft(draft: Draft, max_depth: int) -> Draft:
    """Cut a draft to ``max_depth`` (a chain's length, a tree's depth): the engine and offline
    replay never let a round commit more than the token budget allows."""
    if draft.parents is None:
        if len(draft.tokens) > max_depth:
            draft.tokens = draft.tokens[:max_depth]
            draft.q = draft.q[:max_depth] if draft.q is not None else None
            draft.q_token = draft.q_token[:max_depth] if draft.q_token is not None else None
        return draft
    tree = draft.tree
    keep = [i for i, d in enumerate(tree.depths) if d <= max_depth]
    if len(keep) < len(tree):
        remap = {old: new for new, old in enumerate(keep)}
        draft.tokens = [tree.tokens[i] for i in keep]
        draft.parents = [remap.get(tree.parents[i], -1) for i in keep]
        if draft.q_token is not None:
            draft.q_token = [draft.q_token[i] for i in keep]
    return draft


class Drafter:
    """Base class: a drafter that proposes nothing (plain autoregressive decoding)."""

    name = "ar"
    #: HF ``output_hidden_states`` indices the drafter needs from every target forward, or None.
    hidden_state_layers: list[int] | None = None

    def begin(self, target, prompt_ids: list[int], prefill_hidden: tuple | None = None) -> None:
        """Called once per Session after the prefill forward (over prompt_ids[:-1])."""

    def propose(self, ctx: DraftContext) -> Draft:
        return Draft()

    def observe(self, feedback: VerifyFeedback) -> None:
        """Called after each round with the verify results."""

    def config(self) -> dict[str, Any]:
        return {}


class ARDrafter(Drafter):
    """No draft: every round is one ordinary decoding step (the baseline)."""

    name = "ar"
