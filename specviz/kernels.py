"""Small-batch CPU linears: oneDNN with pre-packed weights where it is measured faster (issue 10,
"faster than plain decoding on this CPU"; METHODS §0, the verify forward).

On a CPU the verify forward is a *step* (:mod:`specviz.costs`): with torch's default fp32 path a
forward over 2 tokens costs ~1.9-2x one over 1 token, over 8 about 2.3x (measured on a 2-core AMD
EPYC, embedded SmolLM2-135M), because the BLAS GEMM used for 2-16 rows is far slower per row
than its 1-row path. oneDNN's inner product with the weight reordered once into its blocked
layout (``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``: the kernels
torch.compile's CPU weight freezing emits) runs 2-16 rows at ~1-1.4x the time of one -- but
costs a fixed ~20-30 µs more per call, which loses at one row on small matrices (and wins on the
49k-word LM head). Which is faster is a property of the machine, so :func:`tune_linears` times
both kernels per weight shape and per row bucket (1 row / 2 or more) on the loaded model, and
every ``nn.Linear`` whose shape gains then dispatches on its input's row count.

Same maths (fp32; rows differ from the default kernel's by ~1e-5, as two BLAS paths do), and
verification is unchanged, so speculative decoding stays lossless exactly as before; the
verify-cost model then measures the flatter curve at run time. Packed weights live in a side
table, not on the module: a deep copy, ``.to()``, training (grad) or a changed weight falls back
to the default kernel, never to a stale pack.
"""
from __future__ import annotations

import statistics
import time
import types
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

ROWS_PROBED = (1, 2, 8)   # 1 = a plain step; 2 and 8 = verify forwards (their sum decides)
PACK_HINT = 8             # the batch size oneDNN lays the packed weight out for
REPEATS = 7
MIN_GAIN = 0.95           # packed must be at least 5 % faster to be used

_PACKS: "weakref.WeakKeyDictionary[torch.nn.Linear, tuple]" = weakref.WeakKeyDictionary()


@dataclass
class KernelChoice:
    """Per weight shape (out, in): ms of the default and the packed kernel at each probed row
    count, and the row buckets ("1", "2+") that use the packed one."""

    times_ms: dict = field(default_factory=dict)    # "576x1536" -> {"plain@1": ms, ...}
    packed: dict = field(default_factory=dict)      # "576x1536" -> ["2+"] / ["1", "2+"] / []
    modules: int = 0                                # nn.Linear modules dispatching
    tune_s: float = 0.0

    def summary(self) -> str:
        if not self.modules:
            return "default linear kernels (oneDNN packed ones were not faster here)"
        used = {s: b for s, b in self.packed.items() if b}
        shapes = ", ".join(f"{s} ({'/'.join(b)} rows)" for s, b in used.items())
        return f"oneDNN packed linears for {shapes}: {self.modules} modules"


def available() -> bool:
    """Whether this torch build has the oneDNN packed linear ops."""
    ops = getattr(torch.ops, "mkldnn", None)
    try:
        return bool(torch.backends.mkldnn.is_available()) and \
            hasattr(ops, "_linear_pointwise") and hasattr(ops, "_reorder_linear_weight")
    except (AttributeError, RuntimeError):
        return False


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The weight [out, in] reordered into oneDNN's blocked layout (an opaque tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_HINT)


def packed_linear(x2d: torch.Tensor, packed: torch.Tensor, bias) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x2d, packed, bias, "none", [], "")


def _median_ms(fn, repeats: int = REPEATS) -> float:
    fn()
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1000 * statistics.median(ts)


def time_shape(weight: torch.Tensor, rows=ROWS_PROBED) -> dict[str, float]:
    """ms of the default and the packed kernel for ``weight`` at each row count in ``rows``."""
    p = pack(weight)
    out = {}
    with torch.inference_mode():
        for m in rows:
            x = torch.randn(m, weight.shape[1], dtype=weight.dtype)
            out[f"plain@{m}"] = _median_ms(lambda: F.linear(x, weight))
            out[f"packed@{m}"] = _median_ms(lambda: packed_linear(x, p, None))
    return out


def buckets_that_gain(t: dict[str, float]) -> list[str]:
    """Row buckets where the packed kernel is at least 1 / MIN_GAIN times faster."""
    out = []
    if t["packed@1"] < MIN_GAIN * t["plain@1"]:
        out.append("1")
    if t["packed@2"] + t["packed@8"] < MIN_GAIN * (t["plain@2"] + t["plain@8"]):
        out.append("2+")
    return out


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """Dispatch on the rows: the packed kernel where it was measured faster, else the default."""
    entry = _PACKS.get(self)
    rows = x.numel() // max(1, self.in_features)
    if entry is None or x.dtype != torch.float32 or x.device.type != "cpu" or \
            (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
        return F.linear(x, self.weight, self.bias)
    packed, bucket, ptr, version = entry
    if (rows == 1 and "1" not in bucket) or (rows > 1 and "2+" not in bucket):
        return F.linear(x, self.weight, self.bias)
    if self.weight.data_ptr() != ptr or self.weight._version != version:
        _PACKS.pop(self, None)          # the weight changed since it was packed
        return F.linear(x, self.weight, self.bias)
    y = packed_linear(x.reshape(-1, self.in_features), packed, self.bias)
    return y.reshape(*x.shape[:-1], self.out_features)


def install(module: torch.nn.Linear, bucket: list[str]) -> None:
    """Make ``module`` dispatch through :func:`_forward` with a packed copy of its weight."""
    w = module.weight
    _PACKS[module] = (pack(w), tuple(bucket), w.data_ptr(), w._version)
    module.forward = types.MethodType(_forward, module)


def uninstall(model: torch.nn.Module) -> None:
    """Back to the default kernels everywhere in ``model``."""
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            _PACKS.pop(mod, None)
            mod.__dict__.pop("forward", None)


def tune_linears(model: torch.nn.Module, known: KernelChoice | None = None) -> KernelChoice:
    """Time both kernels once per weight shape of ``model`` (fp32, CPU) and install the packed
    one on every ``nn.Linear`` whose shape gains in some row bucket. ~1 s on the embedded model.
    Shapes already timed in ``known`` (e.g. the target's, for a drafter with the same layer
    shapes) keep that measurement."""
    t0 = time.perf_counter()
    choice = KernelChoice(times_ms=dict(known.times_ms) if known else {},
                          packed=dict(known.packed) if known else {})
    if not available():
        return choice
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)
               and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]
    for mod in linears:
        key = f"{mod.out_features}x{mod.in_features}"
        if key not in choice.times_ms:
            t = time_shape(mod.weight)
            choice.times_ms[key] = {k: round(v, 3) for k, v in t.items()}
            choice.packed[key] = buckets_that_gain(t)
        if choice.packed[key]:
            install(mod, choice.packed[key])
            choice.modules += 1
    choice.tune_s = time.perf_counter() - t0
    return choice
