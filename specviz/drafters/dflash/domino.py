"""Domino: the DFlash backbone plus a small causal correction head
(docs/methods/dflash.md#published-layouts), drafted as SGLang serves it
(``speculative/domino_utils.py``, ``domino_greedy_rollout``).

The backbone drafts the whole block in parallel, so slot i never sees the words drafted before
it. Domino adds that dependency back, left to right:

* **base logits**: the target's LM head on the backbone's final states ``z``: slots 0..k-1 with
  ``shift_label`` (slot 0, the anchor's, predicts the first new word), else slots 1..k.
* **first word**: the base logits alone (``pure_draft_prefix_len`` = 1).
* **GRU state**: ``prefix_gru`` (one layer, no bias) over the target's embeddings of the anchor
  and the first word; after each later word, one GRU step on its embedding.
* **word i >= 2**: base logits of slot i + ``embed_proj([z_i ; state])`` (Linear, SiLU, Linear
  to the vocabulary: a logit correction).
* **candidate pool**: as SGLang, when the vocabulary is larger than :data:`CANDIDATE_POOL`,
  words 2.. are chosen among the pool of the words with the highest base logit at any of those
  slots (-inf elsewhere).

Greedy takes each row's argmax; with ``draft_temperature`` > 0 each word is sampled from its
row, and those rows are the draft's q (the next row depends only on words already drawn, so
verification stays lossless).
"""
from __future__ import annotations

import torch
from torch import nn

CANDIDATE_POOL = 2048   # SGLang's _DOMINO_CANDIDATE_POOL_SIZE


def add_domino_head(model: nn.Module, hidden_size: int, gru_hidden_dim: int, emb_dim: int,
                    vocab_size: int) -> None:
    """Give the drafter network Domino's ``prefix_gru`` and ``embed_proj`` (published names:
    ``prefix_gru.weight_{ih,hh}_l0``, ``embed_proj.{0,2}.weight``)."""
    model.prefix_gru = nn.GRU(hidden_size, gru_hidden_dim, num_layers=1, batch_first=True,
                              bias=False)
    model.embed_proj = nn.Sequential(nn.Linear(hidden_size + gru_hidden_dim, emb_dim, bias=False),
                                     nn.SiLU(), nn.Linear(emb_dim, vocab_size, bias=False))


def _pool(base: torch.Tensor, pool: int) -> torch.Tensor | None:
    """Ids [P] of the candidate pool for words 2.. (None: the whole vocabulary)."""
    if base.shape[0] < 2 or not 0 < pool < base.shape[-1]:
        return None
    return torch.topk(base[1:].amax(0), pool, sorted=False).indices


def _pick(row: torch.Tensor, temperature: float, generator) -> int:
    if temperature > 0:
        return int(torch.multinomial(torch.softmax(row / temperature, -1), 1, generator=generator))
    return int(row.argmax())


def domino_block(model, h: torch.Tensor, head: nn.Module, embed: nn.Module, anchor: int, k: int,
                 temperature: float = 0.0, generator: torch.Generator | None = None,
                 pool: int = CANDIDATE_POOL) -> tuple[torch.Tensor, list[int], dict]:
    """Domino's draft of ``k`` words from the block's final states ``h`` [B, H] (every slot,
    anchor's first): (rows [k, V] float32 on the CPU, the rows the words were chosen from;
    the words; the round's ``domino`` extras: the backbone's own word per slot and whether the
    correction changed it)."""
    z = h[0:k] if model.shift_label else h[1:k + 1]
    base = model.draft_scores(z, head, None).float()   # Domino: no draft vocabulary
    pool_ids = _pool(base, pool)
    rows = base.new_full(base.shape, float("-inf"))
    rows[0] = base[0]
    words = [_pick(rows[0], temperature, generator)]
    gru = model.prefix_gru
    w = gru.weight_ih_l0

    def embedded(tokens: list[int]) -> torch.Tensor:   # the target's embeddings, GRU-side
        return embed(torch.tensor(tokens, device=embed.weight.device)).to(w)

    _, state = gru(embedded([int(anchor), words[0]])[None])
    state = state[0]
    for i in range(1, z.shape[0]):
        corr = model.embed_proj(torch.cat([z[i:i + 1].to(w), state], -1))[0]
        corr = corr.to(base.device, torch.float32)
        if pool_ids is None:
            rows[i] = base[i] + corr
        else:
            rows[i, pool_ids] = base[i, pool_ids] + corr[pool_ids]
        words.append(_pick(rows[i], temperature, generator))
        if i + 1 < z.shape[0]:   # one GRU step on the word just drafted
            state = torch.ops.aten.gru_cell(embedded(words[-1:]), state, w, gru.weight_hh_l0)
    backbone = base.argmax(-1).tolist()
    info = {"backbone": backbone, "corrected": [int(d != b) for d, b in zip(words, backbone)]}
    return rows.cpu(), words, info
