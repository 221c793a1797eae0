"""DFlash checkpoints (docs/methods/dflash.md): the published layout (``config.json`` +
``model.safetensors``, strict key matching, no ``trust_remote_code``), a drafter sized for a target,
warm start from the target's top layers, the compatibility check, and the drafters bundled with
specviz.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from ...errors import SettingsError
from ...models import ModelLoadError
from .layouts import ARCHITECTURES, layout_of
from .model import DRAFT_VOCAB_KEY, DFlashDraftModel, default_target_layer_ids

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
PROBE_NAME = "state_probe.safetensors"   # the forward gate's state probe (.state_probe), not weights
ARCHITECTURE = "DFlashDraftModel"
MAX_BLOCK_SIZE = 64
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")   # ORG/NAME


# --------------------------------------------------------------------------- checkpoints
def _published_keys(cfg: dict) -> list[str]:
    keys = ["fc.weight", "hidden_norm.weight", "norm.weight"]
    for i in range(int(cfg["num_hidden_layers"])):
        p = f"layers.{i}."
        keys += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        keys += [f"{p}self_attn.{n}_proj.weight" for n in "qkvo"]
        keys += [f"{p}self_attn.{n}_norm.weight" for n in "qk"]
        keys += [f"{p}mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
    return keys


def _few(items, n: int = 4) -> str:
    items = sorted(items)
    return ", ".join(items[:n]) + (f" (+{len(items) - n} more)" if len(items) > n else "")


def resolve_checkpoint(checkpoint: str | Path) -> Path:
    """A local folder, the name of a drafter bundled under ``specviz/weights/`` (e.g.
    ``dflash-edr-t1-smollm2-135m-instruct``), or a hub id fetched with snapshot_download (only
    if the hub is reachable; otherwise from the local HF cache). ``ID@REVISION`` pins a hub
    revision (a branch, tag or commit): published drafters are retrained under the same id."""
    from ...models import hub_reachable

    if checkpoint is None or not str(checkpoint).strip():
        raise SettingsError("dflash needs checkpoint=PATH_OR_HUB_ID (a trained DFlash drafter)")
    path = Path(str(checkpoint)).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"DFlash checkpoint {path} is a file, not a folder")
        return path
    name = str(checkpoint).strip()
    if (BUNDLED_DIR / name / CONFIG_NAME).is_file():   # a drafter committed under weights/
        return BUNDLED_DIR / name
    name, _, revision = name.partition("@")            # a hub id may pin a revision: ID@REV
    if not HUB_ID.fullmatch(name) or (_ and not revision):
        bundled = sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / CONFIG_NAME).is_file())
        raise ModelLoadError(f"DFlash checkpoint '{name}' is neither a local folder, a hub id "
                             f"nor a bundled drafter ({', '.join(bundled)})")
    from huggingface_hub import snapshot_download

    online = hub_reachable()
    try:
        return Path(snapshot_download(name, revision=revision or None,
                                      allow_patterns=["*.json", "*.safetensors"],
                                      local_files_only=not online))
    except Exception as exc:  # noqa: BLE001 - one clear line for the user
        where = "download failed" if online else "not in the local cache and the hub is unreachable"
        rev = f" at revision {revision}" if revision else ""
        raise ModelLoadError(f"cannot fetch DFlash checkpoint '{name}'{rev}: {where}") from exc


def load_dflash_checkpoint(checkpoint: str | Path, device: str | torch.device = "cpu",
                           dtype: torch.dtype | None = None) -> DFlashDraftModel:
    """Load a DFlash drafter (config.json + *.safetensors) with strict key/shape matching."""
    folder = resolve_checkpoint(checkpoint)
    cfg = _read_config(folder)
    _check_config(cfg, folder)
    state = _read_weights(folder)
    model = _model_from_config(cfg)
    dv = _pop_draft_vocab(state, cfg, folder)
    if dv is not None and model.layout != "dflash":
        raise ModelLoadError(f"DFlash checkpoint {folder.name}: a draft vocabulary goes with the "
                             f"plain DFlash layout only, not {model.layout}")
    _check_layout(model.state_dict(), state, folder)
    model.load_state_dict(state, strict=True)
    model.draft_vocab = dv
    model.eval().requires_grad_(False)
    return model.to(device=device, dtype=dtype or next(iter(state.values())).dtype)


def _read_config(folder: Path) -> dict:
    """The checkpoint's config.json, a JSON object (ModelLoadError otherwise)."""
    cfg_path = folder / CONFIG_NAME
    if not cfg_path.is_file():
        raise ModelLoadError(f"DFlash checkpoint {folder} has no {CONFIG_NAME}")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"DFlash {cfg_path} is not valid JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"DFlash {cfg_path} is not a JSON object")
    return cfg


