"""Batched block forward over stored target features (METHODS §1, DFlash training and replay).

A DFlash block is [anchor token, MASK x (B-1)] at positions a..a+B-1; it attends to the
target's tapped hidden states ("context features") of positions < a and bidirectionally to
itself. Training and offline evaluation put many blocks of one sequence through the drafter at
once: the per-layer context K/V of the sequence is computed ONCE (:func:`sequence_context`) and
each block sees its own prefix of it through a boolean mask (:func:`forward_blocks`), which equals
the drafter's one-block inference forward block by block. Conventions: K blocks, B = block size,
H = hidden size; the target's embedding and LM head are frozen and shared.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..drafters.dflash import DFlashDraftModel
from ..drafters.dflash_model import _rope


def block_embeddings(model: DFlashDraftModel, target, anchor_tokens: torch.Tensor,
                     block_size: int) -> torch.Tensor:
    """[K, B, H]: the target's (frozen) embedding of each anchor token, then B-1 mask slots."""
    emb = target.model.get_input_embeddings()
    K = anchor_tokens.shape[0]
    dt = next(model.parameters()).dtype
    x0 = emb(anchor_tokens.view(K, 1).to(emb.weight.device)).to(dt)
    if model.learned_mask:
        m = model.mask_embedding.view(1, 1, -1).expand(K, block_size - 1, -1)
    else:
        m = emb.weight[model.mask_token_id].to(dt).view(1, 1, -1).expand(K, block_size - 1, -1)
    return torch.cat([x0, m.to(x0.device)], 1)


def forward_blocks(model: DFlashDraftModel, x: torch.Tensor, anchors: torch.Tensor,
                   ctx_kv: list[tuple]) -> torch.Tensor:
    """Final hidden states [K, B, H] of K blocks ``x`` [K, B, H]; block j sits at positions
    anchors[j] .. anchors[j]+B-1 and attends to the context rows < anchors[j] of the shared
    per-layer ``ctx_kv`` ([1, kv, n, D] each) and bidirectionally to itself.
    Equals ``model.forward_block(x[j:j+1], [kv[:, :, :a] ...], a)`` for each j."""
    K, B, _ = x.shape
    pos = anchors.view(K, 1) + torch.arange(B).view(1, B)
    cos, sin = model.rope(pos.reshape(-1), x)
    cos, sin = cos.view(K, B, -1), sin.view(K, B, -1)
    n = ctx_kv[0][0].shape[2]
    ctx_ok = torch.arange(n).view(1, n) < anchors.view(K, 1)            # [K, n]
    mask = torch.cat([ctx_ok, torch.ones(K, B, dtype=torch.bool)], 1)   # [K, n+B]
    mask = mask.view(K, 1, 1, n + B).to(x.device)
    for layer, (ck, cv) in zip(model.layers, ctx_kv):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q = attn.q_norm(attn.q_proj(h).view(K, B, attn.n_heads, attn.head_dim)).transpose(1, 2)
        q = _rope(q, cos, sin)
        k, v = attn.kv(h, cos, sin)
        k = torch.cat([ck.expand(K, -1, -1, -1), k], 2)
        v = torch.cat([cv.expand(K, -1, -1, -1), v], 2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.head_dim ** -0.5,
                                           enable_gqa=attn.n_heads != attn.n_kv)
        x = x + attn.o_proj(o.transpose(1, 2).reshape(K, B, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.norm(x)


def sequence_context(model: DFlashDraftModel, hidden: torch.Tensor, upto: int) -> list[tuple]:
    """Per-layer context K/V of the stored features of positions 0..upto-1."""
    dt = next(model.parameters()).dtype
    dev = next(model.parameters()).device
    feats = hidden[:max(1, upto)].to(device=dev, dtype=dt).unsqueeze(0)
    return model.context_kv(feats, torch.arange(feats.shape[1]))


def anchor_hidden(model, target, tokens: torch.Tensor, hidden: torch.Tensor,
                  anchors: torch.Tensor, ctx_kv=None) -> torch.Tensor:
    """Final drafter states [K, B-1, H] of the mask slots of blocks anchored at ``anchors``."""
    B = model.block_size
    if ctx_kv is None:
        ctx_kv = sequence_context(model, hidden, int(anchors.max()))
    x = block_embeddings(model, target, tokens[anchors], B)
    return forward_blocks(model, x, anchors, ctx_kv)[:, 1:]


def anchor_logits(model, target, tokens: torch.Tensor, hidden: torch.Tensor,
                  anchors: torch.Tensor, ctx_kv=None) -> torch.Tensor:
    """Slot logits [K, B-1, V] (the target's frozen LM head; -inf outside the drafter's draft
    vocabulary when it has one, exactly as at inference) of blocks at ``anchors``."""
    h = anchor_hidden(model, target, tokens, hidden, anchors, ctx_kv)
    return model.slot_logits(h, target.model.get_output_embeddings())
