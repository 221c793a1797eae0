"""DFlash drafter weights at run time (docs/methods/dflash.md): packed CPU kernels and int8 copies.

The drafter's linears use the measured oneDNN packed kernels the target chose
(:mod:`specviz.kernels`) where faster. On a CPU a float32 drafter's forward is bound by reading its
weights; ``weights="int8"`` (or ``"auto"``: where measured faster at load) runs int8 copies of the
decoder layers and the draft-vocabulary head (:mod:`specviz.drafters.dflash.int8`). The target still
verifies every token, so output is unchanged; but int8 activations are quantized per call over the
whole batch, so an offline replay (one forward over a stored text) no longer drafts exactly what the
live run drafted, and the default stays ``float``. :func:`drafter_model` gives the model a drafter
runs (loaded or adopted, checked, tuned).
"""
from __future__ import annotations

import torch

from .checkpoint import check_compatible, load_cached
from .model import DFlashDraftModel


def block_example(model: DFlashDraftModel):
    """One block forward on a 2-position context: the drafter's linears in call order and its
    sibling groups (q/k/v, gate/up) for :func:`specviz.kernels.tune_linears`."""
    H = model.hidden_size
    with torch.inference_mode():
        ctx = model.context_kv(torch.zeros(1, 2, len(model.target_layer_ids) * H), torch.arange(2))
    x = torch.zeros(1, model.block_size, H)
    return lambda: model.forward_block(x, ctx, 2)


def tune_drafter_linears(model: DFlashDraftModel, target) -> None:
    """Measured oneDNN packed linears (:mod:`specviz.kernels`) for the drafter's layers and its
    draft-vocabulary head, where faster: the block forward runs B rows, the slow case of the
    default kernel on a CPU. Once per loaded model; a float32 CPU drafter only."""
    if getattr(model, "_kernels_tuned", False):
        return
    from ...kernels import tune_linears
    p = next(model.parameters())
    if p.device.type == "cpu" and p.dtype == torch.float32:   # shapes the target timed: reused
        tune_linears(model, target.kernels, example=block_example(model))
        if model.draft_vocab is not None:
            tune_linears(model.sub_head(target.model.get_output_embeddings()), target.kernels)
    model._kernels_tuned = True


def runtime_weights(model: DFlashDraftModel, target, weights: str
                     ) -> tuple[DFlashDraftModel, str]:
    """(the model the drafter runs, "int8" or "float"): the int8 copy where asked for, or with
    ``auto`` where it is measured faster on this machine (:mod:`specviz.drafters.dflash.int8`)."""
    from .int8 import available as int8_available, faster as int8_faster, int8_copy

    if weights == "float" or not int8_available(model):
        return model, "float"
    head = target.model.get_output_embeddings()
    if weights == "int8" or int8_faster(model, head):
        return int8_copy(model, head), "int8"
    return model, "float"


def drafter_model(model: DFlashDraftModel | None, checkpoint, target, device, dtype,
                  weights: str) -> tuple[DFlashDraftModel, str]:
    """(the model the drafter runs, "int8" or "float"): ``model`` moved to ``device`` and
    ``dtype``, else ``checkpoint`` loaded (once per folder and weights); checked against
    ``target``, its linears tuned where the target's were, then :func:`runtime_weights`."""
    if model is None:
        model = load_cached(checkpoint, device, dtype)
    else:
        model = model.to(device=device, dtype=dtype).eval()
    check_compatible(model, target)
    if getattr(target, "kernels", None) is not None:   # the target's linears were tuned:
        tune_drafter_linears(model, target)            # the drafter's too (once per model)
    return runtime_weights(model, target, weights)
