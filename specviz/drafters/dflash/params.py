"""DFlash's settings (docs/methods/dflash.md): one :class:`~..registry.ParamSpec` per keyword of
:class:`~.drafter.DFlashDrafter` -- checked values, labels and help for the CLI (``--param``),
the bench (``--params``) and the app's sidebar. DSpark and ReTrace reuse most of them.
The checks the drafter makes beyond one value's range (its checkpoint, dtype and block size
against the loaded checkpoint) are here too.
"""
from __future__ import annotations

from typing import Any

import torch

from ...errors import SettingsError
from ..registry import ParamSpec, params_by_name
from .checkpoint import MAX_BLOCK_SIZE, bundled_checkpoint

DEFAULT_TREE = 16  # draft tree nodes by default (0: chains; specviz.drafters.dflash.block_tree)
MAX_TREE = 64
PARAMS = params_by_name(
    ParamSpec("checkpoint", str, "", label="Drafter checkpoint",
              help="A DFlash, DFlash2, Domino (or DSpark) drafter folder or hub id (config.json + "
                   "model.safetensors; ID@REVISION pins a hub revision), or the name of one "
                   "bundled with specviz "
                   "(dflash-edr-t1-smollm2-135m-instruct: EDR-fine-tuned for sampling at "
                   "T = 1). Empty = the drafter this project trained for the embedded "
                   "SmolLM2-135M-Instruct."),
    ParamSpec("block_size", int, 0, range=(0, MAX_BLOCK_SIZE), label="Block size",
              help="Slots per block (anchor + masks), at most the checkpoint's; 0 = the "
                   "checkpoint's own. Smaller blocks draft fewer tokens per round."),
    ParamSpec("draft_temperature", float, 0.0, range=(0, 10), label="Draft temperature",
              help="0 = argmax drafts; > 0 samples each slot (still lossless: the target "
                   "verifies with rejection sampling)."),
    ParamSpec("seed", int, 0, range=(0, 2 ** 32 - 1), label="Drafter seed",
              help="Seeds the drafter's own sampler (draft temperature > 0)."),
    ParamSpec("weights", str, "float", choices=("float", "int8", "auto"), label="Drafter weights",
              help="float = the checkpoint's own dtype; int8 = int8 decoder layers and head (a "
                   "float32 drafter on a CPU reads its weights faster; activations are quantized "
                   "per call, so offline replay of such a drafter is not exact); auto = int8 "
                   "where measured faster at load. The target verifies either way: output is "
                   "unchanged."),
    ParamSpec("cut", str, "auto", choices=("auto", "block", "off"), label="Cut the block",
              help="auto = verify only the prefix of the block whose expected accepted tokens "
                   "pay for the longer verify (measured cost model, calibrated confidence), "
                   "and pause the drafter (plain decoding steps, probed now and then) while "
                   "its rounds do not beat plain decoding; block = the cut without the pause; "
                   "off = always draft and verify the whole block (a tree: exactly 'tree' "
                   "nodes)."),
    ParamSpec("state_probe", str, "off", choices=("off", "on", "probes"), label="State probe",
              help="on = with cut auto, skip the drafter's forward in rounds whose predicted "
                   "accepted length (a linear read-out of the target's state, fitted for this "
                   "drafter and stored beside its checkpoint) cannot pay for the forward and "
                   "the smallest verify; probes = only in the paused drafter's probe rounds; "
                   "off = the forward gate alone (measured no faster: docs/methods/dflash.md). "
                   "Drafters without a fitted probe ignore it. Lossless either way."),
    ParamSpec("gate_cost", str, "measured", choices=("measured", "model"), label="Gate cost",
              help="What the forward gate charges a drafted round (cut auto): measured = the "
                   "round's own timed drafting and verify forward over the current one-token "
                   "step (offline replay, which times no forward, falls back to the model); "
                   "model = the verify-cost curve at its node count plus the drafter's "
                   "forward. Lossless either way."),
    ParamSpec("tree", int, DEFAULT_TREE, range=(0, MAX_TREE), label="Draft tree nodes",
              help="0 = draft a chain (each slot's top word). N > 0 = verify the block as a "
                   "token tree of at most N nodes: the slots' top-4 words, most probable paths "
                   "first (product of the slots' probabilities), as many as pay for the wider "
                   "verify (cut auto/block) or exactly N (cut off). Greedy drafts only (draft "
                   "temperature 0) and targets verifying unpadded trees; lossless either way."),
)


def check_settings(tree, checkpoint, draft_temperature, block_size, seed, cut,
                   weights) -> dict[str, Any]:
    """The drafter's keywords checked by their ParamSpecs, in this order (the first bad one
    raises): an empty ``tree`` is the default, a None ``checkpoint`` stays None and an empty
    ``block_size`` is None (the checkpoint's own)."""
    return {"tree": PARAMS["tree"].check(DEFAULT_TREE if tree in (None, "") else tree),
            "checkpoint": None if checkpoint is None else PARAMS["checkpoint"].check(checkpoint),
            "draft_temperature": PARAMS["draft_temperature"].check(draft_temperature),
            "block_size": PARAMS["block_size"].check(None if block_size == "" else block_size),
            "seed": PARAMS["seed"].check(seed), "cut": PARAMS["cut"].check(cut),
            "weights": PARAMS["weights"].check(weights)}


def drafter_checkpoint(checkpoint, target):
    """``checkpoint``, or where it is empty the drafter bundled for ``target``; SettingsError
    when there is neither."""
    if checkpoint is None or not str(checkpoint).strip():
        checkpoint = bundled_checkpoint(target)
    if checkpoint is None:
        raise SettingsError("dflash needs a trained drafter for this target: pass "
                            "checkpoint=PATH_OR_HUB_ID (a folder with config.json + "
                            "model.safetensors, or e.g. z-lab/Qwen3-8B-DFlash-b16); only "
                            "the embedded SmolLM2-135M-Instruct has a bundled drafter")
    return checkpoint


def drafter_dtype(dtype, target) -> torch.dtype:
    """The drafter's dtype: ``dtype`` (a torch dtype or its name), else (None, "" or "auto")
    the target's."""
    if isinstance(dtype, str) and dtype not in ("", "auto"):
        dtype = getattr(torch, dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise SettingsError("unknown dtype for dflash (use float32, bfloat16 or float16)")
    return dtype if isinstance(dtype, torch.dtype) else target.dtype


def check_block_size(block_size: int | None, ckpt_b: int) -> int:
    """The block size to draft: ``block_size``, or (0 / None) the checkpoint's own ``ckpt_b``;
    SettingsError outside 2..ckpt_b."""
    b = block_size or ckpt_b
    if not 2 <= b <= ckpt_b:
        raise SettingsError(f"{PARAMS['block_size'].label} must be 0 (the checkpoint's own) "
                            f"or from 2 to the checkpoint's block size {ckpt_b}, got {b}")
    return b
