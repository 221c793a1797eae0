"""The DFlash checkpoint layouts specviz loads (docs/methods/dflash.md#published-layouts), told
apart from config.json alone.

* ``dflash``: ``architectures: ["DFlashDraftModel"]``; ``block_size`` at the top level (the
  first published layout) or in ``dflash_config``; per layer full or sliding attention, causal
  or not within the block, resolved from ``layer_types``, ``sliding_window``,
  ``dflash_config.{use_swa, swa_window_size, causal}`` and ``is_causal`` exactly as vLLM
  resolves them (:func:`layer_attention`); optional per-head attention sinks
  (``dflash_config.attention_sink_bias`` or MiMo's ``add_swa_attention_sink_bias``).
* ``dflash2``: ``architectures: ["DFlash2DraftModel"]`` (vLLM's signal) or a
  ``dflash_config`` with the DFlash2 keys (SGLang's); grouped block convolutions and the
  candidate selector (:mod:`.dflash2`) on the same layers. Needs ``conv_kernel_size``,
  ``conv_group_size``, ``selector_rank``, ``selector_top_k``.
* ``domino``: ``architectures: ["DominoDraftModel"]`` or ``projector_type`` ``domino`` (or its
  older name ``causal_v5``) in ``dflash_config``: the DFlash backbone plus a GRU correction
  head (:mod:`.domino`). Needs ``gru_hidden_dim`` and ``emb_dim`` (``dflash_config``, or
  ``emb_dim`` at the top level); ``pure_draft_prefix_len`` must be 1 and ``shift_label`` a
  boolean (default true), as SGLang checks them.

Every layout also takes ``dflash_config.attention_value_scale`` (values scaled) and
``is_neox_style: false`` (interleaved RoPE). The top-level ``sliding_window`` and a missing
``layer_types`` are read as transformers' Qwen3Config reads them (:func:`qwen3_view`), as vLLM
and SGLang load the config through it.
"""
from __future__ import annotations

from ...models import ModelLoadError

ARCHITECTURES = {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash2",
                 "DominoDraftModel": "domino"}
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
DOMINO_PROJECTORS = ("domino", "causal_v5")


def layout_of(cfg: dict) -> str:
    """``dflash``, ``dflash2`` or ``domino`` (module docstring); a ModelLoadError naming what
    is missing or unsupported otherwise."""
    arch = [str(a) for a in (cfg.get("architectures") or [])]
    dc = cfg.get("dflash_config") or {}
    if not isinstance(dc, dict):
        raise ModelLoadError("DFlash config: dflash_config must be an object")
    by_arch = {ARCHITECTURES[a] for a in arch if a in ARCHITECTURES}
    by_keys = {"dflash2"} if any(k in dc for k in DFLASH2_KEYS) else set()
    if str(dc.get("projector_type") or cfg.get("projector_type") or "") in DOMINO_PROJECTORS:
        by_keys.add("domino")
    named = by_keys | (by_arch - {"dflash"})
    if len(by_arch) > 1 or len(named) > 1:
        raise ModelLoadError(f"DFlash config names two layouts: {', '.join(sorted(named))} "
                             f"(architectures {arch})")
    layout = next(iter(named)) if named else ("dflash" if by_arch else None)
    if layout is None:
        raise ModelLoadError(f"not a DFlash drafter: architectures {arch} (expected one of "
                             f"{', '.join(ARCHITECTURES)})")
    if layout == "dflash2":
        missing = [k for k in DFLASH2_KEYS if dc.get(k) is None]
        if missing:
            raise ModelLoadError("DFlash2 config misses "
                                 + ", ".join(f"dflash_config.{k}" for k in missing))
    if layout == "domino":
        domino_dims(cfg)
    return layout


