"""Small-batch CPU linears: oneDNN with pre-packed weights, and sibling linears fused, where it
is measured faster (the verify forward on a CPU: docs/cpu-verify.md).

On a CPU the verify forward is a *step* (:mod:`specviz.costs`): with torch's default fp32 path a
forward over 2 tokens costs ~1.9-2x one over 1 token (measured on a 2-core AMD EPYC, embedded
SmolLM2-135M), because the BLAS GEMM used for 2-16 rows is far slower per row than its 1-row
path. oneDNN's inner product with the weight reordered once into its blocked layout
(``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``: the kernels torch.compile's
CPU weight freezing emits) runs 2-16 rows at ~1-1.4x the time of one.

Which kernel is faster depends on the machine *and on where the weights are*: timed on one
matrix called again and again (hot in cache) the packed kernel's fixed per-call cost loses at one
row, but inside a forward every weight streams from memory once, and there it wins at one row
too (the embedded model's layer linears: 27.8 -> 20.7 ms per forward at 1 row, 46 -> 32 ms at 8).
So :func:`tune_linears` times the model's linears **in forward order**, each weight once per
sweep as a forward reads them, per row bucket (1 row / 2 or more), and picks per weight shape.

Sibling linears that read the same input (q/k/v, gate/up: found by one traced forward) can run as
one packed matrix: the first sibling computes all outputs, the others take their slice (checked
by tensor identity, else they compute their own). Fewer, larger calls: 8 rows 32 -> 27 ms more.
Fused where measured faster, like the rest.

Same maths (fp32; rows differ from the default kernel's by ~1e-5, as two BLAS paths do), and
verification is unchanged, so speculative decoding stays lossless exactly as before; the
verify-cost model then measures the flatter curve at run time. Packed weights live in side
tables, not on the module: a deep copy, ``.to()``, training (grad) or a changed weight falls back
to the default kernel, never to a stale pack.
"""
from __future__ import annotations

import statistics
import time
import types
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

ROWS_PROBED = (1, 2, 8)   # 1 = a plain step; 2 and 8 = verify forwards (their sum decides)
PACK_HINT = 8             # the batch size oneDNN lays the packed weight out for
SWEEPS = 5                # forward-order sweeps per (kernel, rows); the median counts
MIN_GAIN = 0.95           # packed / fused must be at least 5 % faster to be used

_PACKS: "weakref.WeakKeyDictionary[torch.nn.Linear, tuple]" = weakref.WeakKeyDictionary()
_GROUPS: "weakref.WeakKeyDictionary[torch.nn.Linear, tuple]" = weakref.WeakKeyDictionary()


@dataclass
class KernelChoice:
    """Per weight shape (out, in) or fused group ("fused:..."): ms per forward of each kernel at
    each probed row count, and the row buckets ("1", "2+") that use the packed / fused one."""

    times_ms: dict = field(default_factory=dict)    # "576x1536" -> {"plain@1": ms, ...}
    packed: dict = field(default_factory=dict)      # "576x1536" -> ["2+"] / ["1", "2+"] / []
    fused: dict = field(default_factory=dict)       # "fused:576x576+192x576+192x576" -> buckets
    modules: int = 0                                # nn.Linear modules dispatching
    groups: int = 0                                 # fused sibling groups
    tune_s: float = 0.0

    def summary(self) -> str:
        if not self.modules:
            return "default linear kernels (oneDNN packed ones were not faster here)"
        used = {s: b for s, b in self.packed.items() if b}
        shapes = ", ".join(f"{s} ({'/'.join(b)} rows)" for s, b in used.items())
        fused = {g: b for g, b in self.fused.items() if b}
        text = f"oneDNN packed linears for {shapes}: {self.modules} modules"
        if fused:
            kinds = ", ".join(f"{g[6:]} ({'/'.join(b)} rows)" for g, b in fused.items())
            text += f"; fused siblings {kinds}: {self.groups} groups"
        return text


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


