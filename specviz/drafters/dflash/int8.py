"""Drafter weights in int8 on a CPU (docs/methods/dflash.md): the drafter's forward is part of
every drafted round's cost.

A block drafter's forward multiplies a handful of rows (the block's B slots) by every weight
matrix once, so on a CPU it is bound by reading the weights from memory, not by arithmetic:
the bundled two-layer DFlash drafter reads ~28 MB of float32 weights (plus ~23 MB for its
draft-vocabulary head) per forward, and the target's own forward has just pushed them out of
the cache. Dynamically quantized int8 linears (torch's ``quantize_dynamic``: int8 weights with
one scale per tensor, activations quantized per call) read a quarter of the bytes. Only the
decoder layers and the draft-vocabulary head are quantized; ``fc`` stays float (the target's
hidden states it reads have a few huge channels that per-tensor int8 cannot carry).

The drafter's tokens may change slightly (a drafter is an approximation anyway); the output
cannot: the target verifies every token in float32 as before, so speculative decoding stays
lossless. Whether int8 is faster is measured on the machine at load (:func:`faster`), never
assumed; :func:`int8_copy` leaves the float model untouched (training, offline replay and other
drafters share it) and is built once per float model.
"""
from __future__ import annotations

import copy
import time
import warnings

import torch
from torch import nn

from .model import DFlashDraftModel


def _quantize(module: nn.Module, only: str = "") -> nn.Module:
    """``module``'s linears (those whose name starts with ``only``) as dynamic int8, in place."""
    from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic

    spec = {name: default_dynamic_qconfig for name, m in module.named_modules()
            if isinstance(m, nn.Linear) and name.startswith(only)}
    with warnings.catch_warnings():     # torch >= 2.10 points eager quantization to torchao
        warnings.simplefilter("ignore")
        return quantize_dynamic(module, spec, dtype=torch.qint8, inplace=True)


def available(model: DFlashDraftModel) -> bool:
    """int8 linears exist for a float32 drafter on a CPU with a quantized engine."""
    p = next(model.parameters())
    return p.device.type == "cpu" and p.dtype == torch.float32 and \
        any(e != "none" for e in torch.backends.quantized.supported_engines)


def int8_copy(model: DFlashDraftModel, head: nn.Module) -> DFlashDraftModel:
    """A copy of ``model`` whose linears -- and draft-vocabulary rows of the target's LM
    ``head`` -- are dynamically quantized int8 (cached on ``model`` per head)."""
    stamp = (head.weight, [(p.data_ptr(), p._version) for p in model.parameters()])
    cached = getattr(model, "_int8", None)
    if cached is not None and cached[0] is stamp[0] and cached[1] == stamp[1]:
        return cached[2]   # built for these very weights (training updates them in place)
    q = DFlashDraftModel(model.config)
    q.load_state_dict(model.state_dict())
    q.draft_vocab = model.draft_vocab
    q.eval()
    # the decoder layers only: ``fc`` reads the target's hidden states, whose few huge channels
    # leave nothing of the rest under per-tensor int8 activations (held-out tau 1.93 -> 1.79)
    _quantize(q, only="layers.")
    if q.draft_vocab is not None:   # the head's rows the drafter scores, quantized too
        sub = model.sub_head(head)
        q._sub_head = (head.weight, q.draft_vocab.to(head.weight.device), head.weight.dtype,
                       _quantize(nn.Sequential(copy.deepcopy(sub)))[0])
    model._int8 = (*stamp, q)
    return q


def block_ms(model: DFlashDraftModel, head: nn.Module, repeats: int = 7) -> float:
    """Median ms of one block forward + head on a 256-position context (a drafted round's
    drafter work), measured on this machine."""
    H, B = model.hidden_size, model.block_size
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(1, 256, len(model.target_layer_ids) * H, generator=g)
    x = torch.randn(1, B, H, generator=g)
    ts = []
    evict = torch.zeros(8 << 20)   # 32 MB: a target forward runs between two drafted blocks
    with torch.inference_mode():
        kv = model.context_kv(feats, torch.arange(256))
        for i in range(repeats + 2):
            evict.add_(1.0)
            t0 = time.perf_counter()
            h = model.forward_block(x, kv, 256)[0, 1:]
            model.draft_scores(h, head, None)
            if i >= 2:
                ts.append(time.perf_counter() - t0)
    return 1000 * sorted(ts)[len(ts) // 2]


MIN_PARAMS = 1 << 20   # below ~4 MB of float weights the layers stay in cache: nothing to gain


def layer_params(model: DFlashDraftModel) -> int:
    return sum(m.weight.numel() for m in model.layers.modules() if isinstance(m, nn.Linear))


def faster(model: DFlashDraftModel, head: nn.Module) -> bool:
    """Is the int8 copy's block forward faster than the float model's here? (measured once per
    model; never for layers small enough to stay in the cache)"""
    known = getattr(model, "_int8_faster", None)
    if known is None and layer_params(model) < MIN_PARAMS:
        known = model._int8_faster = False
    if known is None:
        q = int8_copy(model, head)
        f32, i8 = block_ms(model, head), block_ms(q, head)
        known = i8 < 0.9 * f32
        model._int8_faster = known
        model._int8_ms = (round(f32, 2), round(i8, 2))
    return known
