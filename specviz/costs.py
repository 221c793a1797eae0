"""The measured verify-cost model c(k): what a target forward over k new tokens costs,
relative to a one-token forward.

On a CPU the curve is a *step*, not a slope: one new token runs matrix-vector kernels, two or
more run matrix-matrix kernels, so c(2) is already ~1.7-1.9 while c(16) is barely more (measured
on a 2-core CPU with the embedded SmolLM2-135M: 71 ms at k=1, 126 / 114 / 127 ms at k=2 / 8 / 16).
Its height depends on the machine, the thread count and the load, so a constant table is wrong
somewhere; hence:

- :func:`calibrate` times a few forwards over k in (1, 2, 4, ... 64) new tokens on the loaded
  target, on top of a KV cache of realistic length (filled with random keys/values: attention
  time does not depend on their values, and no prefill is paid), warm-up first, interleaved
  passes within a time budget (1.5 s by default); c(k) is the median of *paired* ratios (each
  k-token time over the one-token times taken right before and after it, under the same load);
- :meth:`CostModel.observe` refines it online from the rounds' own verify times: per-knot EMA of
  the *clipped* log-residual, so one slow round moves a knot by a few percent at most; one-token
  rounds refine the reference ``step_time`` the same way;
- :func:`cost_model_for` caches one model per (model name, device, dtype, torch threads) in the
  process, and returns the flat curve on an accelerator (drafting is nearly free there, and the
  verify forward is memory-bound up to far more than 64 tokens).

The curve is piecewise-linear between knots (linear extrapolation past the last one; flat when
only one k > 1 is known), kept monotone non-decreasing by isotonic regression over the knots, with
c(1) = 1 exactly. A target whose forwards are padded to ``min_width`` tokens
(:mod:`specviz.numerics`: width-invariant bfloat16) runs the *same* forward for every
k <= min_width, so c(k) = 1 exactly there: those k are not timed, and a verify of up to
min_width - 1 draft tokens is known to cost what a plain step costs. Under heavy load not every
k fits in the budget: k = 1, 2 and 64 are timed first (2 twice), so the step and the far end are
known and the rest is interpolated until rounds refine it.
"""
from __future__ import annotations

import math
import statistics
import threading
import time
from dataclasses import dataclass, field

import torch

DEFAULT_KS = (1, 2, 4, 8, 16, 32, 64)
PRIORITY = (1, 2, 64, 1, 2, 16, 8, 4, 32)  # one pass: the step (twice: it decides whether to
#   draft at all) and the far end first, as under load not all fit; k = 1 twice: load reference
SAFETY = 1.2           # a forward may take this much longer than its last time
CONTEXT_TOKENS = 300   # KV cache length the forwards are timed on
FLAT_POINTS = ((1, 1.0), (64, 1.1), (257, 1.6))
EMA_RATE = 0.2         # weight of one observation on its knot(s)
CLIP_LOG = 0.25        # an observation moves a knot by <= rate * 0.25 in log space
MAX_WEIGHT = 10.0      # evidence cap per knot (an EMA remembers ~1/rate rounds)
MAX_REPEATS = 7        # passes at most (a tiny model would otherwise loop for the whole budget)

_CACHE: dict[tuple, "CostModel"] = {}
_CACHE_LOCK = threading.Lock()


