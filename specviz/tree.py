"""Token trees as data (AdaPLD branched hypotheses; SpecInfer/Medusa/EAGLE-style trees).

A tree is a list of node tokens and parent indices (-1 = the root, i.e. the last committed
token); a chain draft is the one-branch tree ``parents = [-1, 0, 1, ...]``. It is turned into the
buffers one tree-verification forward needs: a 4D boolean attention mask (each node sees the
whole KV cache, its ancestors and itself), position ids by depth, and root-to-node paths for
committing the accepted branch.

After verification a tree is read once, here, for every view: :meth:`TokenTree.node_status`
says of each node whether it was ``accepted`` (on the accepted path), the ``first_rejected``
node(s) where the round ended (children of the deepest accepted node: the target judged them on
a correct prefix and disagreed), ``rejected`` (a sibling of an accepted node, judged and
rejected while the round went on along another branch) or ``not_reached`` (below a rejected
node: never judged on a correct prefix, so its target probability means nothing).
Verify rows: the verify forward's input is [root, nodes...], so row 0 predicts the root's
children and row ``i + 1`` predicts node ``i``'s children (:meth:`TokenTree.row_of`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

#: node statuses after verification, in the order views list them
NODE_STATUSES = ("accepted", "first_rejected", "rejected", "not_reached")


@dataclass
class TokenTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents must have the same length")
        for i, p in enumerate(self.parents):
            if not (-1 <= p < i):
                raise ValueError(f"node {i} has parent {p}: parents must precede their children")

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_sequences(cls, seqs: Iterable[Sequence[int]], max_nodes: int | None = None,
                       base: "TokenTree | None" = None) -> "TokenTree":
        """Merge token sequences into a trie (shared prefixes stored once), in the given order,
        stopping when ``max_nodes`` nodes exist (later sequences are truncated); with a ``base``
        tree its nodes come first, in order, and the sequences are grafted onto it."""
        tree = cls(list(base.tokens), list(base.parents)) if base is not None else cls()
        index: dict[tuple[int, int], int] = {  # (parent, token) -> node
            (p, t): i for i, (p, t) in enumerate(zip(tree.parents, tree.tokens))}
        for seq in seqs:
            parent = -1
            for tok in seq:
                key = (parent, int(tok))
                node = index.get(key)
                if node is None:
                    if max_nodes is not None and len(tree.tokens) >= max_nodes:
                        break
                    node = len(tree.tokens)
                    tree.tokens.append(int(tok))
                    tree.parents.append(parent)
                    index[key] = node
                parent = node
        return tree

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> "TokenTree":
        return cls(list(map(int, tokens)), list(range(-1, len(tokens) - 1)))

    @property
    def depths(self) -> list[int]:
        """Depth of each node; the root's children have depth 1."""
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @property
    def depth(self) -> int:
        """Depth of the deepest node (0 for an empty tree)."""
        return max(self.depths, default=0)

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    def children_map(self) -> dict[int, list[int]]:
        """parent -> its children in node order (-1 = the root)."""
        out: dict[int, list[int]] = {}
        for i, p in enumerate(self.parents):
            out.setdefault(p, []).append(i)
        return out

    @staticmethod
    def row_of(node: int) -> int:
        """Verify-forward row whose output follows ``node`` (-1 = the root -> row 0)."""
        return node + 1

    def node_status(self, path: Sequence[int], sampling: bool = False) -> list[str]:
        """Status of every node given the accepted ``path`` (see the module docstring).

        With ``sampling=True`` children are tried in order (SpecInfer), so siblings listed
        after an accepted child were never tried: ``not_reached``."""
        on_path = set(int(x) for x in path)
        last = int(path[-1]) if len(path) else -1
        accepted_child = {self.parents[n]: n for n in on_path}
        out = []
        for i, p in enumerate(self.parents):
            if i in on_path:
                out.append("accepted")
            elif p == last:
                out.append("first_rejected")
            elif (p == -1 or p in on_path) and not (sampling and i > accepted_child.get(p, i)):
                out.append("rejected")
            else:
                out.append("not_reached")
        return out

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` (inclusive)."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def leaves(self) -> list[int]:
        has_child = set(p for p in self.parents if p >= 0)
        return [i for i in range(len(self)) if i not in has_child]

    def ancestor_matrix(self) -> torch.Tensor:
        """Bool [n+1, n+1] over [root, nodes...]: entry (i, j) is True when j is i or an ancestor."""
        n = len(self)
        m = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        m[:, 0] = True
        m[0, 0] = True
        for i, p in enumerate(self.parents):
            row = i + 1
            if p >= 0:
                m[row] = m[p + 1]
            m[row, row] = True
        return m

    def attention_mask(self, cache_len: int, device=None) -> torch.Tensor:
        """4D bool mask (1, 1, n+1, cache_len+n+1) for the input [root, nodes...]; True = attend."""
        anc = self.ancestor_matrix()
        n1 = anc.shape[0]
        mask = torch.ones(1, 1, n1, cache_len + n1, dtype=torch.bool)
        mask[0, 0, :, cache_len:] = anc
        return mask.to(device) if device is not None else mask

    def position_ids(self, cache_len: int, device=None) -> torch.Tensor:
        """Positions of [root, nodes...]: the root at ``cache_len``, a node at cache_len + depth."""
        pos = torch.tensor([cache_len] + [cache_len + d for d in self.depths], dtype=torch.long)
        pos = pos.unsqueeze(0)
        return pos.to(device) if device is not None else pos
