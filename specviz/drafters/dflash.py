"""DFlash: a block-diffusion drafter conditioned on the target's hidden states (METHODS §1).

The drafter is a few Qwen3-style decoder layers that see the TARGET's hidden states as context
and denoise one block [last committed token, MASK x (B-1)] in a single forward; slot i >= 1
predicts the token at its own position (no shift) and the draft is the argmax of slots 1..B-1.
Embedding and LM head are the target's (frozen, never stored in the drafter checkpoint).

Architecture (checkpoint-compatible with the released z-lab ``DFlashDraftModel`` checkpoints,
e.g. ``z-lab/Qwen3-8B-DFlash-b16``; loaded WITHOUT ``trust_remote_code``, strict key matching):

* context features: the hidden states of k target layers (HF ``output_hidden_states`` index =
  layer id + 1) concatenated on the feature dim -> ``fc`` (k*H -> H, no bias) -> ``hidden_norm``.
* every layer: K, V = [k_proj/v_proj(context); k_proj/v_proj(block)], Q from the block only;
  ``q_norm`` / ``k_norm`` per head (as Qwen3) on queries and on BOTH context and block keys;
  RoPE at absolute positions (context 0..n-1, block n..n+B-1); no mask at all (bidirectional
  inside the block, full attention to the context); GQA.
  Design choice, following the public reference: the context features (after fc + hidden_norm)
  go to k_proj / v_proj DIRECTLY -- they are not passed through the layer's input_layernorm, and
  every layer projects the same features (so per-layer context K/V can be cached exactly).
* decoder layer: x += attn(input_layernorm(x), ctx); x += mlp(post_attention_layernorm(x));
  then the final ``norm`` and the target's LM head.
* weights: ``fc.weight``, ``hidden_norm.weight``, ``norm.weight``,
  ``layers.{i}.{input_layernorm,post_attention_layernorm}.weight``,
  ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``, ``layers.{i}.self_attn.{q,k}_norm.weight``,
  ``layers.{i}.mlp.{gate,up,down}_proj.weight``; plus, only for targets without a spare
  embedding row, ``mask_embedding`` [H] (config ``dflash_config.learned_mask_embedding: true``).
  Sliding-window layers (``use_sliding_window``) are not supported and rejected at load time.
* optional (specviz-trained drafters): ``draft_vocab`` int64 [Vd] in model.safetensors and
  ``dflash_config.draft_vocab_size`` -- the sorted target word ids the drafter may propose (the
  words of its training replies). Only those rows of the LM head are computed (FR-Spec-style;
  on a CPU the 49k-word head costs more than two drafter layers); published checkpoints have no
  such key and score the full vocabulary.

Bundled drafter: ``specviz/weights/dflash-smollm2-135m-instruct`` was trained by
``python -m specviz train rollouts`` + ``train dflash`` (README) for the embedded target; it is
used when ``checkpoint`` is left empty and the target is SmolLM2-135M-Instruct.

Runtime (:class:`DFlashDrafter`): the drafter keeps a per-layer cache of the context K/V,
one row per committed position except the last committed token (which is the block's slot 0):
the prefill hidden states fill it in ``begin``; ``observe`` appends only the newly committed rows
of the verify forward (``feedback.kept_rows``), so no extra target forward is ever run.

Sampling: by default the draft is the argmax of each slot and ``Draft.q`` is None, i.e. the
verifier treats it as a point mass (accept x with prob p(x)) -- lossless for greedy and sampled
verification alike; ``q_token`` then carries the drafter's softmax prob for display only. With
``draft_temperature > 0`` the drafter instead SAMPLES each slot from softmax(logits / T_d) with
its own seeded generator and returns those distributions as ``q`` (Leviathan acceptance
min(1, p/q)); this is lossless too because slot distributions depend only on the committed
prefix, never on the other draft tokens.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import SettingsError
from ..costs import cost_curve
from ..models import ModelLoadError
from .base import Draft, DraftContext, Drafter, VerifyFeedback
from .block_cut import BlockCut
from .context import ContextCache, tapped_features
from .registry import MethodSpec, ParamSpec, params_by_name

CONFIG_NAME = "config.json"
DRAFT_VOCAB_KEY = "draft_vocab"
WEIGHTS_NAME = "model.safetensors"
ARCHITECTURE = "DFlashDraftModel"
MAX_BLOCK_SIZE = 64
TOPK = 4  # drafter top-k ids/probs recorded per slot (rejected-suffix alignment)
PARAMS = params_by_name(
    ParamSpec("checkpoint", str, "", label="Drafter checkpoint",
              help="A DFlash (or DSpark) drafter folder or hub id (config.json + "
                   "model.safetensors), or the name of one bundled with specviz "
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
    ParamSpec("cut", str, "auto", choices=("auto", "off"), label="Cut the block",
              help="auto = verify only the prefix of the block whose expected accepted tokens "
                   "pay for the longer verify (measured cost model, calibrated confidence); "
                   "off = always verify the whole block."),
)


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


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [1, heads, T, D]; cos/sin [1, T, D]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + _rotate_half(x) * sin


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
    def __init__(self, cfg: dict):
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

    def kv(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (k_norm + RoPE) and values [1, kv_heads, T, D] of x [1, T, H]."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        return _rope(k, cos, sin), v

    def forward(self, x, ctx_k, ctx_v, cos, sin) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.n_heads, self.head_dim)).transpose(1, 2)
        q = _rope(q, cos, sin)
        k, v = self.kv(x, cos, sin)
        k = torch.cat([ctx_k, k], dim=2)
        v = torch.cat([ctx_v, v], dim=2)
        rep = self.n_heads // self.n_kv
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=False,
                                             scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


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
    def __init__(self, cfg: dict):
        super().__init__()
        H, eps = int(cfg["hidden_size"]), float(cfg.get("rms_norm_eps", 1e-6))
        self.self_attn = DFlashAttention(cfg)
        self.mlp = DFlashMLP(cfg)
        self.input_layernorm = _rms_norm(H, eps)
        self.post_attention_layernorm = _rms_norm(H, eps)

    def forward(self, x, ctx_k, ctx_v, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), ctx_k, ctx_v, cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


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
        self.layers = nn.ModuleList(DFlashDecoderLayer(cfg) for _ in range(int(cfg["num_hidden_layers"])))
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
        # Optional Markov head (DSpark, :mod:`specviz.drafters.dspark`): a low-rank logit bias
        # from the previous token, W2 W1[x_{k-1}], over the draft vocabulary (or every word).
        self.markov_rank = int(dc.get("markov_rank") or 0)
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
        x = block_emb
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
        if self.draft_vocab is None:
            sub = head(h)
        else:
            dv = self.draft_vocab.to(head.weight.device)
            cached = getattr(self, "_sub_head", None)
            if cached is None or cached[0] is not head.weight or cached[1].device != dv.device \
                    or cached[2] != head.weight.dtype or cached[1].numel() != dv.numel():
                cached = (head.weight, dv, head.weight.dtype, head.weight.detach()[dv].contiguous())
                self._sub_head = cached
            sub = F.linear(h, cached[3])
        bias = None if prev is None else self.markov_bias(prev)
        return sub if bias is None else sub + bias.to(sub.dtype)

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
    if the hub is reachable; otherwise from the local HF cache)."""
    from ..models import hub_reachable

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
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", name):
        bundled = sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / CONFIG_NAME).is_file())
        raise ModelLoadError(f"DFlash checkpoint '{name}' is neither a local folder, a hub id "
                             f"nor a bundled drafter ({', '.join(bundled)})")
    from huggingface_hub import snapshot_download

    online = hub_reachable()
    try:
        return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors"],
                                      local_files_only=not online))
    except Exception as exc:  # noqa: BLE001 - one clear line for the user
        where = "download failed" if online else "not in the local cache and the hub is unreachable"
        raise ModelLoadError(f"cannot fetch DFlash checkpoint '{name}': {where}") from exc