# ---------------------------------------------------------------------------- curve helpers
def isotonic(values: list[float], weights: list[float] | None = None) -> list[float]:
    """Pool-adjacent-violators: the closest non-decreasing sequence (weighted least squares)."""
    weights = weights or [1.0] * len(values)
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights):
        blocks.append([float(v), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1, n1), (m2, w2, n2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    out: list[float] = []
    for m, _, n in blocks:
        out += [m] * n
    return out


def interpolate(points: list[tuple[int, float]], k: float) -> float:
    """Piecewise-linear through ``points`` (sorted by k); linear extrapolation at both ends."""
    if len(points) == 1:
        return points[0][1]
    if k <= points[0][0]:
        return points[0][1]
    for (k0, c0), (k1, c1) in zip(points, points[1:]):
        if k <= k1:
            return c0 + (c1 - c0) * (k - k0) / (k1 - k0)
    (k0, c0), (k1, c1) = points[-2], points[-1]
    return c1 + (c1 - c0) * (k - k1) / (k1 - k0)


def _neighbours(ks: list[int], k: int) -> list[tuple[int, float]]:
    """The knots enclosing ``k`` with their linear-interpolation weights."""
    if k <= ks[0]:
        return [(ks[0], 1.0)]
    for k0, k1 in zip(ks, ks[1:]):
        if k <= k1:
            w1 = (k - k0) / (k1 - k0)
            return [(k0, 1.0 - w1), (k1, w1)]
    return [(ks[-1], 1.0)]


def _clip(x: float, bound: float) -> float:
    return max(-bound, min(bound, x))


# ---------------------------------------------------------------------------- the model
@dataclass
class CostModel:
    """c(k) = relative cost of a target forward over ``k`` new tokens (c(1) = 1), plus the
    absolute ``step_time`` (seconds) of a one-token forward.

    ``log_rel`` holds the raw per-knot log(c) the observations update, ``weight`` how much evidence
    each knot has (1 + the observations' interpolation weights); :meth:`relative` reads the
    monotone view (weighted isotonic regression: a well-observed knot outvotes a stale one).
    ``frozen`` fixes the shape (the flat curve); ``step_time`` still adapts.
    """

    log_rel: dict[int, float]
    weight: dict[int, float] = field(default_factory=dict)
    step_time: float = 0.0
    kind: str = "measured"
    frozen: bool = False
    rate: float = EMA_RATE
    clip: float = CLIP_LOG
    observations: int = 0
    key: tuple = ()
    calibration_s: float = 0.0
    min_width: int = 1
    _view: list[tuple[int, float]] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_points(cls, points, step_time: float = 0.0, **kw) -> "CostModel":
        """From ``[(k, c(k)[, weight]), ...]`` (any order; c(1) is forced to 1)."""
        log_rel = {int(p[0]): math.log(max(float(p[1]), 1e-9)) for p in points if int(p[0]) >= 1}
        log_rel[1] = 0.0
        weight = {int(p[0]): float(p[2]) for p in points if len(p) > 2 and int(p[0]) in log_rel}
        width = max(1, int(kw.get("min_width", 1)))
        if width > 1:  # one padded forward for every k <= min_width: c = 1 there, exactly
            log_rel = {k: v for k, v in log_rel.items() if k == 1 or k > width}
            log_rel[width] = 0.0
        return cls(log_rel=log_rel, weight=weight, step_time=float(step_time), **kw)

    @classmethod
    def flat(cls, step_time: float = 0.0) -> "CostModel":
        """The accelerator curve: a wider verify forward costs almost nothing more."""
        return cls.from_points(FLAT_POINTS, step_time, kind="flat", frozen=True)

    # ------------------------------------------------------------------ reading
    def points(self) -> list[tuple[int, float]]:
        """The monotone knots ``[(k, c(k))]``: isotonic in log space, c >= 1, c(1) = 1."""
        view = self._view
        if view is None:
            ks = sorted(self.log_rel)
            # c(k) = 1 is exact for k <= min_width (the same forward as a plain step)
            wts = [1e9 if k <= self.min_width else self.weight.get(k, 1.0) for k in ks]
            mono = isotonic([self.log_rel[k] for k in ks], wts)
            view = [(k, 1.0 if k <= self.min_width else math.exp(max(0.0, v)))
                    for k, v in zip(ks, mono)]
            self._view = view
        return view

    def relative(self, k: int | float) -> float:
        """c(k): cost of a forward over ``k`` new tokens relative to a one-token forward."""
        if k <= max(1, self.min_width):
            return 1.0
        pts = self.points()
        if k > pts[-1][0] and len(pts) < 3:  # only the step is known (a calibration cut short
            return pts[-1][1]                # by load): no slope to extrapolate, stay flat
        return max(1.0, interpolate(pts, k))

    def seconds(self, k: int | float) -> float:
        """Predicted wall time of a forward over ``k`` new tokens (0 when never timed)."""
        return self.step_time * self.relative(k)

    # ------------------------------------------------------------------ online refinement
    def observe(self, k: int, seconds: float) -> None:
        """Refine the model with one measured verify forward over ``k`` new tokens.

        k = 1 updates ``step_time``; k > 1 moves the enclosing knots (by interpolation weight)
        toward log(seconds / step_time). Each step is an EMA of a clipped log-residual, so an
        outlier round shifts the curve by at most ``rate * clip`` in log space.
        """
        k = int(k)
        if k < 1 or not seconds > 0 or not math.isfinite(seconds):
            return
        self.observations += 1
        if k <= self.min_width or self.frozen or self.step_time <= 0:
            self._observe_step(seconds / self.relative(k))  # a fixed shape: only the scale
            return
        if k > max(self.log_rel):
            self.log_rel[k] = math.log(self.relative(k))
        ks = sorted(self.log_rel)
        raw = interpolate([(q, self.log_rel[q]) for q in ks], k)
        resid = _clip(math.log(seconds / self.step_time) - raw, self.clip)
        for q, w in _neighbours(ks, k):
            if q > self.min_width:
                self.log_rel[q] += self.rate * w * resid
                self.weight[q] = min(MAX_WEIGHT, self.weight.get(q, 1.0) + w)
        self._view = None

    def _observe_step(self, seconds: float) -> None:
        if self.step_time <= 0:
            self.step_time = seconds
            return
        resid = _clip(math.log(seconds / self.step_time), self.clip)
        self.step_time *= math.exp(self.rate * resid)

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict:
        """JSON-ready: the raw knots, the monotone view, the reference step and provenance."""
        return {"kind": self.kind, "step_time": self.step_time, "frozen": self.frozen,
                "rate": self.rate, "clip": self.clip, "observations": self.observations,
                "calibration_s": self.calibration_s, "key": [str(x) for x in self.key],
                "min_width": self.min_width,
                "raw": [[k, math.exp(v), self.weight.get(k, 1.0)]
                        for k, v in sorted(self.log_rel.items())],
                "points": [[k, c] for k, c in self.points()]}

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        """Inverse of :meth:`to_dict` (``raw`` wins over ``points`` when both are present)."""
        pts = d.get("raw") or d.get("points") or FLAT_POINTS
        return cls.from_points(pts, float(d.get("step_time", 0.0)),
                               kind=str(d.get("kind", "measured")),
                               frozen=bool(d.get("frozen", False)),
                               rate=float(d.get("rate", EMA_RATE)),
                               clip=float(d.get("clip", CLIP_LOG)),
                               observations=int(d.get("observations", 0)),
                               key=tuple(d.get("key", ())),
                               calibration_s=float(d.get("calibration_s", 0.0)),
                               min_width=int(d.get("min_width", 1)))


# ---------------------------------------------------------------------------- calibration
def _random_cache(target, length: int, generator: torch.Generator):
    """A DynamicCache holding ``length`` positions of random keys/values on every layer."""
    from transformers import DynamicCache

    cfg = target.model.config
    heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    cache = DynamicCache(config=cfg)
    for layer in range(int(cfg.num_hidden_layers)):
        kv = torch.randn(2, 1, heads, length, head_dim, generator=generator)
        kv = kv.to(device=target.device, dtype=target.dtype)
        cache.update(kv[0], kv[1], layer)
    return cache


def _timed_forward(target, cache, k: int, generator: torch.Generator) -> float:
    """Seconds of one verify-shaped forward over ``k`` new tokens (forward + softmax of the
    logits, as a round does, padded like a round to ``target.min_width``); the cache is cropped
    back afterwards."""
    from .kvcache import cache_kwarg

    model = target.model
    vocab = int(model.config.vocab_size)
    k = max(int(k), int(getattr(target, "min_width", 1) or 1))
    ids = torch.randint(0, vocab, (1, k), generator=generator).to(target.device)
    with target.lock, torch.inference_mode():
        t0 = time.perf_counter()
        out = model(input_ids=ids, use_cache=True, **{cache_kwarg(model): cache})
        torch.softmax(out.logits[0].float(), dim=-1)[:, 0].sum().item()  # also syncs a GPU
        dt = time.perf_counter() - t0
        cache.crop(-k)
    return dt


def _schedule(ks, min_width: int = 1) -> list[int]:
    """Measuring order for one pass: the priority ks first, then any others ascending (no k in
    2..min_width: those run the one-token forward's padded shape)."""
    ks = sorted({int(k) for k in ks if int(k) == 1 or int(k) > min_width} | {1})
    return [k for k in PRIORITY if k in ks] + [k for k in ks if k not in PRIORITY]


def _fits(samples: list[tuple[int, float]], k: int, left: float) -> bool:
    """Whether one more forward over ``k`` tokens fits in ``left`` seconds (its last time, or a
    guess from the one-token time, with a safety margin; the first forward always runs)."""
    last = {q: t for q, t in samples}
    if 1 not in last:
        return k == 1
    guess = last[k] if k in last else last[1] * (1.6 + k / 16)  # a rough prior c(k), k >= 2
    return guess * SAFETY <= left


def measure(target, ks=DEFAULT_KS, budget_s: float = 1.5, context: int = CONTEXT_TOKENS,
            max_repeats: int = MAX_REPEATS, seed: int = 0) -> tuple[list[tuple[int, float]], float]:
    """Time forwards over each k in interleaved passes (so load changes hit every k alike),
    skipping a forward that no longer fits in ``budget_s``, warm-up included. Returns the
    (k, seconds) samples in the order they were taken, and the wall seconds."""
    t_start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    order = _schedule(ks, int(getattr(target, "min_width", 1) or 1))
    context = max(1, min(context, target.max_context - max(order) - 1))
    cache = _random_cache(target, context, gen)
    _timed_forward(target, cache, 1, gen)  # warm-up (allocations, caches)
    samples: list[tuple[int, float]] = []
    for _ in range(max_repeats):
        ran = False
        for k in order:
            if _fits(samples, k, budget_s - (time.perf_counter() - t_start)):
                samples.append((k, _timed_forward(target, cache, k, gen)))
                ran = True
        if not ran:
            break
    return samples, time.perf_counter() - t_start


def paired_ratios(samples: list[tuple[int, float]]) -> dict[int, list[float]]:
    """c(k) samples: each k-token time over the mean of the one-token times taken just before
    and just after it, i.e. under the same load (the load of a shared machine drifts within
    a second; a ratio to a global one-token median would carry that drift)."""
    ones = [i for i, (k, _) in enumerate(samples) if k == 1]
    out: dict[int, list[float]] = {}
    for i, (k, t) in enumerate(samples):
        if k == 1 or not ones:
            continue
        before = [samples[j][1] for j in ones if j < i][-1:]
        after = [samples[j][1] for j in ones if j > i][:1]
        out.setdefault(k, []).append(t / statistics.mean(before + after))
    return out


def calibrate(target, ks=DEFAULT_KS, budget_s: float = 1.5, **kw) -> CostModel:
    """Measure c(k) on ``target``: median paired ratio per k, and the median one-token time."""
    samples, wall = measure(target, ks, budget_s, **kw)
    step = statistics.median(t for k, t in samples if k == 1)
    pts = [(k, statistics.median(r), len(r)) for k, r in paired_ratios(samples).items()]
    return CostModel.from_points(pts, step, kind="measured", calibration_s=wall,
                                 key=model_key(target),
                                 min_width=int(getattr(target, "min_width", 1) or 1))


def model_key(target) -> tuple:
    """What the cost curve depends on: model, device, dtype and torch's thread count."""
    return (str(target.name), str(target.device), str(target.dtype), torch.get_num_threads())


def cost_model_for(target, **kw) -> CostModel:
    """The process-wide cost model of ``target``: calibrated once per :func:`model_key`
    (flat, with no forward at all, when the target is not on a CPU)."""
    key = model_key(target)
    with _CACHE_LOCK:
        model = _CACHE.get(key)
        if model is None:
            if str(target.device).split(":")[0] != "cpu":
                model = CostModel.flat()
                model.key = key
            else:
                model = calibrate(target, **kw)
            _CACHE[key] = model
    return model


def cached_model(target) -> CostModel | None:
    """The cost model of ``target`` if one was made in this process (no calibration)."""
    with _CACHE_LOCK:
        return _CACHE.get(model_key(target))


def pin_model(target, model: CostModel) -> None:
    """Use ``model`` as the cost model of ``target`` in this process (e.g. a curve saved earlier,
    so offline replays of several drafters are judged on one clock)."""
    with _CACHE_LOCK:
        _CACHE[model_key(target)] = model


#: c(k) timed once with torch on 1 thread on a busy 2-core CPU (the ``cost="cpu"`` curve)
FIXED_CPU_CURVE = ((1, 1.0), (2, 1.08), (3, 1.3), (4, 1.6), (8, 2.1), (16, 2.6), (32, 3.4),
                   (64, 5.0), (257, 14.0))
COST_CHOICES = ("auto", "cpu", "flat")


def cost_curve(choice: str, target=None) -> CostModel:
    """The curve a drafter plans with: ``auto`` = :func:`cost_model_for` the target (measured,
    refined online; flat on an accelerator), ``flat`` = the accelerator curve, ``cpu`` = the
    fixed curve timed once on a busy 2-core CPU with torch on 1 thread (reproducible tables,
    deterministic tests; also the fallback without a real target)."""
    if choice == "flat":
        return CostModel.flat()
    if choice == "auto" and all(hasattr(target, a) for a in ("model", "name", "device")):
        return cost_model_for(target)
    return CostModel.from_points(FIXED_CPU_CURVE, kind="fixed", frozen=True)


def clear_cache() -> None:
    """Forget every cached cost model (tests; a changed machine)."""
    with _CACHE_LOCK:
        _CACHE.clear()
