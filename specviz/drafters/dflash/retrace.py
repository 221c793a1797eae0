"""ReTrace: rejected-trajectory conditioning on a DFlash backbone (docs/methods/retrace.md).

Round r drafts a block at anchor position n_r - 1 (slot s predicts absolute position
n_r - 1 + s); the target accepts m slots, slot m+1 is the first mismatch (the target's own token
there becomes round r+1's anchor) and slots m+2..k are the *rejected suffix*. ReTrace keeps, for
each rejected slot s, a memory record at its absolute position P = n_r - 1 + s:

* ``h``: the drafter's final hidden state of slot s (already computed for round r's draft);
* ``c``: the target's own token at P on the verify pass (``Round.target_argmax[s-1]``: the
  target's argmax at P given the drafted prefix), embedded with the target's frozen embedding;
* ``agree``: whether the drafted token at P equalled that target token.

Round r+1's block starts at n_{r+1} - 1 = n_r + m; the record for P lands on slot
j = P - (n_{r+1} - 1) = s - m - 1 >= 1 (the anchor slot is never touched), and slots without a
partner get nothing. Fusion is a gated residual into the block's INPUT embeddings:

    e_j = e_mask + g_j * W [norm([h ; c]) ; agree],    g_j = sigmoid(w_g . [norm([h ; c]) ; agree] + b_g)

``W`` starts at zero, so an untrained ReTrace drafts exactly what its backbone drafts; the gate
g_j (one scalar per slot, shown on the ReTrace page) starts near ``sigmoid(b_g)``. The memory is
detached, lives one round, and is built from tensors the round already computed: no extra target
or drafter forward. Verification is unchanged, so ReTrace is lossless like every drafter here.

Checkpoint folder: ``config.json`` (``architectures: ["ReTraceFusion"]``, the backbone it was
trained on -- ``"bundled"``, a path, or ``"included"`` when it was fine-tuned jointly and
saved in the sub-folder ``backbone/`` -- and the backbone's ``hidden_size`` / ``block_size`` /
``target_layer_ids``, checked against the loaded backbone) + ``model.safetensors`` (the fusion
weights only: a frozen backbone is referenced, not copied).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import SettingsError
from ...models import ModelLoadError
from ..base import Draft, DraftContext, VerifyFeedback
from ..registry import MethodSpec, ParamSpec, params_by_name
from .checkpoint import bundled_checkpoint
from .drafter import DFlashDrafter
from .params import PARAMS as DFLASH_PARAMS

ARCHITECTURE = "ReTraceFusion"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
BUNDLED = {"SmolLM2-135M-Instruct": "retrace-smollm2-135m-instruct"}
PARAMS = params_by_name(
    ParamSpec("checkpoint", str, "", label="ReTrace checkpoint",
              help="A ReTrace fusion folder (config.json + model.safetensors). Empty = the "
                   "fusion this project trained for the embedded model, on its bundled DFlash."),
    ParamSpec("backbone", str, "", label="DFlash backbone",
              help="The DFlash drafter under ReTrace. Empty = the one the ReTrace checkpoint "
                   "was trained on."),
    DFLASH_PARAMS["block_size"], DFLASH_PARAMS["draft_temperature"], DFLASH_PARAMS["seed"],
    DFLASH_PARAMS["cut"], DFLASH_PARAMS["gate_cost"], DFLASH_PARAMS["weights"],
    ParamSpec("gate", str, "learned", choices=("learned", "off"), label="Memory gate",
              help="learned = fuse the rejected suffix through the trained gate; off = gate "
                   "forced to zero (drafts exactly what the DFlash backbone drafts)."),
)


# --------------------------------------------------------------------------- the memory
@dataclass
class RejectedMemory:
    """Round r's rejected suffix, keyed by absolute position (one record per rejected slot)."""
    positions: list[int]          # absolute position P of each rejected slot
    slots: list[int]              # its slot s in round r's block (1-based)
    h: torch.Tensor               # [n, H] drafter final hidden states (detached)
    c: torch.Tensor               # [n, H] target-token embeddings at P (verify pass)
    agree: torch.Tensor           # [n] 1.0 where the drafted token equalled the target's


def build_memory(hidden: torch.Tensor, draft: list[int], accepted: int,
                 target_argmax: list[int], anchor_pos: int, embed) -> RejectedMemory | None:
    """The memory of a verified chain round: rejected slots s = accepted+2 .. len(draft).
    ``hidden`` [>= len(draft), H] are the round's slot states (slot 1 first); ``anchor_pos`` the
    absolute position of the block's slot 0; ``embed`` the target's input embedding."""
    k = len(draft)
    slots = list(range(accepted + 2, k + 1))
    if not slots or len(target_argmax) < k:
        return None
    tgt = [int(target_argmax[s - 1]) for s in slots]
    idx = torch.tensor([s - 1 for s in slots])
    ids = torch.tensor(tgt, device=embed.weight.device)
    agree = torch.tensor([float(draft[s - 1] == t) for s, t in zip(slots, tgt)])
    return RejectedMemory([anchor_pos + s for s in slots], slots, hidden[idx].detach(),
                          embed(ids).detach().to(hidden.dtype), agree.to(hidden.dtype))


