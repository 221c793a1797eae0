"""Batch-invariant verification (docs/architecture.md, "Lossless"): the target's dtype on a CPU and
the forward width from which a row's logits no longer depend on how many rows the forward has.

Greedy speculative decoding is lossless only if the verify forward over [last, draft...] gives,
row for row, the logits plain decoding gives one token at a time. Kernels pick their algorithm
by the number of rows M (one row: matrix-vector; a few: one tiling; more: another), so a row's
logits can differ with M. In float32 the difference is ~1e-5 (a flip needs an exact near-tie);
in bfloat16 each layer's output is rounded to 8 mantissa bits and the difference reaches ~0.5
logits, so outputs diverge on most prompts. But from some width W on, the kernels keep one
tiling and a row's result is bit-identical for every M >= W -- for the matmuls; torch's fused
CPU attention is not, so :func:`invariant_attention` replaces it (measured with the embedded
SmolLM2: W = 2 on one 2-core AVX512-BF16 CPU, W = 1 -- no padding -- on another). So every
decoding forward is padded to at least W rows
(``Target.min_width``; the padding rows come after the real ones, no real row attends to them,
and their cache rows are dropped with the rejected ones). On such a CPU a bfloat16 forward over
4 tokens costs about what one over 1 token does (AVX512-BF16 dot products, half the weight
traffic), while float32 pays ~1.9x from one to two tokens: verifying a draft becomes nearly
free, and plain decoding itself gets faster.

Whether that holds is a property of the machine, so it is measured when the target is loaded
(:func:`choose_cpu_numerics`, ~1-2 s): W is the smallest width whose rows equal, bit for bit,
those of every wider forward tested (chain and tree-masked), checked again against sequential
padded one-token steps; bfloat16 is kept only if such a W exists and a padded bfloat16 step and
an 8-token verify are both faster than float32's. Otherwise the target stays float32 with W = 1.
Conventions: logits compared as float32 after the model's own dtype; widths count input tokens.
"""
from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, field

import torch

#: widths whose rows are compared (up to AdaPLD's 64-token copies plus the root)
CHECK_WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 24, 33, 64, 65)
MAX_MIN_WIDTH = 8           # a larger W would make plain steps too costly to be worth it
SEQ_STEPS = 17              # sequential padded steps the candidate W is checked against
CONTEXT = 24                # real tokens of context the check runs on
MAX_AUTO_PARAMS = 3e9       # above this the float32 copy for the check is not worth its memory


@dataclass
class Numerics:
    """What was chosen for a CPU target and why (shown on the decode page and in the CLI)."""

    dtype: str
    min_width: int
    reason: str
    times_ms: dict = field(default_factory=dict)   # "float32@1", "bfloat16@4", ...
    check_s: float = 0.0
    invariant: bool = True   # logits width-invariant from min_width on (1: at every width)

    def summary(self) -> str:
        t = ", ".join(f"{k} {v:.0f} ms" for k, v in self.times_ms.items())
        pad = f"forwards padded to {self.min_width} tokens" if self.min_width > 1 else "no padding"
        return f"{self.dtype}, {pad}: {self.reason}" + (f" ({t})" if t else "")


def invariant_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                        **kwargs):
    """Attention as plain matmuls + softmax (transformers' eager path) with boolean masks
    (True = attend), computed in float64 and returned in the model's dtype. Unlike the fused
    CPU kernel, its rows do not depend on the forward's width from W rows on (measured; see the
    module docstring)."""
    from transformers.models.llama.modeling_llama import repeat_kv

    k = repeat_kv(key, module.num_key_value_groups)
    v = repeat_kv(value, module.num_key_value_groups)
    # float64 throughout: a float32 softmax's sum and a matmul's reduction over the keys are
    # ordered by the row's length (vector body vs tail, blocking), and bfloat16 rounding turns
    # those ~1e-7 differences into flipped bits (measured on a CPU without AVX512-BF16: rows of
    # a wide forward differed from one-token steps at 55-62 and ~240 keys); in float64 they
    # stay far below bfloat16's rounding
    scores = torch.matmul(query.double(), k.double().transpose(2, 3)) * scaling
    q_len, kv_len = query.shape[-2], k.shape[-2]
    if attention_mask is None and q_len > 1 and getattr(module, "is_causal", True):
        # transformers skips the mask where SDPA's is_causal would do (e.g. a prefill):
        # query i sits at kv position kv_len - q_len + i
        attention_mask = torch.ones(q_len, kv_len, dtype=torch.bool,
                                    device=query.device).tril(kv_len - q_len)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:
            scores = scores + attention_mask
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v.double()).to(query.dtype)
    return out.transpose(1, 2).contiguous(), None


ATTENTION = "specviz_invariant"


