"""KV-cache surgery after a verify forward (speculative decoding, step 4).

A verify forward appends one KV row per input token [last committed token, draft...] to the
target's cache. After verification only the committed rows may stay: the root and the accepted
path. For a chain (or a tree whose accepted path is its first branch) those rows are a prefix,
so the cache is cropped; otherwise the path's rows are gathered first (EAGLE/Medusa-style).
"""
from __future__ import annotations

import functools
import inspect

import torch


@functools.lru_cache(maxsize=None)
def _cache_kwarg_for(model_cls) -> str:
    params = inspect.signature(model_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwarg(model) -> str:
    """transformers 5.x renamed ``past_key_values`` to ``cache``; use whichever forward takes."""
    return _cache_kwarg_for(type(model))


def accepts_logits_to_keep(model) -> bool:
    """Whether ``model.forward`` takes transformers' ``logits_to_keep`` (LM head on the last
    rows only); remote-code or older models may not."""
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def cache_len(cache) -> int:
    return int(cache.get_seq_length()) if cache is not None else 0


def keep_rows(cache, start: int, rows: list[int]) -> None:
    """Keep the cache's first ``start`` rows plus the verify rows ``rows`` (ascending, relative
    to ``start``); drop every other row the verify forward appended."""
    if rows == list(range(len(rows))):
        drop = cache_len(cache) - (start + len(rows))
        if drop > 0:
            cache.crop(-drop)  # transformers 5: a negative count removes that many rows
        return
    keep = torch.tensor(list(range(start)) + [start + r for r in rows])
    for layer in cache.layers:
        idx = keep.to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, idx)
        layer.values = layer.values.index_select(-2, idx)