def load_dflash_checkpoint(checkpoint: str | Path, device: str | torch.device = "cpu",
                           dtype: torch.dtype | None = None) -> DFlashDraftModel:
    """Load a DFlash drafter (config.json + *.safetensors) with strict key/shape matching."""
    from safetensors.torch import load_file

    folder = resolve_checkpoint(checkpoint)
    cfg_path = folder / CONFIG_NAME
    if not cfg_path.is_file():
        raise ModelLoadError(f"DFlash checkpoint {folder} has no {CONFIG_NAME}")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"DFlash {cfg_path} is not valid JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"DFlash {cfg_path} is not a JSON object")
    arch = cfg.get("architectures") or []
    if ARCHITECTURE not in arch:
        raise ModelLoadError(f"{folder} is not a DFlash drafter: architectures {arch} "
                             f"(expected ['{ARCHITECTURE}'])")
    missing_cfg = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                               "intermediate_size", "dflash_config") if k not in cfg]
    if missing_cfg:
        raise ModelLoadError(f"DFlash config misses {', '.join(missing_cfg)}")
    if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        raise ModelLoadError("sliding-window DFlash drafters are not supported")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"DFlash checkpoint {folder} has no {WEIGHTS_NAME}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"cannot read DFlash weights {f.name}: {exc}") from exc
    try:
        model = DFlashDraftModel(cfg)
    except ModelLoadError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"bad DFlash config: {exc}") from exc
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
    want = model.state_dict()
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
    model.load_state_dict(state, strict=True)
    model.draft_vocab = dv
    model.eval().requires_grad_(False)
    return model.to(device=device, dtype=dtype or next(iter(state.values())).dtype)