def register_attention() -> str:
    """Register :func:`invariant_attention` with transformers (boolean masks, as for SDPA)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ATTENTION, invariant_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return ATTENTION


def _forward(model, cache, ids: list[int], mask=None, positions=None,
             keep: int = 0) -> torch.Tensor:
    """Logits of the last ``keep`` rows (0: every row; where the model can skip the others) of
    a forward over ``ids`` on ``cache``."""
    from .kvcache import accepts_logits_to_keep, cache_kwarg

    kw = {cache_kwarg(model): cache}
    if mask is not None:
        kw.update(attention_mask=mask, position_ids=positions)
    if keep and accepts_logits_to_keep(model):
        kw["logits_to_keep"] = keep
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), use_cache=True, **kw)
    return out.logits[0].float()


def padded(ids: list[int], width: int, pad_id: int = 0) -> list[int]:
    """``ids`` followed by ``pad_id`` up to ``width`` tokens (never cut)."""
    return list(ids) + [pad_id] * max(0, width - len(ids))


def pad_tree_inputs(mask: torch.Tensor, positions: torch.Tensor, width: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """A tree's 4D bool mask (1, 1, n, cache + n) and positions (1, n) grown to ``width`` rows:
    no real row sees a padding row; padding rows see everything before them."""
    n = mask.shape[-2]
    extra = width - n
    if extra <= 0:
        return mask, positions
    cache = mask.shape[-1] - n
    out = torch.zeros(1, 1, width, cache + width, dtype=torch.bool)
    out[..., :n, :cache + n] = mask
    out[..., n:, :] = torch.ones(extra, cache + width, dtype=torch.bool).tril(cache + n)
    last = positions.max()
    pos = torch.cat([positions, last + 1 + torch.arange(extra).unsqueeze(0)], dim=1)
    return out.to(mask.device), pos.to(positions.device)


def first_branch_only(tree, verdict):
    """Exactness guard for trees under width-invariant numerics. A node off the tree's first
    branch attends to its ancestors at scattered columns, so its logits (and its cache rows) are
    not bit-identical to plain decoding's, while the root's row and the first branch's rows are
    (node i with ancestors 0..i-1: its keys sit where a chain's would). When the accepted path
    leaves the first branch, the round keeps the path's part on the first branch and then the
    path's next token -- the target's token at the last exact row (in sampling distributed as
    p there, as a chain's correction would be) -- and stops: exactly what verifying the first
    branch alone as a chain would commit. The rest is drafted again next round."""
    from .verify import Verdict

    path = list(verdict.path)
    m = 0
    while m < len(path) and path[m] == m and tree.parents[m] == m - 1:
        m += 1
    if m == len(path):
        return verdict
    return Verdict(path=path[:m], token=int(tree.tokens[path[m]]))


def _context(model, tokens: list[int]):
    """A cache holding ``tokens`` (their logits are not needed: the LM head runs on one row)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    _forward(model, cache, tokens, keep=1)
    return cache


def _wide_rows(model, cache, probe: list[int], width: int) -> torch.Tensor:
    logits = _forward(model, cache, padded(probe, width)[:width])
    cache.crop(-width)
    return logits


def _tree_rows(model, cache, probe: list[int], width: int) -> torch.Tensor:
    """The same chain verified through the tree path (explicit 4D mask, explicit positions)."""
    from .tree import TokenTree

    n0 = int(cache.get_seq_length())
    tree = TokenTree.chain(probe[1:width])
    logits = _forward(model, cache, probe[:width], tree.attention_mask(n0), tree.position_ids(n0))
    cache.crop(-width)
    return logits


def _candidate_width(rows: dict[int, torch.Tensor]) -> int | None:
    """Smallest W whose first min(W, 3) rows equal those of every wider forward."""
    for w in sorted(rows):
        if w > MAX_MIN_WIDTH:
            break
        n = min(w, 3)
        if all(torch.equal(rows[m][:n], rows[w][:n]) for m in rows if m > w):
            return w
    return None


def invariant_width(model, tokens: list[int]) -> int | None:
    """The smallest forward width W from which logits are width-invariant on ``model`` (None:
    none up to ``MAX_MIN_WIDTH``): rows compared across :data:`CHECK_WIDTHS`, then the
    candidate's sequential padded one-token steps against one wide chain and one tree forward."""
    vocab = int(model.config.vocab_size)
    ctx = [t % vocab for t in tokens[:CONTEXT]]
    probe = [(t * 7 + 3) % vocab for t in tokens[:max(CHECK_WIDTHS)]]
    probe = padded(probe, max(CHECK_WIDTHS), 1)
    cache = _context(model, ctx)
    first = _candidate_width({m: _wide_rows(model, cache, probe, m) for m in CHECK_WIDTHS})
    if first is None:
        return None
    for w in range(first, MAX_MIN_WIDTH + 1):  # a row-0 candidate can still fail on later rows
        if _sequential_matches(model, cache, probe, w):
            return w
    return None


def _sequential_matches(model, cache, probe: list[int], w: int) -> bool:
    """Whether SEQ_STEPS one-token steps padded to ``w`` give, bit for bit, the rows of wide
    chain forwards and of a tree-masked forward over the same tokens."""
    steps = []
    for j in range(SEQ_STEPS):
        steps.append(_forward(model, cache, padded([probe[j]], w))[0])
        cache.crop(-(w - 1))
    cache.crop(-SEQ_STEPS)
    seq = torch.stack(steps)
    for m in (SEQ_STEPS, 33, 64):
        if not torch.equal(_wide_rows(model, cache, probe, m)[:SEQ_STEPS], seq):
            return False
    return torch.equal(_tree_rows(model, cache, probe, SEQ_STEPS + 3)[:SEQ_STEPS], seq)


def _timings(runs: dict[str, tuple], context: int = 128, repeats: int = 3,
             passes: int = 2) -> dict[str, float]:
    """Median ms per ``name -> (model, width)`` of a forward over ``width`` new tokens on a
    ``context``-token cache. Each entry runs as a block (two warm-up forwards, then
    ``repeats``), the blocks back to back with no pause, ``passes`` times. Not interleaved
    forward by forward and not after a rest: on a 2-core VM, alternating float32 and bfloat16
    forwards slowed bfloat16 2-3x, and so did the first forwards after 2 s idle."""
    caches, out = {}, {name: [] for name in runs}
    for model, _ in runs.values():   # one per model: every forward's rows are cropped again
        if id(model) not in caches:
            vocab = int(model.config.vocab_size)
            caches[id(model)] = _context(model, [(i * 31 + 7) % vocab for i in range(context)])
    for _ in range(passes):
        for name, (model, width) in runs.items():
            ids = [(i * 13 + 5) % int(model.config.vocab_size) for i in range(width)]
            for rep in range(repeats + 2):
                t0 = time.perf_counter()
                _forward(model, caches[id(model)], ids)
                if rep >= 2:
                    out[name].append(time.perf_counter() - t0)
                caches[id(model)].crop(-width)
    return {name: round(1000 * statistics.median(v), 1) for name, v in out.items()}


def prepare_bfloat16(model, tokens: list[int]) -> int | None:
    """Switch a bfloat16 CPU model to :func:`invariant_attention` and return its invariant
    width (None: none found; greedy outputs may then differ from plain decoding)."""
    model.set_attn_implementation(register_attention())
    return invariant_width(model, tokens)


def choose_cpu_numerics(model, tokens: list[int]) -> tuple[torch.nn.Module, Numerics]:
    """Measure float32 vs padded bfloat16 on this CPU and return (the model to use, why).
    ``model`` is float32; the bfloat16 candidate is a copy (the float32 weights survive when
    it loses). Timed first, unpadded: padding only adds rows, so where bfloat16 is not faster
    even without it the width check (the longer part) is skipped."""
    t0 = time.perf_counter()
    n_params = sum(p.numel() for p in model.parameters())
    if n_params > MAX_AUTO_PARAMS:
        return model, Numerics("float32", 1, "model too large to try bfloat16 next to it")
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    bf16.set_attn_implementation(register_attention())
    times = _timings({"bfloat16@1": (bf16, 1), "bfloat16@8": (bf16, 8),
                      "float32@1": (model, 1), "float32@8": (model, 8)})
    if not _bf16_faster(times, 1):
        return model, Numerics("float32", 1, "bfloat16 is not faster on this CPU", times,
                               time.perf_counter() - t0)
    w = invariant_width(bf16, tokens)
    if w is None:
        return model, Numerics("float32", 1, "bfloat16 logits depend on the forward width here",
                               times, time.perf_counter() - t0)
    if w > 1:
        times.update(_timings({f"bfloat16@{w}": (bf16, w), f"bfloat16@{max(8, w)}":
                               (bf16, max(8, w))}))
    took = time.perf_counter() - t0
    if not _bf16_faster(times, w):
        return model, Numerics("float32", 1, "bfloat16 is not faster on this CPU", times, took)
    return bf16, Numerics("bfloat16", w, f"measured faster, and width-invariant from {w} tokens",
                          times, took)


def _bf16_faster(times: dict[str, float], w: int) -> bool:
    """A plain step plus an 8-token verify (the mix a speculative run is made of), bfloat16
    padded to ``w`` against float32."""
    return times[f"bfloat16@{w}"] + times[f"bfloat16@{max(8, w)}"] < \
        times["float32@1"] + times["float32@8"]
