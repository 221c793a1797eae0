"""Is the next block worth a drafter forward? Read it off the target's state
(docs/methods/dflash.md; beyond the papers, in the spirit of learned draft-length controllers).

The forward gate (:class:`.block_cut.ForwardGate`) judges a block drafter by its recent rounds.
Inside one reply, though, predictable and unpredictable stretches alternate (a formula after
prose, a list after a sentence), and a drafter forward -- 0.2-0.3 of a target step on a CPU -- spent
on a round whose block is rejected is never recovered. The target's hidden state at the last
committed position, which the verify pass computed anyway and which is already tapped for the
drafter's context, says a good deal about how predictable the next tokens are.

A :class:`StateProbe` is a ridge regression from those tapped features (the drafter's
``target_layer_ids``, concatenated, float32, standardised inside the probe) to the drafter's
accepted length at that state -- the whole block, greedy, slots 1..B-1. It is fitted on rollouts
that no drafter was trained on, with exact labels from offline replay
(:func:`specviz.train.gate_probe.probe_examples`). Before a round's forward the drafter asks
:func:`skips`: a round whose predicted accepted length cannot pay for the forward and the
smallest verify,

    y_hat < c(2) + d - 1      (c: the measured verify-cost curve, d: the drafter's forward,
                               both in one-token forwards, :mod:`specviz.costs`)

is a plain decoding step (no drafter forward). On an accelerator c(2) ~ 1 and d ~ 0, so it
almost never skips. Verification is unchanged: lossless either way.

Measured (docs/methods/dflash.md, the state probe's measured numbers): the bundled
drafter's probe predicts held-out accepted length with Pearson r 0.51-0.54 overall, but only
0.13-0.18 *within* the categories where DFlash does not pay (translation, summarization, RAG,
QA) -- there it mostly tells the category apart, which the forward gate already learns from the
run -- and offline replay showed no speed-up, so ``state_probe`` is off by default (``on``, or
``probes`` for the paused drafter's probe rounds only, turn it on).

Stored as ``state_probe.safetensors`` beside the drafter checkpoint it was fitted for, with the
SHA-256 of that checkpoint's ``model.safetensors``: a probe of another drafter is refused with
one clear error, a missing probe simply means no probe.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from ...models import ModelLoadError

PROBE_NAME = "state_probe.safetensors"   # (also spelled in .dflash_checkpoint, which skips it)
_SHA: dict[tuple[str, int, int], str] = {}


@dataclass
class StateProbe:
    """y_hat = ((x - mean) / scale) . w + b for tapped features x [F] (float32)."""

    weight: torch.Tensor        # [F]
    bias: float
    mean: torch.Tensor          # [F]
    scale: torch.Tensor         # [F]
    layers: list[int]           # the target layers x concatenates (drafter target_layer_ids)
    drafter_sha256: str = ""    # model.safetensors the probe was fitted for
    report: dict | None = None  # how it was fitted and how well it predicts held-out states

    @property
    def width(self) -> int:
        return int(self.weight.numel())

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Predicted accepted length for features x [..., F] (float32 tensor [...]): one dot
        product with the standardisation folded into the weights, so a round pays ~F
        multiply-adds."""
        w, b = self.folded
        return x.float() @ w + b

    @cached_property
    def folded(self) -> tuple[torch.Tensor, float]:
        """(w / scale, b - mean . w / scale): the probe as one affine map of the raw features."""
        w = self.weight.double() / self.scale.double()
        return w.float(), float(self.bias - float(self.mean.double() @ w))