def align(memory: RejectedMemory | None, anchor_pos: int, block_size: int) -> list[tuple[int, int]]:
    """(new slot j, memory row) pairs: the record at P lands on slot P - anchor_pos of the block
    whose slot 0 sits at ``anchor_pos``; j in 1..B-1 only (the anchor is never touched)."""
    if memory is None:
        return []
    return [(p - anchor_pos, i) for i, p in enumerate(memory.positions)
            if 1 <= p - anchor_pos <= block_size - 1]


class ReTraceFusion(nn.Module):
    """Gated residual e += g * W [norm([h ; c]) ; agree] (W zero-initialised)."""

    def __init__(self, hidden_size: int, gate_bias: float = -2.0, eps: float = 1e-6):
        super().__init__()
        H = int(hidden_size)
        self.hidden_size = H
        self.norm = nn.RMSNorm(2 * H, eps=eps)
        self.proj = nn.Linear(2 * H + 1, H, bias=False)
        self.gate = nn.Linear(2 * H + 1, 1)
        with torch.no_grad():
            self.proj.weight.zero_()
            self.gate.weight.zero_()
            self.gate.bias.fill_(float(gate_bias))

    def forward(self, h: torch.Tensor, c: torch.Tensor,
                agree: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual [..., H], gate [...]) for memory rows h, c [..., H], agree [...]."""
        z = torch.cat([self.norm(torch.cat([h, c], -1)), agree.unsqueeze(-1)], -1)
        g = torch.sigmoid(self.gate(z)).squeeze(-1)
        return g.unsqueeze(-1) * self.proj(z), g


def fuse(x: torch.Tensor, fusion: ReTraceFusion, memory: RejectedMemory | None,
         anchor_pos: int, gate_off: bool = False) -> tuple[torch.Tensor, dict]:
    """Block input ``x`` [1, B, H] plus the fused memory; returns (x, info for the round)."""
    pairs = align(memory, anchor_pos, x.shape[1])
    if not pairs:
        return x, {}
    slots = [j for j, _ in pairs]
    info = {"slots": slots, "from_positions": [memory.positions[i] for _, i in pairs],
            "from_slots": [memory.slots[i] for _, i in pairs],
            "agree": [bool(memory.agree[i] > 0.5) for _, i in pairs]}
    if gate_off:   # the memory is aligned and recorded; nothing is computed or added
        return x, {**info, "gate": [0.0] * len(slots), "residual": [0.0] * len(slots),
                   "gate_off": True}
    rows = torch.tensor([i for _, i in pairs])
    dt = next(fusion.parameters()).dtype
    delta, g = fusion(memory.h[rows].to(dt), memory.c[rows].to(dt), memory.agree[rows].to(dt))
    x = x.clone()
    # what the memory added, relative to the slot's input embedding (0: nothing, whatever g)
    residual = delta.float().norm(dim=-1) / x[0, slots].float().norm(dim=-1).clamp_min(1e-9)
    x[0, slots] = x[0, slots] + delta.to(x.dtype)
    info["gate"] = [round(float(v), 4) for v in g.detach()]
    # 4 significant digits: a tiny contribution stays > 0, only a zero one reads 0
    info["residual"] = [float(f"{float(v):.4g}") for v in residual.detach()]
    return x, info


# --------------------------------------------------------------------------- checkpoints
INCLUDED = "included"              # config "backbone": fine-tuned jointly, saved alongside
INCLUDED_BACKBONE = "backbone"     # ... in this sub-folder of the ReTrace checkpoint


def fusion_config(fusion: ReTraceFusion, backbone_model, backbone: str) -> dict:
    return {"architectures": [ARCHITECTURE], "hidden_size": fusion.hidden_size,
            "backbone": backbone, "backbone_block_size": int(backbone_model.block_size),
            "backbone_target_layer_ids": list(backbone_model.target_layer_ids),
            "backbone_hidden_size": int(backbone_model.hidden_size)}


def save_retrace(fusion: ReTraceFusion, config: dict, folder: str | Path,
                 extra: dict | None = None) -> Path:
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = dict(config, **(extra or {}))
    (folder / CONFIG_NAME).write_text(json.dumps(cfg, indent=2) + "\n")
    save_file({k: v.detach().float().contiguous().cpu() for k, v in fusion.state_dict().items()},
              str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    return folder


def load_retrace(folder: str | Path) -> tuple[ReTraceFusion, dict]:
    """(fusion, config) of a ReTrace folder; errors name what is wrong."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cp, wp = folder / CONFIG_NAME, folder / WEIGHTS_NAME
    if not cp.is_file() or not wp.is_file():
        raise ModelLoadError(f"{folder} is not a ReTrace checkpoint (needs {CONFIG_NAME} and "
                             f"{WEIGHTS_NAME})")
    try:
        cfg = json.loads(cp.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{cp} is not valid JSON ({exc.msg})") from exc
    if ARCHITECTURE not in (cfg.get("architectures") or []):
        raise ModelLoadError(f"{folder} is not a ReTrace checkpoint (architectures: "
                             f"{cfg.get('architectures')})")
    try:
        sd = load_file(str(wp))
        fusion = ReTraceFusion(int(cfg["hidden_size"]))
        fusion.load_state_dict(sd, strict=True)
    except Exception as exc:  # corrupt file, wrong shapes, missing keys
        raise ModelLoadError(f"{wp} could not be loaded as ReTrace weights ({exc})") from exc
    return fusion, cfg


def check_backbone(cfg: dict, backbone_model) -> None:
    """One clear error when the ReTrace checkpoint was made for another backbone."""
    want = {"hidden size": (cfg.get("backbone_hidden_size"), int(backbone_model.hidden_size)),
            "block size": (cfg.get("backbone_block_size"), int(backbone_model.block_size)),
            "target layers": (cfg.get("backbone_target_layer_ids"),
                              list(backbone_model.target_layer_ids))}
    bad = [f"{k} {a} (checkpoint) vs {b} (DFlash drafter)" for k, (a, b) in want.items()
           if a is not None and a != b]
    if bad:
        raise SettingsError("the ReTrace checkpoint does not match the DFlash backbone: "
                            + "; ".join(bad))


def bundled_retrace(target) -> Path | None:
    """The ReTrace fusion this project trained for ``target``'s bundled DFlash drafter."""
    return bundled_checkpoint(target, BUNDLED)


# --------------------------------------------------------------------------- the drafter
class ReTraceDrafter(DFlashDrafter):
    """DFlash + the rejected-suffix memory (see the module docstring)."""

    name = "retrace"

    def __init__(self, target=None, checkpoint: str | Path | None = None,
                 backbone: str | None = None, fusion: ReTraceFusion | None = None,
                 gate: str = "learned", model=None, block_size: int | None = None,
                 draft_temperature: float = 0.0, seed: int = 0, cut: str = "auto",
                 dtype=None, device: str | None = None, weights: str = "float",
                 gate_cost: str = "measured"):
        if target is None:
            raise SettingsError("retrace needs the target model")
        self.gate_off = PARAMS["gate"].check(gate) == "off"
        cfg: dict = {}
        if fusion is None:
            checkpoint = PARAMS["checkpoint"].check(checkpoint or "")
            path = Path(checkpoint) if checkpoint.strip() else bundled_retrace(target)
            if path is None:
                raise SettingsError("retrace needs a trained ReTrace checkpoint for this target "
                                    "(checkpoint=FOLDER); only the embedded model has one bundled")
            fusion, cfg = load_retrace(path)
            self.retrace_checkpoint = str(path)
        else:
            self.retrace_checkpoint = None
        backbone = PARAMS["backbone"].check(backbone or "")
        if not backbone.strip() and cfg.get("backbone") == INCLUDED:   # trained jointly
            backbone = str(Path(self.retrace_checkpoint) / INCLUDED_BACKBONE)
        elif not backbone.strip() and cfg.get("backbone") not in (None, "", "bundled"):
            backbone = str(cfg["backbone"])
        super().__init__(target, checkpoint=backbone or None, model=model, block_size=block_size,
                         draft_temperature=draft_temperature, seed=seed, cut=cut, dtype=dtype,
                         device=device, weights=weights, tree=0, gate_cost=gate_cost)
        check_backbone(cfg, self.model)
        self.fusion = fusion.to(device=self.device, dtype=self.dtype).eval()
        self.memory: RejectedMemory | None = None
        self._info: dict = {}

    def _reset(self) -> None:
        super()._reset()
        self.memory = None

    def block_input(self, tokens: list[int]) -> torch.Tensor:
        x = super().block_input(tokens)
        x, self._info = fuse(x, self.fusion, self.memory, len(tokens) - 1, self.gate_off)
        self.memory = None  # the memory lives one round
        return x

    def propose(self, ctx: DraftContext) -> Draft:
        self._info = {}
        d = super().propose(ctx)
        if self._info:
            d.extras["retrace"] = self._info
        elif self.memory is not None:
            self.memory = None  # no block drafted this round: the memory expires anyway
        return d

    def observe(self, feedback: VerifyFeedback) -> None:
        super().observe(feedback)
        rnd = feedback.round
        self.memory = None
        h = getattr(self, "last_hidden", None)
        if h is None or rnd.parents is not None or not rnd.draft:
            return
        emb = self.target.model.get_input_embeddings()
        with torch.inference_mode():
            self.memory = build_memory(h, list(rnd.draft), int(rnd.accepted),
                                       list(rnd.target_argmax), int(rnd.start) - 1, emb)
        self.last_hidden = None

    def config(self) -> dict[str, Any]:
        c = super().config()
        c.update({"retrace_checkpoint": self.retrace_checkpoint, "gate": "off" if self.gate_off
                  else "learned", "backbone": c.pop("checkpoint")})
        return c


SPECS = (MethodSpec("retrace", ReTraceDrafter, "ReTrace", "ReTrace: DFlash conditioned on the "
                    "previous round's rejected suffix (gated residual, no extra forward)",
                    kind="learned", needs_target=True, params=tuple(PARAMS.values())),)
