"""AdaPLD's branched hypotheses (docs/methods/adapld.md, idea 3): several retrieved copies
merged into one token tree, best first, verified in one target forward.

Conventions: candidates arrive ranked (best first); the best one contributes ``d`` tokens (the
draft length the adaptive control chose), each alternative ceil(d/2). A hypothesis that adds no
node (a prefix of one already taken) is skipped. With the adaptive control on, only as many
alternatives are kept as maximise expected committed tokens per unit of verify cost:
(1 + E[accepted on the best branch] + alt_gain * H(k)) / c(nodes + 1), H the harmonic number
(the k-th alternative is right less often than the (k-1)-th). :func:`tree_of` builds the tree
under a node budget and trims each hypothesis to what the tree really holds.
"""
from __future__ import annotations

from typing import Sequence

from ...costs import CostModel
from ...tree import TokenTree
from ..lookup.index import Candidate
from .control import SourceStats, harmonic


def hypotheses(cands: Sequence[Candidate], d: int, max_alts: int, st: SourceStats,
               alt_gain: float, cost: CostModel, node_budget: int, adaptive: bool = True
               ) -> tuple[list[list[int]], list[Candidate]]:
    """The sequences to merge into the draft tree, best first, and the candidates they come
    from: the best candidate's first ``d`` tokens, then up to ``max_alts`` alternatives of
    ceil(d/2) tokens that add a node (``adaptive``: only as many as pay for their nodes)."""
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
    if adaptive and len(seqs) > 1:
        base = 1.0 + st.expected_accepted(len(seqs[0]))
        best_k, best_val = 0, -1.0
        for k in range(len(seqs)):
            nodes = len(TokenTree.from_sequences(seqs[:k + 1], max_nodes=node_budget))
            val = (base + alt_gain * harmonic(k)) / cost.relative(nodes + 1)
            if val > best_val + 1e-9:
                best_k, best_val = k, val
        seqs, chosen = seqs[:best_k + 1], chosen[:best_k + 1]
    return seqs, chosen


def depth_in(tree: TokenTree, seq: Sequence[int]) -> int:
    """How many leading tokens of ``seq`` form a path from the root of ``tree``."""
    children = tree.children_map()
    node, n = -1, 0
    for tok in seq:
        node = next((c for c in children.get(node, ()) if tree.tokens[c] == int(tok)), None)
        if node is None:
            break
        n += 1
    return n


def tree_of(seqs: list[list[int]], chosen: list[Candidate], node_budget: int
            ) -> tuple[TokenTree, list[list[int]], list[Candidate]]:
    """The token tree of ``seqs`` (at most ``node_budget`` nodes), and the hypotheses trimmed to
    what the tree holds (the budget may cut later ones short or drop them)."""
    tree = TokenTree.from_sequences(seqs, max_nodes=node_budget)
    kept = [(q[:depth_in(tree, q)], c) for q, c in zip(seqs, chosen)]
    kept = [(q, c) for q, c in kept if q]
    return tree, [q for q, _ in kept], [c for _, c in kept]