def _check_config(cfg: dict, folder: Path) -> None:
    """A DFlash drafter's config: a layout specviz runs (:mod:`.layouts`), the sizes it needs."""
    try:
        layout_of(cfg)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{folder}: {exc}") from None
    missing_cfg = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                               "intermediate_size", "dflash_config") if k not in cfg]
    if missing_cfg:
        raise ModelLoadError(f"DFlash config misses {', '.join(missing_cfg)}")


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """All the folder's *.safetensors (but the gate's state probe) in one state dict."""
    from safetensors.torch import load_file

    files = sorted(f for f in folder.glob("*.safetensors")   # not the gate's state probe
                   if f.name != PROBE_NAME)
    if not files:
        raise ModelLoadError(f"DFlash checkpoint {folder} has no {WEIGHTS_NAME}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"cannot read DFlash weights {f.name}: {exc}") from exc
    return state


def _model_from_config(cfg: dict) -> DFlashDraftModel:
    """The (uninitialised) drafter the config describes; a bad config is a ModelLoadError."""
    try:
        return DFlashDraftModel(cfg)
    except ModelLoadError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"bad DFlash config: {exc}") from exc


def _pop_draft_vocab(state: dict[str, torch.Tensor], cfg: dict,
                     folder: Path) -> torch.Tensor | None:
    """Take the optional draft vocabulary out of ``state``: sorted distinct word ids inside
    the vocabulary (int64), or None where the checkpoint has none."""
    dv = state.pop(DRAFT_VOCAB_KEY, None)
    if dv is not None:
        vocab = int(cfg.get("vocab_size") or 0)
        ok = dv.dim() == 1 and dv.numel() > 0 and not dv.is_floating_point()
        if ok:
            dv = dv.long()
            ok = bool((dv[1:] > dv[:-1]).all()) and int(dv[0]) >= 0 and (
                not vocab or int(dv[-1]) < vocab)
        if not ok:
            raise ModelLoadError(f"DFlash checkpoint {folder.name}: {DRAFT_VOCAB_KEY} must be "
                                 "sorted distinct word ids inside the vocabulary")
    return dv


def _check_layout(want: dict[str, torch.Tensor], state: dict[str, torch.Tensor],
                  folder: Path) -> None:
    """Strict matching: the weights' keys are the model's (``want``), their shapes too."""
    unexpected = set(state) - set(want)
    missing = set(want) - set(state)
    if unexpected or missing:
        parts = []
        if unexpected:
            parts.append(f"unexpected weight keys: {_few(unexpected)}")
        if missing:
            parts.append(f"missing weight keys: {_few(missing)}")
        raise ModelLoadError(f"DFlash checkpoint {folder.name} does not match the "
                             f"DFlashDraftModel layout; " + "; ".join(parts))
    bad = [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in want.items()
           if tuple(state[k].shape) != tuple(v.shape)]
    if bad:
        raise ModelLoadError(f"DFlash weight shapes do not match its config: {_few(bad, 3)}")


_LOADED: dict[tuple, DFlashDraftModel] = {}
_LOADED_MAX = 2


def load_cached(checkpoint, device, dtype) -> DFlashDraftModel:
    """Load once per (folder, weights mtime, device, dtype): the bench and the app build a new
    drafter per prompt/session, and the weights are read-only at inference time."""
    folder = resolve_checkpoint(checkpoint)
    stamp = tuple(sorted((f.name, f.stat().st_mtime_ns) for f in folder.glob("*.safetensors")))
    cfg = folder / CONFIG_NAME
    key = (str(folder.resolve()), stamp, cfg.stat().st_mtime_ns if cfg.is_file() else None,
           str(device), str(dtype))
    if key not in _LOADED:
        model = load_dflash_checkpoint(folder, device=device, dtype=dtype)
        while len(_LOADED) >= _LOADED_MAX:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = model
    return _LOADED[key]