def buckets_that_gain(t: dict[str, float], kernel: str = "packed", base=("plain",)) -> list[str]:
    """Row buckets where ``kernel`` is at least 1 / MIN_GAIN times faster than the best of
    ``base`` (times keyed "kernel@rows")."""
    def best(rows):
        return min(t[f"{b}@{rows}"] for b in base)
    out = []
    if t[f"{kernel}@1"] < MIN_GAIN * best(1):
        out.append("1")
    if t[f"{kernel}@2"] + t[f"{kernel}@8"] < MIN_GAIN * (best(2) + best(8)):
        out.append("2+")
    return out


def shape_key(mod: torch.nn.Linear) -> str:
    return f"{mod.out_features}x{mod.in_features}"


def group_key(mods) -> str:
    return "fused:" + "+".join(shape_key(m) for m in mods)


def _version(x: torch.Tensor) -> int | None:
    """In-place change counter (inference tensors have none)."""
    return None if x.is_inference() else x._version


def _bucket(rows: int) -> str:
    return "1" if rows == 1 else "2+"


# --------------------------------------------------------------------------- dispatch
@dataclass(eq=False)
class FusedGroup:
    """Sibling linears on one input, as one packed matrix; outputs are handed out per member."""

    members: list                  # weakrefs to the modules, in call order
    packed: torch.Tensor
    bias: torch.Tensor | None
    splits: list[int]
    bucket: tuple
    stamps: list                   # (data_ptr, _version) of each member's weight when packed
    pending: tuple | None = None   # (x, x._version, outputs) of the last leader call

    def fresh(self) -> bool:
        mods = [r() for r in self.members]
        return all(m is not None and (m.weight.data_ptr(), m.weight._version) == s
                   for m, s in zip(mods, self.stamps))

    def output(self, i: int, x: torch.Tensor, in_features: int) -> torch.Tensor | None:
        """Member ``i``'s output for ``x``, or None (stale weights, or not the leader's input)."""
        if i == 0:
            if not self.fresh():
                self.pending = None
                for r in self.members:
                    if r() is not None:
                        _GROUPS.pop(r(), None)
                return None
            y = packed_linear(x.reshape(-1, in_features), self.packed, self.bias)
            outs = y.split(self.splits, dim=-1)
            self.pending = (x, _version(x), outs) if len(outs) > 1 else None
            return outs[0]
        p = self.pending
        if p is None or p[0] is not x or p[1] != _version(x):
            return None
        if i == len(self.splits) - 1:
            self.pending = None
        return p[2][i]


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """Dispatch on the rows: fused / packed where measured faster, else the default kernel."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or \
            (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
        return F.linear(x, self.weight, self.bias)
    rows = x.numel() // max(1, self.in_features)
    bucket = _bucket(rows)
    member = _GROUPS.get(self)
    if member is not None and bucket in member[0].bucket:
        y = member[0].output(member[1], x, self.in_features)
        if y is not None:
            return y.reshape(*x.shape[:-1], self.out_features)
    entry = _PACKS.get(self)
    if entry is None or bucket not in entry[1]:
        return F.linear(x, self.weight, self.bias)
    packed, _, ptr, version = entry
    if self.weight.data_ptr() != ptr or self.weight._version != version:
        _PACKS.pop(self, None)          # the weight changed since it was packed
        return F.linear(x, self.weight, self.bias)
    y = packed_linear(x.reshape(-1, self.in_features), packed, self.bias)
    return y.reshape(*x.shape[:-1], self.out_features)


def install(module: torch.nn.Linear, bucket: list[str], packed: torch.Tensor | None = None) -> None:
    """Make ``module`` dispatch through :func:`_forward` with a packed copy of its weight
    (``packed``: already made, e.g. for timing)."""
    w = module.weight
    _PACKS[module] = (pack(w) if packed is None else packed, tuple(bucket), w.data_ptr(),
                      w._version)
    module.forward = types.MethodType(_forward, module)


def fused_group(mods: list[torch.nn.Linear], bucket=("1", "2+")) -> FusedGroup:
    """One packed matrix for sibling linears (same input, same in_features), not installed."""
    w = torch.cat([m.weight.detach() for m in mods])
    bias = None if mods[0].bias is None else torch.cat([m.bias.detach() for m in mods])
    return FusedGroup(members=[weakref.ref(m) for m in mods], packed=pack(w), bias=bias,
                      splits=[m.out_features for m in mods], bucket=tuple(bucket),
                      stamps=[(m.weight.data_ptr(), m.weight._version) for m in mods])


def install_group(mods: list[torch.nn.Linear], bucket: list[str],
                  group: FusedGroup | None = None) -> FusedGroup:
    """Make the siblings ``mods`` (called in this order on one input) share one fused matmul
    (``group``: already packed for them)."""
    g = group or fused_group(mods, bucket)
    g.bucket = tuple(bucket)
    for i, m in enumerate(mods):
        _GROUPS[m] = (g, i)
        m.forward = types.MethodType(_forward, m)
    return g


def uninstall(model: torch.nn.Module) -> None:
    """Back to the default kernels everywhere in ``model``."""
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            _PACKS.pop(mod, None)
            _GROUPS.pop(mod, None)
            mod.__dict__.pop("forward", None)


# --------------------------------------------------------------------------- measuring
def _linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)
            and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]


def _siblings(a: torch.nn.Linear, b: torch.nn.Linear) -> bool:
    return a.in_features == b.in_features and (a.bias is None) == (b.bias is None)


def call_order(model: torch.nn.Module, example: Callable[[], object] | None = None
               ) -> tuple[list[torch.nn.Linear], list[list[torch.nn.Linear]]]:
    """(the fp32 CPU linears in the order ``example()`` -- one forward -- calls them, the sibling
    groups: consecutive calls on the very same input tensor, e.g. q/k/v and gate/up). Without
    ``example`` (or when it fails): module order and no groups."""
    linears = _linears(model)
    if example is None:
        return linears, []
    seen: list[tuple[torch.nn.Linear, torch.Tensor]] = []
    handles = [m.register_forward_pre_hook(lambda mod, args: seen.append((mod, args[0])))
               for m in linears]
    try:
        with torch.inference_mode():
            example()
    except Exception:  # noqa: BLE001 - no traced order: module order and no groups (still safe)
        return linears, []
    finally:
        for h in handles:
            h.remove()
    first: dict = {}
    for mod, x in seen:
        first.setdefault(mod, x)
    order = list(first) + [m for m in linears if m not in first]
    groups, run = [], []
    for mod in order:
        x = first.get(mod)
        if run and x is not None and x is first[run[-1]] and _siblings(run[0], mod):
            run.append(mod)
            continue
        if len(run) > 1:
            groups.append(run)
        run = [mod] if x is not None else []
    if len(run) > 1:
        groups.append(run)
    return order, groups


def _sweep_s(units, xs) -> dict[str, float]:
    """Run ``units`` [(keys, fn(x), in_features)] once, in order, as a forward streams its
    weights; per key the summed call time (s)."""
    acc: dict[str, float] = {}
    for ks, fn, i in units:
        t0 = time.perf_counter()
        fn(xs[i])
        dt = time.perf_counter() - t0
        for k in ks:
            acc[k] = acc.get(k, 0.0) + dt
    return acc


def _units(order, groups, packs, fused, kernel: str):
    """The sweep's units for one kernel: "plain" / "packed" per module, or "fused" groups (the
    other modules packed, untimed: they still stream through the cache as in a forward)."""
    gk = {m: group_key(g) for g in groups for m in g}
    leaders = {g[0]: (group_key(g), fused[i]) for i, g in enumerate(groups)}
    out = []
    for m in order:
        keys = (shape_key(m),) + ((gk[m],) if m in gk else ())
        if kernel == "plain":
            out.append((keys, lambda x, m=m: F.linear(x, m.weight, m.bias), m.in_features))
        elif kernel == "packed" or m not in gk:
            ks = keys if kernel == "packed" else ()
            out.append((ks, lambda x, m=m: packed_linear(x, packs[m], m.bias), m.in_features))
        elif m in leaders:
            key, g = leaders[m]
            out.append(((key,), lambda x, g=g: packed_linear(x, g.packed, g.bias), m.in_features))
    return out


def measure(order, groups, packs, fused, repeats: int = SWEEPS) -> dict[str, dict[str, float]]:
    """ms per forward of every shape (and group) of ``order`` under each kernel and row count:
    the median of ``repeats`` sweeps, the kernels and row counts interleaved within each repeat
    (so a drift of the machine's speed hits them all alike), after one warm-up round."""
    kernels = ("plain", "packed", "fused") if groups else ("plain", "packed")
    units = {k: _units(order, groups, packs, fused, k) for k in kernels}
    ins = {m.in_features for m in order}
    xs = {rows: {i: torch.randn(rows, i) for i in ins} for rows in ROWS_PROBED}
    runs: dict[str, dict[str, list[float]]] = {}
    with torch.inference_mode():
        for rep in range(repeats + 1):
            for kernel in kernels:
                for rows in ROWS_PROBED:
                    got = _sweep_s(units[kernel], xs[rows])
                    for key, sec in got.items():
                        if rep:
                            runs.setdefault(key, {}).setdefault(f"{kernel}@{rows}", []).append(sec)
    return {key: {name: round(1000 * statistics.median(v), 3) for name, v in t.items()}
            for key, t in runs.items()}


def tune_linears(model: torch.nn.Module, known: KernelChoice | None = None,
                 example: Callable[[], object] | None = None) -> KernelChoice:
    """Time the kernels on ``model``'s fp32 CPU linears in forward order (``example()`` runs one
    forward to find that order and the sibling groups) and install, per weight shape and fused
    group, the fastest in each row bucket. ~2-3 s on the embedded model. Shapes already timed in
    ``known`` (e.g. the target's, for a drafter with the same layer shapes) keep that
    measurement."""
    t0 = time.perf_counter()
    choice = KernelChoice(times_ms=dict(known.times_ms) if known else {},
                          packed=dict(known.packed) if known else {},
                          fused=dict(known.fused) if known else {})
    if not available():
        return choice
    order, groups = call_order(model, example)
    todo = [m for m in order if shape_key(m) not in choice.times_ms]
    packs, fused = {}, {}      # made only to time what is new; reused when installed
    if todo:
        gtodo = [i for i, g in enumerate(groups) if group_key(g) not in choice.times_ms]
        packs = {m: pack(m.weight) for m in todo}
        fused = {i: fused_group(groups[i]) for i in gtodo}
        times = measure(todo, [groups[i] for i in gtodo], packs, [fused[i] for i in gtodo])
        choice.times_ms.update(times)
        for key, t in times.items():
            if key.startswith("fused:"):
                choice.fused[key] = buckets_that_gain(t, "fused", ("plain", "packed"))
            else:
                choice.packed[key] = buckets_that_gain(t)
    _install_choice(choice, order, groups, packs, fused)
    choice.tune_s = time.perf_counter() - t0
    return choice


def _install_choice(choice: KernelChoice, order, groups, packs: dict, fused: dict) -> None:
    """Install the measured choice: fused groups first, then single packed linears where the
    group does not already cover the bucket (packing what timing did not already pack)."""
    covered: dict = {}
    for i, g in enumerate(groups):
        bucket = choice.fused.get(group_key(g)) or []
        if bucket:
            install_group(g, bucket, fused.get(i))
            covered.update({m: set(bucket) for m in g})
            choice.groups += 1
    for m in order:
        bucket = [b for b in choice.packed.get(shape_key(m)) or [] if b not in covered.get(m, ())]
        if bucket:
            install(m, bucket, packs.get(m))
        if bucket or m in covered:
            choice.modules += 1
