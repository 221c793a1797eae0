"""The DFlash checkpoint layouts specviz loads (docs/methods/dflash.md#published-layouts), told
apart from config.json alone.

* ``dflash``: ``architectures: ["DFlashDraftModel"]``; ``block_size`` at the top level (the
  first published layout) or in ``dflash_config``; full attention, or sliding windows: either
  ``layer_types`` (``sliding_attention`` / ``full_attention`` per layer) with
  ``sliding_window``, or ``use_sliding_window`` + ``sliding_window`` for every layer, or MiMo's
  ``use_swa`` + ``swa_window_size``.
* ``dflash2``: ``architectures: ["DFlash2DraftModel"]`` (vLLM's signal) or a
  ``dflash_config`` with the DFlash2 keys (SGLang's); non-causal, sliding layers, grouped block
  convolutions and the candidate selector (:mod:`.dflash2`). Needs ``conv_kernel_size``,
  ``conv_group_size``, ``selector_rank``, ``selector_top_k``.

What no layout here covers is refused by name: MiMo's attention sinks
(``attention_sink_bias``) and the ``domino`` projector, whose weights specviz cannot run.
"""
from __future__ import annotations

from ...models import ModelLoadError

ARCHITECTURES = {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash2"}
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
LAYOUTS = ("dflash", "dflash2")


def layout_of(cfg: dict) -> str:
    """``dflash`` or ``dflash2`` (module docstring); a ModelLoadError naming what is missing or
    unsupported otherwise."""
    arch = [str(a) for a in (cfg.get("architectures") or [])]
    dc = cfg.get("dflash_config") or {}
    if not isinstance(dc, dict):
        raise ModelLoadError("DFlash config: dflash_config must be an object")
    by_arch = {ARCHITECTURES[a] for a in arch if a in ARCHITECTURES}
    by_keys = {"dflash2"} if any(k in dc for k in DFLASH2_KEYS) else set()
    if len(by_arch) > 1:
        raise ModelLoadError(f"DFlash config names two layouts: architectures {arch}")
    layout = next(iter(by_arch | by_keys), None)
    if layout is None:
        raise ModelLoadError(f"not a DFlash drafter: architectures {arch} (expected one of "
                             f"{', '.join(ARCHITECTURES)})")
    if layout == "dflash2" and by_arch == {"dflash"}:
        layout = "dflash2"   # SGLang reads the keys: a DFlash2 config under the old class name
    if layout == "dflash2":
        missing = [k for k in DFLASH2_KEYS if dc.get(k) is None]
        if missing:
            raise ModelLoadError("DFlash2 config misses "
                                 + ", ".join(f"dflash_config.{k}" for k in missing))
    unsupported = [k for k in ("attention_sink_bias",) if cfg.get(k) or dc.get(k)]
    if str(cfg.get("projector_type") or dc.get("projector_type") or "") == "domino":
        unsupported.append("projector_type 'domino'")
    if unsupported:
        raise ModelLoadError(f"DFlash {layout} variant not supported: {', '.join(unsupported)} "
                             "(supported: " + ", ".join(LAYOUTS) + " with full or sliding "
                             "attention)")
    return layout


def layer_windows(cfg: dict, n_layers: int) -> list[int | None]:
    """The sliding window of each drafter layer (None: full attention)."""
    dc = cfg.get("dflash_config") or {}
    window = cfg.get("sliding_window") or dc.get("sliding_window")
    if cfg.get("use_swa") or dc.get("use_swa"):                 # MiMo's names
        window = cfg.get("swa_window_size") or dc.get("swa_window_size") or window
        if not window:
            raise ModelLoadError("DFlash config sets use_swa without swa_window_size")
        return [int(window)] * n_layers
    types = cfg.get("layer_types") or dc.get("layer_types")
    if types is not None:
        if len(types) != n_layers:
            raise ModelLoadError(f"DFlash config: layer_types has {len(types)} entries for "
                                 f"{n_layers} layers")
        bad = sorted({t for t in types if t not in ("sliding_attention", "full_attention")})
        if bad:
            raise ModelLoadError(f"DFlash config: unknown layer_types {bad}")
        if "sliding_attention" in types and not window:
            raise ModelLoadError("DFlash config has sliding layers but no sliding_window")
        return [int(window) if t == "sliding_attention" else None for t in types]
    if cfg.get("use_sliding_window") and window:
        return [int(window)] * n_layers
    if layout_of(cfg) == "dflash2" and window:                  # DFlash2: every layer slides
        return [int(window)] * n_layers
    return [None] * n_layers