def save_dflash_checkpoint(model: DFlashDraftModel, folder: str | Path) -> Path:
    """Write config.json + model.safetensors in the published DFlash layout."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = dict(model.config)
    cfg["architectures"] = [next(a for a, lay in ARCHITECTURES.items() if lay == model.layout)]
    cfg["model_type"] = "qwen3"
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if state:
        cfg["dtype"] = str(next(iter(state.values())).dtype).replace("torch.", "")
    dc = dict(cfg.get("dflash_config") or {})
    dc.pop("draft_vocab_size", None)
    if model.draft_vocab is not None:
        state[DRAFT_VOCAB_KEY] = model.draft_vocab.detach().to("cpu", torch.int64).contiguous()
        dc["draft_vocab_size"] = int(model.draft_vocab.numel())
    cfg["dflash_config"] = dc
    (folder / CONFIG_NAME).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    return folder


def _target_dims(target) -> dict[str, Any]:
    tc = target.model.config
    tc = getattr(tc, "text_config", None) or tc
    H = int(tc.hidden_size)
    heads = int(tc.num_attention_heads)
    return {"hidden_size": H, "num_layers": int(tc.num_hidden_layers),
            "vocab": int(target.model.get_input_embeddings().num_embeddings),
            "heads": heads, "kv_heads": int(getattr(tc, "num_key_value_heads", None) or heads),
            "head_dim": int(getattr(tc, "head_dim", None) or H // heads),
            "intermediate_size": int(getattr(tc, "intermediate_size", None) or 4 * H),
            "rms_norm_eps": float(getattr(tc, "rms_norm_eps", 1e-6) or 1e-6),
            "rope_parameters": dict(getattr(tc, "rope_parameters", None) or {"rope_type": "default",
                                                                            "rope_theta": 10000.0}),
            "max_position_embeddings": int(getattr(tc, "max_position_embeddings", 2048) or 2048)}


def new_dflash_for_target(target, num_layers: int = 1, block_size: int = 8,
                          target_layer_ids: list[int] | None = None, num_target_features: int | None = None,
                          mask_token_id: int | None = None, intermediate_size: int | None = None,
                          seed: int = 0) -> DFlashDraftModel:
    """A randomly initialised DFlash drafter sized for ``target`` (tests now, training later).
    Without ``mask_token_id`` the drafter gets a learned ``mask_embedding`` (no spare row)."""
    d = _target_dims(target)
    if not 2 <= int(block_size) <= MAX_BLOCK_SIZE:
        raise SettingsError(f"block_size must be between 2 and {MAX_BLOCK_SIZE}")
    if target_layer_ids is None:
        target_layer_ids = default_target_layer_ids(
            d["num_layers"], num_target_features or min(5, d["num_layers"]))
    rope = d["rope_parameters"]
    cfg = {
        "architectures": [ARCHITECTURE], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "block_size": int(block_size),
        "dflash_config": {"mask_token_id": mask_token_id,
                          "target_layer_ids": [int(i) for i in target_layer_ids]},
        "head_dim": d["head_dim"], "hidden_act": "silu", "hidden_size": d["hidden_size"],
        "initializer_range": 0.02, "intermediate_size": int(intermediate_size or d["intermediate_size"]),
        "max_position_embeddings": d["max_position_embeddings"],
        "num_attention_heads": d["heads"], "num_hidden_layers": int(num_layers),
        "num_key_value_heads": d["kv_heads"], "num_target_layers": d["num_layers"],
        "rms_norm_eps": d["rms_norm_eps"], "rope_theta": float(rope.get("rope_theta", 10000.0)),
        "rope_parameters": rope, "tie_word_embeddings": False, "use_sliding_window": False,
        "sliding_window": None, "vocab_size": d["vocab"],
    }
    if mask_token_id is None:
        cfg["dflash_config"]["learned_mask_embedding"] = True
    model = DFlashDraftModel(cfg)
    model.init_weights(generator=torch.Generator().manual_seed(int(seed)))
    check_compatible(model, target)
    return model.to(device=target.device, dtype=target.dtype).eval()


@torch.no_grad()
def init_from_target(model: DFlashDraftModel, target) -> DFlashDraftModel:
    """Start a new drafter from the target's own top layers: drafter layer i copies target layer
    L - n + i (attention, MLP, norms -- Llama/Qwen names; shapes must match), the final norm is
    the target's, and ``fc`` passes the LAST tapped layer's features through unchanged (the
    context then looks like what those target layers read). A warm start for training."""
    src_layers = target.model.model.layers
    n, L = len(model.layers), len(src_layers)
    if n > L:
        raise SettingsError(f"cannot initialise {n} drafter layers from a {L}-layer target")
    for i, layer in enumerate(model.layers):
        src = dict(src_layers[L - n + i].named_parameters())
        for name, p in layer.named_parameters():
            if name in src and tuple(src[name].shape) == tuple(p.shape):
                p.copy_(src[name].to(p.dtype))
    tgt_norm = getattr(target.model.model, "norm", None)
    if tgt_norm is not None and tuple(tgt_norm.weight.shape) == tuple(model.norm.weight.shape):
        model.norm.weight.copy_(tgt_norm.weight.to(model.norm.weight.dtype))
    H = model.hidden_size
    k = len(model.target_layer_ids)
    model.fc.weight.zero_()
    model.fc.weight[:, (k - 1) * H:] = torch.eye(H, dtype=model.fc.weight.dtype)
    ln = dict(src_layers[L - n].named_parameters()).get("input_layernorm.weight")
    if ln is not None and tuple(ln.shape) == tuple(model.hidden_norm.weight.shape):
        model.hidden_norm.weight.copy_(ln.to(model.hidden_norm.weight.dtype))
    return model


def check_compatible(model: DFlashDraftModel, target) -> None:
    """Raise ModelLoadError naming the first mismatch between a drafter and a target."""
    d = _target_dims(target)
    if model.hidden_size != d["hidden_size"]:
        raise ModelLoadError(f"DFlash hidden size {model.hidden_size} != target hidden size "
                             f"{d['hidden_size']}: the drafter was trained for another target")
    vocab = model.config.get("vocab_size")
    if vocab is not None and int(vocab) != d["vocab"]:
        raise ModelLoadError(f"DFlash vocab size {vocab} != target vocab size {d['vocab']}")
    if not model.learned_mask and not 0 <= model.mask_token_id < d["vocab"]:
        raise ModelLoadError(f"DFlash mask_token_id {model.mask_token_id} is outside the target's "
                             f"vocab (0..{d['vocab'] - 1})")
    if model.draft_vocab is not None and int(model.draft_vocab.max()) >= d["vocab"]:
        raise ModelLoadError(f"DFlash draft vocabulary has ids beyond the target's vocab "
                             f"(0..{d['vocab'] - 1})")
    bad = [i for i in model.target_layer_ids if not 0 <= i < d["num_layers"]]
    if bad:
        raise ModelLoadError(f"DFlash target_layer_ids {bad} are out of range for a target with "
                             f"{d['num_layers']} layers")
    ntl = model.config.get("num_target_layers")
    if ntl is not None and int(ntl) != d["num_layers"]:
        raise ModelLoadError(f"DFlash num_target_layers {ntl} != target layers {d['num_layers']}")


# --------------------------------------------------------------------------- bundled drafters
BUNDLED_DIR = Path(__file__).resolve().parents[2] / "weights"   # specviz/weights
BUNDLED = {"SmolLM2-135M-Instruct": "dflash-smollm2-135m-instruct"}


def bundled_checkpoint(target, table: dict[str, str] | None = None) -> Path | None:
    """The drafter trained by this project for ``target`` (by model name), committed under
    ``specviz/weights/``; None when there is none. ``table``: model name -> folder (default:
    the DFlash drafters; ReTrace passes its own)."""
    name = str(getattr(target, "name", "") or "")
    for model_name, folder in (BUNDLED if table is None else table).items():
        if name == model_name or name.startswith(model_name + " ") \
                or name.rstrip("/").endswith("/" + model_name):
            path = BUNDLED_DIR / folder
            if (path / CONFIG_NAME).is_file():
                return path
    return None
