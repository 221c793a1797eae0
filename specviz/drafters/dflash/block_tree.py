"""Draft trees from one DFlash block: the slots' top words verified as a token tree.

A DFlash block gives, in one drafter forward, a distribution q_j over words for every slot
j = 1..k, all predicted in parallel (q_j does not depend on the word drafted at slot j - 1). A
chain drafts argmax q_j. A *tree* spends the same verify forward on more of that mass: a node is
a path (r_1, ..., r_d) of ranks in the slots' top-R lists (node token: slot d's r_d-th word), and
under the drafter's own model it is the target's greedy reply with probability

    P(path) = prod_{j <= d} p_j(r_j),

p_j the slot's probabilities after the cut's per-slot calibration (:mod:`.block_cut`). Greedy
verification accepts the deepest node on the target's path, so the expected accepted length of a
tree is the sum of its nodes' P. The tree of N nodes maximising it is therefore the N most
probable paths (a path's prefix is at least as probable, so they form a tree), found best-first
as in EAGLE-2's dynamic draft trees: pop the most probable path, push its first child (rank 0
at the next slot) and its next sibling (rank r + 1 at the same slot). The cut then picks N as it
picks a chain's length: max over N of (1 + E_N) / (c(N + 1) + d) with E_N the N best paths'
summed P, c the measured verify-cost curve and d the drafter's forward. On a CPU whose verify
cost grows with width this buys the extra nodes only where they pay; on an accelerator (flat
curve) it takes the node budget.

Verification is the engine's (greedy: the longest path matching the target's argmax; sampling:
deterministic children tried in order), so output is unchanged -- lossless as any tree draft.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

from ..base import Draft

TREE_TOPK = 4   # words per slot a tree may branch on


@dataclass(frozen=True)
class TreeNode:
    """One node of a block's draft tree: its parent node (-1 = the anchor), slot (= depth,
    1-based), rank of its word in the slot's top list, and path probability P."""

    parent: int
    slot: int
    rank: int
    prob: float


def best_first(p: Sequence[Sequence[float]], max_nodes: int) -> list[TreeNode]:
    """The ``max_nodes`` most probable paths of per-slot rank probabilities ``p`` [k, R]
    (each row sorted, largest first), as tree nodes in best-first order: parents precede
    children, and every prefix of the list is the best tree of its size."""
    k = len(p)
    if k == 0 or max_nodes <= 0:
        return []
    out: list[TreeNode] = []
    heap = [(-float(p[0][0]), 0, -1, 1, 0, 1.0)]   # (-P, tie, parent, slot, rank, parent's P)
    tie = 1
    while heap and len(out) < max_nodes:
        neg, _, parent, slot, rank, parent_p = heapq.heappop(heap)
        node = len(out)
        out.append(TreeNode(parent, slot, rank, -neg))
        if slot < k:                                   # first child: rank 0 at the next slot
            heapq.heappush(heap, (neg * float(p[slot][0]), tie, node, slot + 1, 0, -neg))
            tie += 1
        if rank + 1 < len(p[slot - 1]):                # next sibling: rank + 1 at this slot
            heapq.heappush(heap, (-parent_p * float(p[slot - 1][rank + 1]), tie, parent, slot,
                                  rank + 1, parent_p))
            tie += 1
    return out


def tree_tokens(nodes: Sequence[TreeNode], ids: Sequence[Sequence[int]]
                ) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the nodes, ``ids`` [k, R] the slots' top word ids."""
    return [int(ids[n.slot - 1][n.rank]) for n in nodes], [n.parent for n in nodes]


def tree_draft(nodes: Sequence[TreeNode], raw: Sequence[Sequence[float]],
               ids: Sequence[Sequence[int]], extras: dict) -> Draft:
    """The nodes as a deterministic draft (q = point masses; ``q_token`` and ``confidence``:
    each node's raw slot probability). A tree that is a chain is drafted as a chain (with the
    per-slot top-k a chain records); a tree records each node's slot and rank."""
    if not nodes:
        return Draft(extras=extras)
    tokens, parents = tree_tokens(nodes, ids)
    q = [round(float(raw[n.slot - 1][n.rank]), 6) for n in nodes]
    extras["confidence"] = q
    if all(p == i - 1 for i, p in enumerate(parents)):   # the best tree is a chain
        extras["topk"] = [list(r) for r in ids[:len(nodes)]]
        extras["topk_p"] = [[round(x, 3) for x in r] for r in raw[:len(nodes)]]
        return Draft(tokens=tokens, q=None, q_token=q, extras=extras)
    extras["tree_slots"] = [n.slot for n in nodes]
    extras["tree_ranks"] = [n.rank for n in nodes]
    return Draft(tokens=tokens, parents=parents, q=None, q_token=q, extras=extras)


def path_confidence(nodes: Sequence[TreeNode], raw: Sequence[Sequence[float]],
                    path: Sequence[int]) -> list[float]:
    """What the calibration learns from a verified tree (:meth:`.block_cut.BlockCut.observe`):
    at each depth the target judged -- depth 1, and one below every node of the accepted
    ``path`` (node indices) -- the drafter's raw probability mass on the children it drafted
    there (a chain's: the slot's top probability). Stops at the first depth without children."""
    out, parent = [], -1
    for depth in range(len(path) + 1):
        kids = [n for n in nodes if n.parent == parent]
        if not kids:
            break
        out.append(sum(float(raw[n.slot - 1][n.rank]) for n in kids))
        if depth < len(path):
            parent = path[depth]
    return out
