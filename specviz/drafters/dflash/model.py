"""The DFlash draft model (docs/methods/dflash.md): a few Qwen3-style decoder layers that denoise
one block [anchor, MASK x (B-1)] while attending to the target's tapped hidden states (architecture
and weight names: :mod:`specviz.drafters.dflash`). Pure torch modules; checkpoints and the drafter
live in :mod:`.checkpoint` and :mod:`.drafter`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import SettingsError
from ...models import ModelLoadError

DRAFT_VOCAB_KEY = "draft_vocab"


# --------------------------------------------------------------------------- helpers
def default_target_layer_ids(num_target_layers: int, k: int) -> list[int]:
    """k target layer ids evenly spaced in [1, L-3] (Qwen3 36 layers, k=5 -> [1,9,17,25,33]);
    k == 1 takes the middle layer. Small targets are clamped to valid, distinct ids."""
    L = int(num_target_layers)
    if L <= 0 or k <= 0:
        raise SettingsError("DFlash needs a target with at least one layer and k >= 1")
    if k == 1:
        return [L // 2 if L > 1 else 0]
    lo, hi = min(1, L - 1), max(min(1, L - 1), L - 3)
    ids = sorted({min(L - 1, int(round(lo + i * (hi - lo) / (k - 1)))) for i in range(k)})
    return ids


def _rms_norm(dim: int, eps: float) -> nn.Module:
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    return Qwen3RMSNorm(dim, eps=eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               interleaved: bool = False) -> torch.Tensor:
    """x [1, heads, T, D]; cos/sin [1, T, D] (the frequencies twice, as HF builds them).
    NeoX style rotates the pairs (i, i + D/2); ``interleaved`` (``is_neox_style: false``)
    rotates the pairs (2i, 2i + 1) by frequency i."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if not interleaved:
        return x * cos + _rotate_half(x) * sin
    half = x.shape[-1] // 2
    cos, sin = cos[..., :half], sin[..., :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2)


def _block_size_of(cfg: dict) -> int | None:
    b = cfg.get("block_size")
    if b is None:
        b = (cfg.get("dflash_config") or {}).get("block_size")
    return None if b is None else int(b)


def _target_layer_ids_of(cfg: dict) -> list[int]:
    dc = cfg.get("dflash_config") or {}
    ids = dc.get("target_layer_ids")
    if ids is None:  # the reference's fallback: k = number of drafter layers
        ids = default_target_layer_ids(int(cfg["num_target_layers"]), int(cfg["num_hidden_layers"]))
    return [int(i) for i in ids]


