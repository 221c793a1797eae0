"""DFlash2's additions to the DFlash drafter network (docs/methods/dflash.md#published-layouts):
grouped block convolutions around each layer's attention and MLP, and a candidate selector that
picks the block's tokens from each slot's top-K by a walk over pairwise edge scores.

Conventions (as vLLM's ``models/qwen3_dflash2.py``, which these functions mirror and the tests
compare with on the same tensors):

* **grouped convolution** (``layers.N.{attention_conv,mlp_conv}``): ``base_kernel`` [2, taps, H]
  and ``kernel_projection`` H -> 2 * taps * G (G = H / ``conv_group_size`` groups). ``prepare``
  projects the layer input to per-row coefficients for both sides and convolves the input with
  side 0 (base + that row's group deltas); ``finish`` convolves the sublayer's output with side
  1. Tap t of block row p reads row p - t of the same block (p >= t): causal within the block,
  never across blocks or into the context.
* **candidate selector** (``candidate_selector``): each slot's top-K words by the LM head's
  logits times ``output_multiplier``, then soft-capped (``final_logit_softcapping``); edge score
  of candidate c at slot l after candidate p at slot l-1 =
  unary(l, c) + < predecessor[p] * hidden_projection(h_l), successor[c] > (the anchor -- the
  last committed token -- precedes slot 1). Greedy drafting walks the slots: slot 1 takes the
  best edge from the anchor, slot l the best edge from the candidate chosen at slot l-1.
* ``input_embedding_scale`` multiplies the block's input embeddings.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def grouped_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int,
                 num_groups: int, group_size: int, taps: int) -> torch.Tensor:
    """The grouped block convolution of rows ``x`` [T, H] (T rows = whole blocks of
    ``block_size``): per-row coefficients ``base`` [taps, H] + ``delta`` [T, taps, G]."""
    blocks = x.unflatten(-1, (num_groups, group_size))
    coef = base.view(1, taps, num_groups, group_size) + delta.unsqueeze(-1)
    out = coef[:, 0] * blocks
    position = torch.arange(x.shape[0], device=x.device) % block_size
    for tap in range(1, taps):
        shifted = F.pad(blocks[:-tap], (0, 0, 0, 0, tap, 0))
        out = out + coef[:, tap] * shifted * (position >= tap).view(-1, 1, 1)
    return out.flatten(-2)


class GroupedConv(nn.Module):
    """One side pair of grouped convolutions around a sublayer (module docstring)."""

    def __init__(self, hidden_size: int, taps: int, group_size: int, block_size: int):
        super().__init__()
        if group_size <= 0 or hidden_size % group_size:
            raise ValueError(f"conv_group_size={group_size} must divide hidden_size="
                             f"{hidden_size}")
        if taps < 1:
            raise ValueError(f"conv_kernel_size must be at least 1, got {taps}")
        self.block_size, self.taps, self.group_size = int(block_size), int(taps), int(group_size)
        self.num_groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * taps * self.num_groups, bias=False)

    def _convolve(self, x: torch.Tensor, delta: torch.Tensor, side: int) -> torch.Tensor:
        return grouped_conv(x, delta, self.base_kernel[side], self.block_size, self.num_groups,
                            self.group_size, self.taps)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x convolved with side 0, side 1's coefficients) for rows ``x`` [T, H]."""
        coef = self.kernel_projection(x).reshape(x.shape[0], 2, self.taps, self.num_groups)
        return self._convolve(x, coef[:, 0], 0), coef[:, 1]

    def finish(self, x: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        return self._convolve(x, coef, 1)


def score_edges(predecessor: torch.Tensor, successor: torch.Tensor, candidate_ids: torch.Tensor,
                unary: torch.Tensor, hidden: torch.Tensor, anchor_ids: torch.Tensor,
                top_k: int) -> torch.Tensor:
    """Edge scores [b, L, K(previous), K(current)] of candidates ``candidate_ids`` [b, L, K]
    with unary logits ``unary`` [b, L, K], projected slot states ``hidden`` [b, L, r] and the
    anchors ``anchor_ids`` [b] (the token before slot 1)."""
    succ = successor[candidate_ids]
    prev_ids = torch.cat((anchor_ids[:, None, None].expand(-1, 1, top_k),
                          candidate_ids[:, :-1]), dim=1)
    pred = predecessor[prev_ids]
    return unary[:, :, None] + torch.einsum("blpr,blcr->blpc", pred * hidden[:, :, None], succ)


def greedy_walk(scores: torch.Tensor) -> list[int]:
    """Candidate index per slot of one block's edge scores [L, K, K]: slot 1 the best edge
    from the anchor (row 0: every row of slot 1 is the anchor's), slot l the best from the
    index chosen at slot l-1."""
    previous, path = 0, []
    for step in range(scores.shape[0]):
        previous = int(scores[step, previous].argmax())
        path.append(previous)
    return path


class CandidateSelector(nn.Module):
    """The candidate selector's weights and its edge scores (module docstring)."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int):
        super().__init__()
        if rank < 1 or top_k < 1:
            raise ValueError(f"selector_rank and selector_top_k must be at least 1 "
                             f"(got {rank}, {top_k})")
        self.top_k = int(top_k)
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)

    def forward(self, candidate_ids: torch.Tensor, unary: torch.Tensor, hidden_states: torch.Tensor,
                anchor_ids: torch.Tensor) -> torch.Tensor:
        return score_edges(self.predecessor_codebook, self.successor_codebook, candidate_ids,
                           unary, self.hidden_projection(hidden_states), anchor_ids, self.top_k)


def capped_top_k(logits: torch.Tensor, k: int, multiplier: float = 1.0,
                 softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, values) of the top ``k`` logits, values times ``multiplier`` then soft-capped
    (tanh(v / cap) * cap when ``softcap`` > 0): both monotonic, so the top k are the raw ones."""
    values, ids = torch.topk(logits.float(), k, dim=-1)
    if multiplier != 1.0:
        values = values * multiplier
    if softcap > 0:
        values = torch.tanh(values / softcap) * softcap
    return ids, values


def select_block(model, h: torch.Tensor, head: nn.Module, anchor: int, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, list[int], dict]:
    """DFlash2's draft of one block: final slot states ``h`` [k, H] -> (the walk's scores as
    logits [k, V] float32 on the CPU, -inf outside each slot's K candidates; the drafted ids;
    the round's ``selector`` extras: candidates, their unary logits and the chosen index per
    slot). Greedy walks the best edges; ``temperature`` > 0 samples each step's row."""
    sel = model.candidate_selector
    scores_v = model.draft_scores(h, head, None)
    ids, unary = capped_top_k(scores_v, min(sel.top_k, scores_v.shape[-1]),
                              model.output_multiplier, model.logit_softcap)
    if model.draft_vocab is not None:
        ids = model.draft_vocab.to(ids.device)[ids]
    w = sel.hidden_projection.weight
    edges = sel(ids[None].to(w.device), unary[None].to(w.device, w.dtype),
                h[None].to(w.device, w.dtype),
                torch.tensor([int(anchor)], device=w.device))[0].float().cpu()
    ids, unary = ids.cpu(), unary.float().cpu()
    previous, path, chain = 0, [], []
    rows = torch.full((h.shape[0], head.weight.shape[0]), float("-inf"))
    for step in range(edges.shape[0]):
        row = edges[step, previous]
        if temperature > 0:
            previous = int(torch.multinomial(torch.softmax(row / temperature, -1), 1,
                                             generator=generator))
        else:
            previous = int(row.argmax())
        rows[step, ids[step]] = row
        path.append(previous)
        chain.append(int(ids[step, previous]))
    info = {"candidates": ids.tolist(), "unary": [[round(float(x), 3) for x in r] for r in unary],
            "path": path}
    return rows, chain, info
