"""Verification of drafts against the target (speculative decoding), as pure functions.

Greedy: accept the longest prefix where draft == target argmax, then add the target's own token.
Sampling (Leviathan et al. / Chen et al.): accept x with probability min(1, p(x)/q(x)); on
rejection sample from norm(max(0, p - q)). A deterministic draft (q = point mass) accepts x with
probability p(x) and on rejection samples from p with x removed. Trees with deterministic
children (SpecInfer / EAGLE ``evaluate_posterior``) try the children in order, zeroing each
rejected token and renormalising. Every rule leaves the target distribution p unchanged.

Row conventions: ``logits`` / ``p`` have one row per input position of the verify forward,
[last committed token, draft...]; row i is the target's distribution for the token after input i.

:func:`verify` is the one entry point the engine calls: greedy or sampling x chain or tree, it
returns a :class:`Verdict` (the accepted path as node indices and the target's own token).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .errors import SettingsError
from .tree import TokenTree


@dataclass
class Verdict:
    """The outcome of verifying one draft: the accepted path (node indices; a chain's are
    0..a-1) and the target's own token that follows it (a correction or a bonus)."""

    path: list[int]
    token: int

    @property
    def rows(self) -> list[int]:
        """Rows of the verify input that are now committed: the root and the accepted path."""
        return [0] + [TokenTree.row_of(n) for n in self.path]


def target_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The target's distribution p per verify row: softmax for greedy (temperature 0, display
    only), else the warped sampling distribution."""
    if float(temperature) == 0.0:
        return torch.softmax(logits.float(), dim=-1)
    return warp_probs(logits, temperature, top_p)


def verify(tree: TokenTree, logits: torch.Tensor, probs: torch.Tensor, greedy: bool,
           q: torch.Tensor | None = None, generator: torch.Generator | None = None) -> Verdict:
    """Verify a draft (a chain is a one-branch tree) against the verify forward's ``logits``
    (greedy) or its target distribution ``probs`` (sampling; ``q``: the drafter's [k, V]
    distributions of a sampled chain, None for deterministic drafts)."""
    if tree.is_chain:
        if greedy:
            a, tok = greedy_chain(tree.tokens, logits)
        else:
            a, tok = sample_chain(tree.tokens, probs, q, generator)
        return Verdict(list(range(a)), tok)
    if greedy:
        return Verdict(*greedy_tree(tree.tokens, tree.parents, logits))
    return Verdict(*sample_tree(tree.tokens, tree.parents, probs, generator))


def warp_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Target sampling distribution p from logits: temperature, then nucleus (top-p) filtering."""
    if temperature <= 0:
        raise SettingsError("temperature must be > 0 for sampling (use greedy for 0)")
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, idx = torch.sort(probs, dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        drop = (cum - sorted_p) >= top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs.float().cpu(), 1, generator=generator).item())


def _uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand(1, generator=generator).item())


def greedy_chain(draft: Sequence[int], logits: torch.Tensor) -> tuple[int, int]:
    """Return (accepted count, target token) for a chain draft under greedy decoding."""
    argmax = logits.argmax(-1).tolist()
    a = 0
    while a < len(draft) and int(draft[a]) == argmax[a]:
        a += 1
    return a, argmax[a]


def sample_chain(draft: Sequence[int], p: torch.Tensor, q: torch.Tensor | None,
                 generator: torch.Generator | None) -> tuple[int, int]:
    """Speculative sampling for a chain. ``p``: [k+1, V] target probs; ``q``: [k, V] drafter probs
    or None for a deterministic draft (point mass on each draft token)."""
    p = p.float().cpu()
    if q is not None:
        q = q.float().cpu()
    for i, x in enumerate(draft):
        x = int(x)
        if q is None:
            accept = float(p[i, x])
        else:
            qx = float(q[i, x])
            accept = 1.0 if qx <= 0 else min(1.0, float(p[i, x]) / qx)
        if _uniform(generator) < accept:
            continue
        if q is None:
            residual = p[i].clone()
            residual[x] = 0.0
        else:
            residual = (p[i] - q[i]).clamp_min(0.0)
        if float(residual.sum()) <= 0.0:
            residual = p[i]
        return i, _sample(residual / residual.sum(), generator)
    return len(draft), _sample(p[len(draft)], generator)


def greedy_tree(tokens: Sequence[int], parents: Sequence[int], logits: torch.Tensor) -> tuple[list[int], int]:
    """Return (accepted path as node indices, target token) for a token tree under greedy.
    ``logits`` row 0 is the root (last committed token), row i+1 is node i."""
    argmax = logits.argmax(-1).tolist()
    children = TokenTree(list(tokens), list(parents)).children_map()
    path: list[int] = []
    cur = -1
    while True:
        want = argmax[cur + 1]
        nxt = next((c for c in children.get(cur, []) if int(tokens[c]) == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        cur = nxt


def sample_tree(tokens: Sequence[int], parents: Sequence[int], p: torch.Tensor,
                generator: torch.Generator | None) -> tuple[list[int], int]:
    """Multi-candidate speculative sampling with deterministic children (SpecInfer/EAGLE):
    try the children in order, accept child x with probability p(x) under the current residual,
    on rejection set p(x) = 0 and renormalise; if all fail, sample from the residual."""
    p = p.float().cpu()
    children = TokenTree(list(tokens), list(parents)).children_map()
    path: list[int] = []
    cur = -1
    while True:
        residual = p[cur + 1].clone()
        accepted = None
        for c in children.get(cur, []):
            x = int(tokens[c])
            mass = float(residual.sum())
            if mass <= 0:
                break
            if _uniform(generator) < float(residual[x]) / mass:
                accepted = c
                break
            residual[x] = 0.0
        if accepted is None:
            if float(residual.sum()) <= 0.0:
                residual = p[cur + 1]
            return path, _sample(residual / residual.sum(), generator)
        path.append(accepted)
        cur = accepted
