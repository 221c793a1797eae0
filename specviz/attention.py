"""Grouped-query attention without copying the KV cache, for verify forwards on a CPU.

Every speculative round verifies k >= 2 tokens in one target forward, and such a forward has an
attention mask (causal over the new rows, or a token tree's). For grouped-query models
(SmolLM2: 9 query heads on 3 key/value heads) transformers' SDPA attention then *copies* the
whole KV cache of every layer to as many heads as the queries (``repeat_kv``) before calling the
kernel -- it lets SDPA share the key/value heads itself (``enable_gqa``) only where there is no
mask, i.e. in the one-token steps of plain decoding. So a verify forward pays a copy of the whole
cache per layer that a plain step does not: on the embedded model at 300 cached tokens ~2.7 ms of
a ~40 ms two-token forward, growing with the context.

:func:`gqa_sdpa_attention` is transformers' SDPA attention with ``enable_gqa`` on a CPU whatever
the mask: the same kernel on the same numbers, computed per key/value head instead of on copies
(measured bitwise-equal logits at 2, 8 and 17 tokens; ``tests/test_attention.py``). Elsewhere
(accelerators, where masked GQA can fall back to a slower kernel; one-token queries; models
without grouped heads; position biases or soft-capping) it is transformers' own function.
:func:`use_gqa_attention` switches a loaded model to it (``models.load_target`` does, for CPU
targets that use SDPA; ``SPECVIZ_ATTENTION=sdpa`` keeps transformers' own).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

ATTENTION = "specviz_sdpa_gqa"


def gqa_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                       scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers' ``sdpa_attention_forward``, with SDPA's own GQA under a mask on a CPU."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    own = (query.device.type == "cpu" and attention_mask is not None and query.shape[2] > 1
           and getattr(module, "num_key_value_groups", 1) > 1
           and key.shape[-1] == value.shape[-1]
           and kwargs.get("position_bias") is None and kwargs.get("softcap") is None)
    if not own:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                         dropout_p=dropout, scale=scaling, is_causal=False,
                                         enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def use_gqa_attention(model: torch.nn.Module) -> bool:
    """Switch ``model`` from SDPA to :func:`gqa_sdpa_attention` (same masks). False, and
    nothing changed, where it does not use SDPA or has no grouped key/value heads."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    cfg = getattr(model, "config", None)
    heads = getattr(cfg, "num_attention_heads", None)
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    if getattr(cfg, "_attn_implementation", None) != "sdpa" or not heads or kv_heads >= heads:
        return False
    AttentionInterface.register(ATTENTION, gqa_sdpa_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    model.set_attn_implementation(ATTENTION)
    return True