def fit_state_probe(x: torch.Tensor, y: torch.Tensor, layers: list[int], alpha: float = 1000.0,
                    drafter_sha256: str = "") -> StateProbe:
    """Ridge regression (closed form, float64) of y [N] on standardised features x [N, F];
    ``alpha`` is the penalty on the standardised weights (the intercept is not penalised)."""
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0] or x.shape[0] < 2:
        raise ValueError(f"fit_state_probe needs x [N, F] and y [N] with N >= 2, got "
                         f"{tuple(x.shape)} and {tuple(y.shape)}")
    xd, yd = x.double(), y.double()
    mean, scale = xd.mean(0), xd.std(0).clamp_min(1e-3)
    z = (xd - mean) / scale
    ym = yd.mean()
    gram = z.T @ z + alpha * torch.eye(z.shape[1], dtype=torch.float64)
    w = torch.linalg.solve(gram, z.T @ (yd - ym))
    return StateProbe(w.float(), float(ym), mean.float(), scale.float(), list(layers),
                      drafter_sha256)


def skip_threshold(c2: float, draft_cost: float) -> float:
    """The accepted length a round must be expected to beat to pay for the drafter's forward
    (``draft_cost``) and the smallest verify (c(2)), both in one-token forwards: c(2) + d - 1."""
    return float(c2) + float(draft_cost) - 1.0


def skips(probe: StateProbe, x: torch.Tensor, c2: float, draft_cost: float
          ) -> tuple[bool, float, float]:
    """(skip the forward?, y_hat, threshold) for the features x [F] of the last committed
    position (see the module docstring)."""
    y_hat = float(probe.predict(x.reshape(-1)))
    threshold = skip_threshold(c2, draft_cost)
    return y_hat < threshold, y_hat, threshold


def checkpoint_sha256(folder: str | Path) -> str:
    """SHA-256 of a drafter checkpoint's model.safetensors (cached per path, size, mtime)."""
    path = Path(folder) / "model.safetensors"
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SHA:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        _SHA[key] = h.hexdigest()
    return _SHA[key]


def save_state_probe(probe: StateProbe, folder: str | Path) -> Path:
    """Write ``state_probe.safetensors`` into the drafter checkpoint's folder."""
    from safetensors.torch import save_file

    Path(folder).mkdir(parents=True, exist_ok=True)
    out = Path(folder) / PROBE_NAME
    meta = {"bias": repr(probe.bias), "layers": json.dumps(probe.layers),
            "drafter_sha256": probe.drafter_sha256, "report": json.dumps(probe.report or {})}
    save_file({"weight": probe.weight.contiguous(), "mean": probe.mean.contiguous(),
               "scale": probe.scale.contiguous()}, str(out), metadata=meta)
    return out


def load_state_probe(folder: str | Path, layers: list[int], width: int) -> StateProbe | None:
    """The probe beside the drafter checkpoint in ``folder``, None when there is none. A probe
    fitted for other weights, other layers or another feature width, or an unreadable file:
    one clear :class:`ModelLoadError`."""
    from safetensors import safe_open

    folder = Path(folder)
    path = folder / PROBE_NAME
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            t = {k: f.get_tensor(k).float() for k in ("weight", "mean", "scale")}
        probe = StateProbe(t["weight"], float(meta["bias"]), t["mean"], t["scale"],
                           [int(i) for i in json.loads(meta["layers"])],
                           str(meta.get("drafter_sha256", "")),
                           json.loads(meta.get("report") or "{}"))
    except Exception as exc:
        raise ModelLoadError(f"the state probe {path} cannot be read ({exc}): delete it or "
                             "refit it with `python -m specviz train gate-probe`") from exc
    problems = []
    if probe.layers != list(layers):
        problems.append(f"it reads target layers {probe.layers}, the drafter {list(layers)}")
    if probe.width != width or probe.mean.numel() != width or probe.scale.numel() != width:
        problems.append(f"it has {probe.width} features, the drafter's taps {width}")
    if (folder / "model.safetensors").is_file() and probe.drafter_sha256 \
            and probe.drafter_sha256 != checkpoint_sha256(folder):
        problems.append("it was fitted for other drafter weights (model.safetensors changed)")
    if problems:
        raise ModelLoadError(f"the state probe {path} does not belong to this drafter: "
                             + "; ".join(problems) + ". Refit it with `python -m specviz "
                             "train gate-probe` or delete it")
    return probe
