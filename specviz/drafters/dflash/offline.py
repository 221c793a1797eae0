"""DFlash along a cached rollout: its drafts and acceptance at every decoding state, computed in
a few batched forwards over the stored target features (docs/methods/dflash.md; used by the
offline evaluation, the replay pages and training).

A DFlash block is [anchor token, MASK x (B-1)] at positions a..a+B-1; it attends to the
target's tapped hidden states ("context features") of positions < a and bidirectionally to
itself. Many blocks of one sequence go through the drafter at once: the per-layer context K/V of
the sequence is computed ONCE (:func:`sequence_context`) and each block sees its own prefix of
it through a boolean mask (:func:`forward_blocks`), which equals the drafter's one-block
inference forward block by block. Conventions: K blocks, B = block size, H = hidden size; the
target's embedding and LM head are frozen and shared.

A *state* n of a rollout is the number of reply tokens generated so far; its block is anchored at
prompt_len - 1 + n. Per state: the greedy draft (:func:`dflash_state_drafts`), and the
acceptance a[n, t] of slot t -- greedy (draft == rollout token), relaxed (a = q(y), for
training on greedy rollouts) or sampled (a = min(1, q_T(y) / p(y)) on rollouts sampled at
T > 0, :func:`sampled_state_acceptance`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...errors import SettingsError
from .model import DFlashDraftModel


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
    if model.layout != "dflash" or any(layer.window or layer.causal or layer.self_attn.sinks
                                       for layer in model.layers):
        raise SettingsError("offline evaluation and training run the full-attention DFlash "
                            "layout only (not sliding, causal, attention-sink, DFlash2 or Domino "
                            "drafters); decode with this drafter instead")
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
        q = attn.rope(q, cos, sin)
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


# --------------------------------------------------------------------------- every state
def acceptance_from_probs(slot_probs_of_y: torch.Tensor,
                          p_of_y: torch.Tensor | None = None) -> torch.Tensor:
    """Acceptance matrix from the drafter's probability q(y) of the rollout token at each
    (state, slot). Without ``p_of_y``: a = q(y), a smooth stand-in for greedy acceptance
    (whose gradient is zero almost everywhere). With the target's p(y): sampled acceptance
    a = min(1, q(y) / p(y)), the probability that a sampled round accepts the slot."""
    q = slot_probs_of_y.clamp(0.0, 1.0)
    if p_of_y is None:
        return q
    return torch.minimum(torch.ones_like(q), q / p_of_y.clamp_min(1e-12))


@torch.no_grad()
def dflash_state_drafts(model, target, tokens: torch.Tensor, hidden: torch.Tensor,
                        prompt_len: int, block_size: int | None = None,
                        chunk: int = 96) -> list[list[int]]:
    """DFlash's greedy draft at every state n of a rollout in batched forwards: the block of
    state n is anchored at prompt_len-1+n and sees the context < that anchor (as the live
    drafter with ``cut="off"`` does); drafts are clipped to the budget L-n-1."""

    T, P = int(tokens.shape[0]), int(prompt_len)
    L = T - P
    B = model.block_size
    k = (block_size or B) - 1
    head = target.model.get_output_embeddings()
    ctx_kv = sequence_context(model, hidden, T - 1)
    out: list[list[int]] = []
    for s in range(0, L, chunk):
        anchors = torch.arange(P - 1 + s, P - 1 + min(L, s + chunk))
        h = forward_blocks(model, block_embeddings(model, target, tokens[anchors], B), anchors,
                           ctx_kv)[:, 1:1 + k]
        # DSpark's Markov head is teacher-forced: slot j's previous token is the rollout's
        # (exact for greedy acceptance, see specviz.drafters.dflash.dspark); plain DFlash ignores it
        prev = tokens[(anchors.view(-1, 1) + torch.arange(k).view(1, -1)).clamp(max=T - 1)]
        top = model.slot_argmax(h, head, prev=prev).tolist()
        for j, n in enumerate(range(s, min(L, s + chunk))):
            out.append([int(t) for t in top[j][:max(0, min(k, L - n - 1))]])
    return out


def state_logprobs(model, target, tokens: torch.Tensor, ctx_kv, prompt_len: int,
                   states: torch.Tensor, temperature: float = 1.0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log q_{n_s, t}(y[n_s + t - 1]) [S, B-1], valid [S, B-1]): the drafter's log-probability
    (over its draft vocabulary at ``temperature``, as at inference) of the rollout token in slot
    t of the block at state n_s; invalid past the rollout's end or for a word outside the draft
    vocabulary."""
    T, P, B = int(tokens.shape[0]), int(prompt_len), model.block_size
    anchors = P - 1 + states
    h = forward_blocks(model, block_embeddings(model, target, tokens[anchors], B), anchors,
                       ctx_kv)[:, 1:]
    pos = anchors.view(-1, 1) + torch.arange(1, B).view(1, -1)
    prev = tokens[(pos - 1).clamp(max=T - 1)]   # DSpark's Markov head, teacher-forced
    logits = model.slot_logits(h, target.model.get_output_embeddings(), prev=prev).float()
    y = tokens[pos.clamp(max=T - 1)].to(logits.device)
    lp = torch.log_softmax(logits / temperature, -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
    ok = (pos < T).to(lp.device) & torch.isfinite(lp)
    return torch.where(ok, lp, torch.zeros_like(lp)), ok


def slot_target_p(p_reply: torch.Tensor, states: torch.Tensor, k: int) -> torch.Tensor:
    """p(y[n_s + t - 1]) [S, k] for slots t = 1..k of the blocks at ``states`` from a sampled
    rollout's per-reply-token target probabilities (1 past the reply's end: masked anyway)."""
    idx = states.view(-1, 1) + torch.arange(k).view(1, -1)
    ok = idx < p_reply.shape[0]
    return torch.where(ok, p_reply[idx.clamp(max=p_reply.shape[0] - 1)],
                       torch.ones((), dtype=p_reply.dtype))


def state_acceptance(model, target, tokens: torch.Tensor, ctx_kv, prompt_len: int,
                     states: torch.Tensor, p_reply: torch.Tensor | None = None,
                     temperature: float = 1.0) -> torch.Tensor:
    """a[s, t] for slot t of the block at state n_s (0 past the rollout's end or outside the
    draft vocabulary); differentiable. Greedy rollouts (``p_reply`` None): the relaxed
    a = q(y). Sampled rollouts: a = min(1, q_T(y) / p(y)) (:func:`acceptance_from_probs`)."""
    lp, ok = state_logprobs(model, target, tokens, ctx_kv, prompt_len, states,
                            temperature if p_reply is not None else 1.0)
    q = torch.where(ok, lp.exp(), torch.zeros_like(lp))
    if p_reply is None:
        return q
    return acceptance_from_probs(q, slot_target_p(p_reply, states, q.shape[-1]).to(q))


def all_state_acceptance(model, target, tokens, ctx_kv, prompt_len: int,
                         p_reply: torch.Tensor | None = None, temperature: float = 1.0,
                         chunk: int = 128) -> torch.Tensor:
    """a [L, B-1] (float64) of every state of a rollout, in chunks of ``chunk`` states."""
    L = int(tokens.shape[0]) - int(prompt_len)
    return torch.cat([state_acceptance(model, target, tokens, ctx_kv, prompt_len,
                                       torch.arange(s, min(L, s + chunk)), p_reply, temperature)
                      for s in range(0, L, chunk)]).double()


@torch.no_grad()
def sampled_state_acceptance(model, target, tokens: torch.Tensor, hidden: torch.Tensor,
                             prompt_len: int, p_reply: torch.Tensor, temperature: float,
                             block_size: int | None = None) -> torch.Tensor:
    """Sampled acceptance a [L, k] of a DFlash / DSpark drafter drafting at ``temperature`` on
    a sampled rollout (its per-token target probabilities ``p_reply``), all states batched."""
    a = all_state_acceptance(model, target, tokens, sequence_context(model, hidden,
                                                                     int(tokens.shape[0])),
                             prompt_len, p_reply, temperature)
    return a[:, :(block_size or model.block_size) - 1]