_LOADED: dict[tuple, DFlashDraftModel] = {}
_LOADED_MAX = 2


def _load_cached(checkpoint, device, dtype) -> DFlashDraftModel:
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
    cfg["architectures"] = [ARCHITECTURE]
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
    _check_compatible(model, target)
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


def _check_compatible(model: DFlashDraftModel, target) -> None:
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
BUNDLED_DIR = Path(__file__).resolve().parent.parent / "weights"
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


# --------------------------------------------------------------------------- the drafter
class DFlashDrafter(Drafter):
    """DFlash behind the engine's Drafter interface (see the module docstring)."""

    name = "dflash"

    def __init__(self, target=None, checkpoint: str | Path | None = None,
                 model: DFlashDraftModel | None = None, block_size: int | None = None,
                 draft_temperature: float = 0.0, seed: int = 0, dtype: str | torch.dtype | None = None,
                 device: str | None = None, cut: str = "auto"):
        if target is None:
            raise SettingsError("dflash needs the target model (make_drafter('dflash', target, ...))")
        if checkpoint is not None:
            checkpoint = PARAMS["checkpoint"].check(checkpoint)
        draft_temperature = PARAMS["draft_temperature"].check(draft_temperature)
        block_size = PARAMS["block_size"].check(None if block_size == "" else block_size)
        seed = PARAMS["seed"].check(seed)
        self.cut_mode = PARAMS["cut"].check(cut)
        self.cut: BlockCut | None = None
        self._last_cut: tuple[list[float], int] | None = None
        if model is None:
            if checkpoint is None or not str(checkpoint).strip():
                checkpoint = bundled_checkpoint(target)
            if checkpoint is None:
                raise SettingsError("dflash needs a trained drafter for this target: pass "
                                    "checkpoint=PATH_OR_HUB_ID (a folder with config.json + "
                                    "model.safetensors, or e.g. z-lab/Qwen3-8B-DFlash-b16); only "
                                    "the embedded SmolLM2-135M-Instruct has a bundled drafter")
        dev = device or target.device
        if isinstance(dtype, str) and dtype not in ("", "auto"):
            dtype = getattr(torch, dtype, None)
            if not isinstance(dtype, torch.dtype):
                raise SettingsError("unknown dtype for dflash (use float32, bfloat16 or float16)")
        dt = dtype if isinstance(dtype, torch.dtype) else target.dtype
        if model is None:
            model = _load_cached(checkpoint, dev, dt)
        else:
            model = model.to(device=dev, dtype=dt).eval()
        _check_compatible(model, target)
        ckpt_b = int(model.block_size)
        b = block_size or ckpt_b
        if not 2 <= b <= ckpt_b:
            raise SettingsError(f"{PARAMS['block_size'].label} must be 0 (the checkpoint's own) "
                                f"or from 2 to the checkpoint's block size {ckpt_b}, got {b}")
        self.target = target
        self.model = model
        self.checkpoint = None if checkpoint is None else str(checkpoint)
        self.block_size = b
        self.draft_temperature = draft_temperature
        self.seed = seed
        self.device = torch.device(dev)
        self.dtype = dt
        self.hidden_state_layers = [i + 1 for i in model.target_layer_ids]
        self._ctx = ContextCache(seq_dim=2)
        self.generator = torch.Generator().manual_seed(self.seed)

    # -- context cache (specviz.drafters.context): every drafter layer's context K/V
    @property
    def context_len(self) -> int:
        return len(self._ctx)

    def _reset(self) -> None:
        self._ctx.reset()
        self.generator = torch.Generator().manual_seed(self.seed)

    def _append(self, hidden_states, rows: list[int] | None, start_pos: int) -> None:
        """Append the context K/V of ``rows`` of a target forward's hidden states, the first
        at absolute position ``start_pos`` (rows are consecutive committed positions)."""
        feats = tapped_features(hidden_states, self.hidden_state_layers, rows)
        if feats.shape[1] == 0:
            return
        feats = feats.to(device=self.device, dtype=self.dtype)
        pos = torch.arange(start_pos, start_pos + feats.shape[1])
        with torch.inference_mode():
            new = self.model.context_kv(feats, pos)
        self._ctx.append([t for kv in new for t in kv])

    def _context_kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        t = self._ctx.tensors
        return [(t[2 * i], t[2 * i + 1]) for i in range(len(t) // 2)] or self._empty_kv()

    # -- Drafter interface
    def begin(self, target, prompt_ids, prefill_hidden=None):
        if target is not self.target:
            _check_compatible(self.model, target)
            self.target = target
        self._reset()
        if self.cut_mode == "auto":  # the verify-cost model of this machine, learned afresh
            self.cut = BlockCut(cost_curve("auto", target))
        if len(prompt_ids) > 1:
            self._append(prefill_hidden, None, 0)

    def block_input(self, tokens: list[int]) -> torch.Tensor:
        """The block's input embeddings [1, B, H]: the last committed token, then B-1 masks
        (a subclass may add to them -- ReTrace's fused rejected-suffix memory)."""
        B = self.block_size
        emb = self.target.model.get_input_embeddings()
        m = self.model
        mask_id = m.mask_token_id if not m.learned_mask else tokens[-1]
        ids = torch.tensor([[tokens[-1]] + [mask_id] * (B - 1)], device=emb.weight.device)
        x = emb(ids).to(device=self.device, dtype=self.dtype)
        if m.learned_mask:
            x = torch.cat([x[:, :1], m.mask_embedding.view(1, 1, -1).expand(1, B - 1, -1)], 1)
        return x

    def block_logits(self, tokens: list[int]) -> torch.Tensor:
        """Drafter logits [B-1, V] (float32) of slots 1..B-1 for the committed ``tokens``; the
        slots' final hidden states stay in ``self.last_hidden`` [B-1, H] until the next block."""
        with self.target.lock, torch.inference_mode():
            h = self.block_hidden(tokens)
            logits = self.model.slot_logits(h, self.target.model.get_output_embeddings())
        return logits.float()

    def block_hidden(self, tokens: list[int]) -> torch.Tensor:
        """Final hidden states [B-1, H] of slots 1..B-1 for the committed ``tokens`` (one
        drafter forward; kept in ``self.last_hidden``). Call under the target's lock."""
        x = self.block_input(tokens)
        h = self.model.forward_block(x, self._context_kv(), len(tokens) - 1)[0, 1:]
        self.last_hidden = h
        return h

    def draft_logits(self, tokens: list[int], k: int) -> tuple[torch.Tensor, list[int] | None]:
        """(logits [k, V] of slots 1..k on the CPU, the drafted tokens when the drafter chose
        them itself -- left to right, as DSpark does -- else None: argmax / sampling follow)."""
        return self.block_logits(tokens)[:k].cpu(), None

    def _empty_kv(self):
        a = self.model.layers[0].self_attn
        z = torch.zeros(1, a.n_kv, 0, a.head_dim, device=self.device, dtype=self.dtype)
        return [(z, z) for _ in self.model.layers]

    def propose(self, ctx: DraftContext) -> Draft:
        n = len(ctx.tokens)
        self._ctx.crop(n - 1)
        if self.context_len != n - 1:
            raise RuntimeError(f"dflash context cache holds {self.context_len} positions but "
                               f"{n - 1} are committed (was observe() skipped?)")
        k = max(0, min(self.block_size - 1, int(ctx.max_draft)))
        extras = {"block_size": self.block_size, "confidence": []}
        if k == 0:
            return Draft(extras=extras)
        logits, chain = self.draft_logits(list(ctx.tokens), k)
        probs = torch.softmax(logits, dim=-1)
        conf, top = probs.max(-1)
        if chain is not None:   # drafted left to right (DSpark): the slots' own tokens
            top = torch.tensor(chain[:len(top)])
            conf = probs.gather(-1, top.unsqueeze(-1)).squeeze(-1)
        if self.cut is not None:  # verify only the prefix that pays for itself (BlockCut)
            block_conf = [float(c) for c in conf]
            kept, value = self.cut.choose(block_conf)
            self._last_cut = (block_conf, kept)
            extras["cut"] = {"kept": kept, "block": k,
                             "block_confidence": [round(c, 3) for c in block_conf],
                             "value": [round(v, 3) for v in value]}
            logits, conf, top = logits[:kept], conf[:kept], top[:kept]
            if kept == 0:
                return Draft(extras=extras)
        extras["confidence"] = [round(float(c), 6) for c in conf]
        tk_p, tk_i = probs[:len(conf)].topk(min(TOPK, probs.shape[-1]), dim=-1)
        extras["topk"] = tk_i.tolist()  # the drafter's top-k per slot (alignment analysis)
        extras["topk_p"] = [[round(float(x), 3) for x in row] for row in tk_p]
        if self.draft_temperature > 0:
            q = torch.softmax(logits / self.draft_temperature, dim=-1)
            tokens = top if chain is not None else \
                torch.multinomial(q, 1, generator=self.generator).squeeze(-1)
            q_token = q.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
            return Draft(tokens=[int(t) for t in tokens], q=q,
                         q_token=[round(float(x), 6) for x in q_token], extras=extras)
        return Draft(tokens=[int(t) for t in top], q=None,
                     q_token=[round(float(c), 6) for c in conf], extras=extras)

    def observe(self, feedback: VerifyFeedback) -> None:
        rnd = feedback.round
        rows = list(feedback.kept_rows if feedback.kept_rows is not None else [0])
        rows = rows[:len(rnd.committed)]  # an EOS / budget cut commits fewer tokens
        start = int(rnd.start) - 1        # position of the verify input's row 0
        self._ctx.crop(start)
        self._append(feedback.hidden_states, rows, start)
        if self.cut is not None and self._last_cut is not None:
            block_conf, kept = self._last_cut
            self.cut.observe(block_conf, kept, int(rnd.accepted), float(rnd.t_draft))
        self._last_cut = None

    def config(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "block_size": self.block_size,
                "checkpoint_block_size": int(self.model.block_size),
                "target_layer_ids": list(self.model.target_layer_ids),
                "num_layers": len(self.model.layers), "draft_temperature": self.draft_temperature,
                "mask": "learned" if self.model.learned_mask else int(self.model.mask_token_id),
                "draft_vocab_size": None if self.model.draft_vocab is None
                else int(self.model.draft_vocab.numel()), "cut": self.cut_mode}


SPECS = (MethodSpec("dflash", DFlashDrafter, "DFlash", "DFlash: block-diffusion drafter on the "
                    "target's hidden states (bundled for the embedded model)", kind="learned",
                    needs_target=True, params=tuple(PARAMS.values())),)