# --------------------------------------------------------------------------- the model
class DFlashAttention(nn.Module):
    """Qwen3 attention of the block over [context, block]; ``sinks``: a learned per-head logit
    that joins every softmax as one more key with a zero value (an attention sink). From the
    config: ``dflash_config.attention_value_scale`` multiplies every value (context and block,
    as vLLM does), ``is_neox_style: false`` rotates interleaved pairs."""

    def __init__(self, cfg: dict, sinks: bool = False):
        super().__init__()
        H = int(cfg["hidden_size"])
        self.n_heads = int(cfg["num_attention_heads"])
        self.n_kv = int(cfg.get("num_key_value_heads") or self.n_heads)
        self.head_dim = int(cfg.get("head_dim") or H // self.n_heads)
        bias = bool(cfg.get("attention_bias", False))
        eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.q_proj = nn.Linear(H, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(H, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(H, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, H, bias=bias)
        self.q_norm = _rms_norm(self.head_dim, eps)
        self.k_norm = _rms_norm(self.head_dim, eps)
        if sinks:
            self.attention_sink_bias = nn.Parameter(torch.zeros(self.n_heads))
        self.sinks = sinks
        v_scale = (cfg.get("dflash_config") or {}).get("attention_value_scale")
        self.v_scale = None if v_scale is None else float(v_scale)
        self.interleaved = cfg.get("is_neox_style", True) is False

    def rope(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        return apply_rope(x, cos, sin, self.interleaved)

    def kv(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (k_norm + RoPE) and values [1, kv_heads, T, D] of x [1, T, H]."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        if self.v_scale is not None:
            v = v * self.v_scale
        return self.rope(k, cos, sin), v

    def forward(self, x, ctx_k, ctx_v, cos, sin, window: int | None = None,
                causal: bool = False) -> torch.Tensor:
        """Block rows ``x`` [1, t, H] attend to the context (positions 0..n-1) and to the block
        (all of it, or rows up to their own when ``causal``); ``window``: a sliding layer's keys
        are those less than ``window`` positions behind the query (block at n..n+t-1)."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.n_heads, self.head_dim)).transpose(1, 2)
        q = self.rope(q, cos, sin)
        k, v = self.kv(x, cos, sin)
        n = ctx_k.shape[2]
        k = torch.cat([ctx_k, k], dim=2)
        v = torch.cat([ctx_v, v], dim=2)
        mask = block_mask(n, t, window, causal, x.device)
        if self.sinks:   # one more key per head: logit = the sink, value 0
            k = torch.cat([k, k.new_zeros(b, self.n_kv, 1, self.head_dim)], dim=2)
            v = torch.cat([v, v.new_zeros(b, self.n_kv, 1, self.head_dim)], dim=2)
            bias = q.new_zeros(1, self.n_heads, t, n + t + 1)
            if mask is not None:
                bias[..., :-1].masked_fill_(~mask, float("-inf"))
            bias[..., -1] = self.attention_sink_bias.to(q.dtype).view(1, -1, 1)
            mask = bias
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False,
                                             scale=self.head_dim ** -0.5,   # GQA: no K/V copies
                                             enable_gqa=self.n_heads != self.n_kv)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


def block_mask(n: int, t: int, window: int | None, causal: bool, device) -> torch.Tensor | None:
    """Keys the block rows may see [t, n + t] (True = attend), or None when all of them:
    the query at position n + i sees key j iff n + i - j < ``window`` (a sliding layer) and,
    ``causal``, j <= n + i."""
    if not causal and (not window or n < window):
        return None
    q = torch.arange(n, n + t, device=device).view(-1, 1)
    keys = torch.arange(n + t, device=device).view(1, -1)
    mask = torch.ones(t, n + t, dtype=torch.bool, device=device)
    if window:
        mask &= (q - keys) < int(window)
    if causal:
        mask &= keys <= q
    return mask


class DFlashMLP(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        from transformers.activations import ACT2FN

        H, inter = int(cfg["hidden_size"]), int(cfg["intermediate_size"])
        self.gate_proj = nn.Linear(H, inter, bias=False)
        self.up_proj = nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)
        self.act = ACT2FN[cfg.get("hidden_act", "silu")]

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DFlashDecoderLayer(nn.Module):
    """A Qwen3 layer over the block; ``attention`` = (sliding window or None, causal within the
    block); DFlash2 layers (``conv`` = (taps, group size, block size)) wrap attention and MLP in
    grouped block convolutions."""

    def __init__(self, cfg: dict, attention: tuple = (None, False), conv: tuple | None = None,
                 sinks: bool = False):
        super().__init__()
        H, eps = int(cfg["hidden_size"]), float(cfg.get("rms_norm_eps", 1e-6))
        self.self_attn = DFlashAttention(cfg, sinks)
        self.mlp = DFlashMLP(cfg)
        self.input_layernorm = _rms_norm(H, eps)
        self.post_attention_layernorm = _rms_norm(H, eps)
        self.window, self.causal = attention
        if conv is not None:
            from .dflash2 import GroupedConv

            self.attention_conv = GroupedConv(H, *conv)
            self.mlp_conv = GroupedConv(H, *conv)
        self.conv = conv is not None

    def forward(self, x, ctx_k, ctx_v, cos, sin):
        if not self.conv:
            x = x + self.self_attn(self.input_layernorm(x), ctx_k, ctx_v, cos, sin, self.window,
                                   self.causal)
            return x + self.mlp(self.post_attention_layernorm(x))
        h, coef = self.attention_conv.prepare(self.input_layernorm(x)[0])
        h = self.self_attn(h.unsqueeze(0), ctx_k, ctx_v, cos, sin, self.window, self.causal)[0]
        x = x + self.attention_conv.finish(h, coef).unsqueeze(0)
        h, coef = self.mlp_conv.prepare(self.post_attention_layernorm(x)[0])
        return x + self.mlp_conv.finish(self.mlp(h), coef).unsqueeze(0)


class DFlashDraftModel(nn.Module):
    """The DFlash drafter network (no embedding, no LM head). ``config`` is the checkpoint's
    config.json as a dict (kept JSON-serialisable in ``self.config``)."""

    def __init__(self, config: dict):
        super().__init__()
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        cfg = dict(config)
        self.config = cfg
        H, eps = int(cfg["hidden_size"]), float(cfg.get("rms_norm_eps", 1e-6))
        self.hidden_size = H
        self.target_layer_ids = _target_layer_ids_of(cfg)
        self.block_size = _block_size_of(cfg)
        if self.block_size is None:
            raise ModelLoadError("DFlash config has no block_size")
        dc = cfg.get("dflash_config") or {}
        self.learned_mask = bool(dc.get("learned_mask_embedding", False))
        mid = dc.get("mask_token_id")
        self.mask_token_id = None if mid is None else int(mid)
        if self.mask_token_id is None and not self.learned_mask:
            raise ModelLoadError("DFlash config has neither dflash_config.mask_token_id nor "
                                 "dflash_config.learned_mask_embedding")
        from .layouts import has_sinks, layer_attentions, layout_of

        self.layout = layout_of(cfg)
        n_layers = int(cfg["num_hidden_layers"])
        attention = layer_attentions(cfg, n_layers)
        conv = None
        if self.layout == "dflash2":
            conv = (int(dc["conv_kernel_size"]), int(dc["conv_group_size"]), self.block_size)
        self.layers = nn.ModuleList(DFlashDecoderLayer(cfg, attention[i], conv, has_sinks(cfg))
                                    for i in range(n_layers))
        self.input_embedding_scale = float(dc.get("input_embedding_scale") or 1.0)
        self.output_multiplier = float(dc.get("output_multiplier") or 1.0)
        self.logit_softcap = float(dc.get("final_logit_softcapping") or 0.0)
        if self.layout == "dflash2":
            from .dflash2 import CandidateSelector

            self.candidate_selector = CandidateSelector(H, int(cfg["vocab_size"]),
                                                        int(dc["selector_rank"]),
                                                        int(dc["selector_top_k"]))
        self.shift_label = False   # slot i predicts its own position (Domino may shift)
        if self.layout == "domino":
            from .domino import add_domino_head
            from .layouts import domino_dims

            d = domino_dims(cfg)
            self.shift_label = d["shift_label"]
            add_domino_head(self, H, d["gru_hidden_dim"], d["emb_dim"], int(cfg["vocab_size"]))
        self.fc = nn.Linear(len(self.target_layer_ids) * H, H, bias=False)
        self.hidden_norm = _rms_norm(H, eps)
        self.norm = _rms_norm(H, eps)
        if self.learned_mask:
            self.mask_embedding = nn.Parameter(torch.zeros(H))
        # Optional draft vocabulary (sorted target ids; FR-Spec-style): the drafter scores only
        # these rows of the frozen LM head -- the head over 49k words costs more than the
        # drafter's layers on a CPU. Stored as the extra tensor DRAFT_VOCAB_KEY; not a buffer,
        # so published checkpoints (without it) keep loading strictly.
        self.draft_vocab: torch.Tensor | None = None
        # Optional Markov head (DSpark, :mod:`.dspark`): a low-rank logit bias from the previous
        # token, W2 W1[x_{k-1}], over the draft vocabulary (or every word).
        self.markov_rank = int(dc.get("markov_rank") or 0)
        if self.markov_rank and self.layout != "dflash":
            raise ModelLoadError(f"DFlash config: a Markov head (markov_rank) goes with the plain "
                                 f"DFlash layout only, not {self.layout}")
        if self.markov_rank:
            out = int(dc.get("draft_vocab_size") or cfg["vocab_size"])
            self.markov_in = nn.Embedding(int(cfg["vocab_size"]), self.markov_rank)
            self.markov_out = nn.Linear(self.markov_rank, out, bias=False)
        rope_keys = {k: cfg[k] for k in ("hidden_size", "num_attention_heads", "head_dim",
                                         "rope_theta", "rope_parameters", "rope_scaling",
                                         "max_position_embeddings", "partial_rotary_factor")
                     if cfg.get(k) is not None}
        # kept out of the module tree: no stored weights, and .to(bfloat16) must not round
        # inv_freq (the rotary embedding computes cos/sin in float32)
        self._rotary = [Qwen3RotaryEmbedding(Qwen3Config(**rope_keys))]

    # -- init (new drafters)
    def init_weights(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias") or name == "markov_out.weight":  # DSpark starts as DFlash
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=generator) * std)

    # -- building blocks
    def rope(self, positions: torch.Tensor, like: torch.Tensor):
        rot = self._rotary[0]
        if rot.inv_freq.device != like.device:
            rot.to(like.device)
        return rot(like, positions.view(1, -1).to(like.device))

    def context_features(self, feats: torch.Tensor) -> torch.Tensor:
        """[1, T, k*H] concatenated target hidden states -> [1, T, H] (fc + hidden_norm)."""
        return self.hidden_norm(self.fc(feats))

    def context_kv(self, feats: torch.Tensor, positions: torch.Tensor) -> list[tuple]:
        """Per-layer (K, V) of the context rows ``feats`` [1, T, k*H] at ``positions`` [T]."""
        c = self.context_features(feats)
        cos, sin = self.rope(positions, c)
        return [layer.self_attn.kv(c, cos, sin) for layer in self.layers]

    def forward_block(self, block_emb: torch.Tensor, ctx_kv: list[tuple], start: int) -> torch.Tensor:
        """Final hidden states [1, B, H] of the block embedded as ``block_emb`` [1, B, H] whose
        slot 0 sits at absolute position ``start``, given per-layer context K/V."""
        pos = torch.arange(start, start + block_emb.shape[1])
        cos, sin = self.rope(pos, block_emb)
        x = block_emb if self.input_embedding_scale == 1.0 else \
            block_emb * self.input_embedding_scale
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, k, v, cos, sin)
        return self.norm(x)

    def markov_bias(self, prev: torch.Tensor) -> torch.Tensor | None:
        """The Markov head's logit bias W2 W1[prev] [..., V_draft] for previous tokens ``prev``
        (ids [...]); None without a Markov head (plain DFlash)."""
        if not self.markov_rank:
            return None
        return self.markov_out(self.markov_in(prev.to(self.markov_in.weight.device)))

    def draft_scores(self, h: torch.Tensor, head: nn.Module,
                      prev: torch.Tensor | None) -> torch.Tensor:
        """Scores [..., Vd] over the draft vocabulary (all words without one), plus the Markov
        bias of ``prev`` when the drafter has a Markov head."""
        h = h.to(device=head.weight.device, dtype=head.weight.dtype)
        sub = head(h) if self.draft_vocab is None else self.sub_head(head)(h)
        bias = None if prev is None else self.markov_bias(prev)
        return sub if bias is None else sub + bias.to(sub.dtype)

    def sub_head(self, head: nn.Module) -> nn.Linear:
        """The LM head's draft-vocabulary rows as a linear [Vd, H] (built once per head; kept in
        a tuple, so it is not a submodule and never in the checkpoint)."""
        dv = self.draft_vocab.to(head.weight.device)
        cached = getattr(self, "_sub_head", None)
        if cached is None or cached[0] is not head.weight or cached[1].device != dv.device \
                or cached[2] != head.weight.dtype or cached[1].numel() != dv.numel():
            w = head.weight.detach()[dv].contiguous()
            lin = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
            lin.weight = nn.Parameter(w, requires_grad=False)
            cached = (head.weight, dv, head.weight.dtype, lin)
            self._sub_head = cached
        return cached[3]

    def slot_logits(self, h: torch.Tensor, head: nn.Module,
                    prev: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [..., V] of final states ``h`` through the target's LM ``head``; with a draft
        vocabulary only those rows are computed and every other word gets -inf. ``prev`` (ids
        [...], the token before each slot) adds the Markov head's bias (DSpark)."""
        return self.full_vocab(self.draft_scores(h, head, prev), head.weight.shape[0])

    def full_vocab(self, sub: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Draft-vocabulary scores [..., Vd] as logits over all ``vocab_size`` words (-inf for
        words outside the draft vocabulary; unchanged without one)."""
        if self.draft_vocab is None:
            return sub
        out = sub.new_full((*sub.shape[:-1], vocab_size), float("-inf"))
        out[..., self.draft_vocab.to(sub.device)] = sub
        return out

    def slot_argmax(self, h: torch.Tensor, head: nn.Module,
                    prev: torch.Tensor | None = None) -> torch.Tensor:
        """argmax of :meth:`slot_logits` (token ids [...]) without building the full-vocabulary
        tensor: with a draft vocabulary only its rows are scored (offline evaluation)."""
        top = self.draft_scores(h, head, prev).argmax(-1)
        return top if self.draft_vocab is None else self._sub_head[1][top]

    def forward(self, block_emb: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """No-cache reference path: context [1, n, k*H] of positions 0..n-1, block at n."""
        n = context.shape[1]
        return self.forward_block(block_emb, self.context_kv(context, torch.arange(n)), n)