def domino_dims(cfg: dict) -> dict:
    """Domino's head settings from its config (gru_hidden_dim, emb_dim, shift_label), checked
    as SGLang checks them; a ModelLoadError names the first problem."""
    dc = cfg.get("dflash_config") or {}
    emb, top = dc.get("emb_dim"), cfg.get("emb_dim")
    if emb is not None and top is not None and int(emb) != int(top):
        raise ModelLoadError(f"Domino config: emb_dim differs (dflash_config {emb}, top level "
                             f"{top})")
    emb = emb if emb is not None else top
    missing = [n for n, v in (("gru_hidden_dim", dc.get("gru_hidden_dim")), ("emb_dim", emb))
               if v is None]
    if missing:
        raise ModelLoadError("Domino config misses " + ", ".join(f"dflash_config.{k}"
                                                                 for k in missing))
    prefix = dc.get("pure_draft_prefix_len", 1)
    if prefix != 1:
        raise ModelLoadError(f"Domino config: pure_draft_prefix_len must be 1 (the first word is "
                             f"the backbone's alone), got {prefix}")
    shift = dc.get("shift_label", True)
    if not isinstance(shift, bool):
        raise ModelLoadError(f"Domino config: shift_label must be true or false, got {shift!r}")
    return {"gru_hidden_dim": int(dc["gru_hidden_dim"]), "emb_dim": int(emb),
            "shift_label": shift}


def qwen3_view(cfg: dict) -> tuple[int | None, list[str] | None]:
    """(sliding_window, layer_types) as transformers' Qwen3Config makes them from config.json --
    what vLLM and SGLang read: the window only with ``use_sliding_window`` (default 4096 then),
    and without ``layer_types``, layers from ``max_window_layers`` (default 28) on slide when
    there is a window."""
    window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window") else None
    types = cfg.get("layer_types")
    if types is None and cfg.get("num_hidden_layers") is not None:
        first = int(cfg.get("max_window_layers", 28))
        types = ["sliding_attention" if window is not None and i >= first else "full_attention"
                 for i in range(int(cfg["num_hidden_layers"]))]
    return window, types


def layer_attention(cfg: dict, i: int) -> tuple[int | None, bool]:
    """(sliding window or None, causal within the block) of drafter layer ``i``, resolved as
    vLLM resolves it (``models/qwen3_dflash.py``) on the config as :func:`qwen3_view` reads it:
    ``dflash_config.use_swa`` makes every layer sliding unless ``layer_types`` already names
    sliding layers; otherwise ``layer_types[i]`` decides; the window is
    ``dflash_config.swa_window_size``, else ``sliding_window``.
    Causality: ``is_causal``, else ``dflash_config.causal``, else a layer is causal exactly when
    its ``layer_types`` entry slides (z-lab's mixed drafters).
    """
    dc = cfg.get("dflash_config") or {}
    top, types = qwen3_view(cfg)
    use_swa = bool(dc.get("use_swa", False))
    any_sliding = bool(types) and any(t == "sliding_attention" for t in types)
    sliding = use_swa if types is None or (use_swa and not any_sliding) \
        else types[i] == "sliding_attention"
    window = None
    if sliding:
        window = dc.get("swa_window_size", top)
        if window is None:
            raise ModelLoadError("DFlash config has sliding layers but no window "
                                 "(dflash_config.swa_window_size, or sliding_window with "
                                 "use_sliding_window: true)")
    if cfg.get("is_causal") is not None:
        causal = bool(cfg["is_causal"])
    elif dc.get("causal") is not None:
        causal = bool(dc["causal"])
    else:
        causal = bool(types) and types[i] == "sliding_attention"
    return (None if window is None else int(window)), causal


def layer_attentions(cfg: dict, n_layers: int) -> list[tuple[int | None, bool]]:
    """:func:`layer_attention` of every layer, ``layer_types`` checked first."""
    types = cfg.get("layer_types")
    if types is not None:
        if len(types) != n_layers:
            raise ModelLoadError(f"DFlash config: layer_types has {len(types)} entries for "
                                 f"{n_layers} layers")
        bad = sorted({str(t) for t in types if t not in ("sliding_attention", "full_attention")})
        if bad:
            raise ModelLoadError(f"DFlash config: unknown layer_types {bad}")
    return [layer_attention(cfg, i) for i in range(n_layers)]


def has_sinks(cfg: dict) -> bool:
    """Whether every layer has a per-head attention sink (``self_attn.attention_sink_bias``):
    ``dflash_config.attention_sink_bias``, else ``add_swa_attention_sink_bias`` (MiMo)."""
    dc = cfg.get("dflash_config") or {}
    return bool(dc.get("attention_sink_bias", cfg.get("add_swa_attention_sink_bias", False)))
