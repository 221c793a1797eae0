"""ReTrace training (docs/methods/retrace.md): simulated consecutive rounds on stored target
sequences.

For a sequence (a greedy rollout, or a prefill-labelled text where the exact-prefix labels of
:mod:`specviz.train.prefill` say where it follows the target's greedy path) and anchors a:

1. round r: the frozen DFlash backbone drafts the block at a (argmax of each slot); greedy
   acceptance against the labels gives m accepted slots; slot m+1's label is the correction.
   Examples whose acceptance is undetermined (a label masked before the first mismatch), whose
   text leaves the greedy path before a+m+1, or without a rejected suffix (m+2 > B-1) are dropped.
2. the verify pass: one target forward over the drafted tokens d_{m+1} .. d_{B-2} on the cached
   target prefix (the sequence's KV cache cropped to a+m+1) gives the target's argmax at every
   rejected position exactly as the engine's verify pass would (``Round.target_argmax``);
   :func:`specviz.drafters.dflash.retrace.build_memory` turns it into the memory.
3. round r+1 at a' = a+m+1 with the fused memory; loss = decay-weighted CE on its slots against
   the exact labels. By default only the fusion trains (the backbone is frozen). With
   ``backbone_lr > 0`` the backbone is fine-tuned jointly (its block and context paths, at
   that learning rate) and saved inside the checkpoint (``backbone/``, config ``backbone:
   "included"``). Round 1 and the target run without gradients; the memory is detached.

The eval reports, on held-out sequences, round r+1's mean accepted length with the fusion and
with the gate off (= the backbone) on the same examples: exact for greedy decoding conditioned
on round r, no sampling.
"""
from __future__ import annotations

import copy
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..drafters.dflash.offline import block_embeddings, forward_blocks, sequence_context
from ..drafters.dflash.retrace import (INCLUDED, INCLUDED_BACKBONE, ReTraceFusion, build_memory,
                                       fuse, fusion_config, save_retrace)
from ..errors import SettingsError, SpecvizError
from .dflash_train import slot_weights
from .loop import ShuffledOrder, append_log, lr_lambda, step_bar
from .prefill import block_labels
from .rollout_store import RolloutSet
from .train_data import TrainData

BEST_DIR = "best"   # the best held-out checkpoint (early stopping)


@dataclass
class ReTraceTrainConfig:
    steps: int = 400
    batch_size: int = 4            # sequences per step
    anchors_per_seq: int = 12
    lr: float = 1e-3
    warmup: float = 0.05
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    gamma: float = 4.0
    eval_every: int = 100
    eval_sequences: int = 24
    seed: int = 0
    backbone_lr: float = 0.0       # > 0: fine-tune the DFlash backbone jointly at this lr

    def validate(self) -> "ReTraceTrainConfig":
        if self.steps < 1 or self.batch_size < 1 or self.anchors_per_seq < 1:
            raise SettingsError("--steps, --batch-size and --anchors-per-seq must be at least 1")
        if self.backbone_lr < 0:
            raise SettingsError("--backbone-lr must be >= 0 (0 = frozen backbone)")
        if not self.lr > 0 or not 0 <= self.warmup < 1 or not self.gamma > 0:
            raise SettingsError("--lr and --gamma must be > 0 and --warmup in [0, 1)")
        return self


@dataclass
class Examples:
    """Round-r+1 training examples of one sequence (everything detached)."""
    anchors2: torch.Tensor         # [E] a' = a + m + 1
    memory: list                   # RejectedMemory per example (positions absolute)
    labels2: torch.Tensor          # [E, B-1]
    valid2: torch.Tensor           # [E, B-1]
    ctx_kv: list                   # the sequence's drafter context K/V


@torch.no_grad()
def target_cache(target, tokens: torch.Tensor):
    """The target's KV cache over the whole sequence (one prefill forward)."""
    from ..kvcache import cache_kwarg
    from transformers import DynamicCache

    m = target.model
    cache = DynamicCache(config=m.config)
    m(input_ids=tokens.view(1, -1).to(target.device), use_cache=True, **{cache_kwarg(m): cache})
    return cache


@torch.no_grad()
def round_examples(model, target, tokens, hidden, greedy, prompt_len: int, n_anchors: int,
                   rng: random.Random, anchors: torch.Tensor | None = None) -> Examples | None:
    """Simulate round r at random anchors (or the given ones) and keep the examples that have a
    rejected suffix."""
    from ..kvcache import cache_kwarg, keep_rows

    T, B = int(tokens.shape[0]), model.block_size
    lo, hi = max(0, prompt_len - 1), T - 2
    if hi < lo:
        return None
    if anchors is None:
        anchors = torch.tensor(sorted(rng.sample(range(lo, hi + 1), min(n_anchors, hi - lo + 1))))
    ctx_kv = sequence_context(model, hidden, T)
    head = target.model.get_output_embeddings()
    h1 = forward_blocks(model, block_embeddings(model, target, tokens[anchors], B), anchors,
                        ctx_kv)[:, 1:]
    d1 = model.slot_argmax(h1, head).cpu()                                   # [K, B-1]
    lab1, val1 = block_labels(tokens, greedy, anchors, B)
    m = torch.cumprod(((d1 == lab1) & val1).long(), 1).sum(1)               # accepted
    keep = [j for j in range(len(anchors)) if int(m[j]) + 2 <= B - 1 and bool(val1[j, m[j] + 1])]
    if not keep:
        return None
    upto = max(int(anchors[j]) + int(m[j]) + 1 for j in keep)   # the furthest committed prefix
    cache = target_cache(target, tokens[:upto])
    emb = target.model.get_input_embeddings()
    a2, mems = [], []
    for j in keep:
        a, mj = int(anchors[j]), int(m[j])
        c = copy.deepcopy(cache)
        keep_rows(c, a + mj + 1, [])                            # tokens 0 .. a+m (committed)
        inp = d1[j, mj:B - 2].view(1, -1)                       # d_{m+1} .. d_{B-2}
        pos = torch.arange(a + mj + 1, a + mj + 1 + inp.shape[1]).view(1, -1)
        out = target.model(input_ids=inp.to(target.device), position_ids=pos.to(target.device),
                           use_cache=True, **{cache_kwarg(target.model): c})
        # target_argmax as the engine records it: row i predicts slot i+1's position
        tgt = lab1[j, :mj + 1].tolist() + out.logits[0].argmax(-1).tolist()
        mems.append(build_memory(h1[j], d1[j].tolist(), mj, tgt, a, emb))
        a2.append(a + mj + 1)
    a2t = torch.tensor(a2)
    lab2, val2 = block_labels(tokens, greedy, a2t, B)
    return Examples(a2t, mems, lab2, val2, ctx_kv)


def round2_logits(model, target, fusion, tokens, ex: Examples, gate_off: bool = False):
    """(slot logits [E, B-1, V], gates) of round r+1 with the fused memory."""
    B = model.block_size
    x = block_embeddings(model, target, tokens[ex.anchors2], B)
    rows, gates = [], []
    for e in range(len(ex.memory)):
        xe, info = fuse(x[e:e + 1], fusion, ex.memory[e], int(ex.anchors2[e]), gate_off)
        rows.append(xe)
        gates += info.get("gate", [])
    x = torch.cat(rows, 0)
    h = forward_blocks(model, x, ex.anchors2, ex.ctx_kv)[:, 1:]
    return model.slot_logits(h, target.model.get_output_embeddings()).float(), gates


def round2_loss(logits, ex: Examples, weights):
    """Decay-weighted CE over the valid, in-vocabulary labels; (sum, weight sum)."""
    lp = torch.log_softmax(logits, -1)
    ll = lp.gather(-1, ex.labels2.unsqueeze(-1).to(lp.device)).squeeze(-1)
    ok = ex.valid2.to(lp.device) & torch.isfinite(ll)
    w = weights.view(1, -1).to(lp.device) * ok
    return -(torch.where(ok, ll, torch.zeros_like(ll)) * w).sum(), w.sum()


def accepted2(logits, ex: Examples) -> torch.Tensor:
    """Greedy accepted length of each round-r+1 block (labels masked = stop)."""
    d = logits.argmax(-1).cpu()
    return torch.cumprod(((d == ex.labels2) & ex.valid2).long(), 1).sum(1)


@torch.no_grad()
def evaluate(model, target, fusion, data, n: int, seed: int = 0) -> dict:
    """Round r+1 accepted length with the fusion vs gate off, same examples."""
    rng = random.Random(seed)
    acc_f = acc_b = count = 0
    for i in range(min(n, len(data))):
        t, h, p = data.load(i)
        ex = round_examples(model, target, t, h, data.greedy(i), p, 12, rng)
        if ex is None:
            continue
        lf, _ = round2_logits(model, target, fusion, t, ex)
        lb, _ = round2_logits(model, target, fusion, t, ex, gate_off=True)
        acc_f += int(accepted2(lf, ex).sum())
        acc_b += int(accepted2(lb, ex).sum())
        count += len(ex.memory)
    return {"examples": count, "accepted_fused": acc_f / max(1, count),
            "accepted_backbone": acc_b / max(1, count)}


def save_checkpoint(fusion, model, conf: dict, out: Path, cfg: ReTraceTrainConfig, step: int):
    """The fusion (and, trained jointly, the fine-tuned backbone in ``out/backbone``)."""
    if cfg.backbone_lr > 0:
        from ..drafters.dflash.checkpoint import save_dflash_checkpoint

        save_dflash_checkpoint(copy.deepcopy(model).to(torch.bfloat16), out / INCLUDED_BACKBONE)
    save_retrace(fusion, conf, out, {"specviz_training": {"step": step, **asdict(cfg)}})


def _resume(state_path: Path, fusion: ReTraceFusion, model, opt, sched, rng: random.Random,
            joint: bool, best: dict) -> tuple[int, dict]:
    """(step, best held-out record) of an interrupted run, its weights and optimiser restored."""
    st = torch.load(state_path, map_location="cpu", weights_only=False)
    fusion.load_state_dict(st["fusion"])
    if joint:
        model.load_state_dict(st["backbone"])
    opt.load_state_dict(st["optimizer"])
    sched.load_state_dict(st["scheduler"])
    rng.setstate(st["rng"])
    return int(st["step"]), st.get("best", best)


def _batch_loss(model, target, fusion: ReTraceFusion, batcher: ShuffledOrder,
                cfg: ReTraceTrainConfig, weights: torch.Tensor, joint: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted loss sum, weight sum) of round r+1 over ``cfg.batch_size`` sequences."""
    tot = torch.zeros(())
    wsum = torch.zeros(())
    data = batcher.data
    for _ in range(cfg.batch_size):
        j = batcher.next()
        t, h, p = data.load(j)
        ex = round_examples(model, target, t, h, data.greedy(j), p, cfg.anchors_per_seq,
                            batcher.rng)
        if ex is None:
            continue
        if joint:   # the backbone's context path trains too: its K/V with grad
            ex.ctx_kv = sequence_context(model, h, int(t.shape[0]))
        logits, _ = round2_logits(model, target, fusion, t, ex)
        ls, ws = round2_loss(logits, ex, weights)
        tot, wsum = tot + ls, wsum + ws
    return tot, wsum


def _untrained_candidate(model, target, fusion, evd, cfg: ReTraceTrainConfig, conf: dict,
                         out: Path) -> dict:
    """Step 0 of early stopping: the untrained fusion (zero projections: exactly the backbone),
    evaluated and kept in out/best, so a run whose training never beats the backbone on the
    held-out rounds keeps a fusion that changes nothing rather than one that loses."""
    ev0 = evaluate(model, target, fusion, evd, cfg.eval_sequences)
    append_log(out, {"step": 0, **{k: round(v, 4) for k, v in ev0.items()}})
    save_checkpoint(fusion, model, conf, out / BEST_DIR, cfg, 0)
    return {"step": 0, "accepted_fused": ev0["accepted_fused"]}


@dataclass
class _Run:
    """What the phases of :func:`train_retrace` share: the models, the optimizer, the run's RNG
    and folder, and what the run has recorded so far."""
    model: torch.nn.Module
    fusion: ReTraceFusion
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    trained: list
    rng: random.Random
    joint: bool
    out: Path
    state_path: Path
    start: int = 0
    # the best held-out checkpoint (round r+1 accepted with the fusion) is kept in out/best:
    # early stopping, since the fusion can fit its training rounds and lose on unseen ones
    best: dict = field(default_factory=lambda: {"step": 0, "accepted_fused": float("-inf")})
    conf: dict | None = None
    hist: list = field(default_factory=list)
    last_eval: dict | None = None


def train_retrace(target, backbone_model, backbone: str, data_dirs: list, eval_dir, out,
                  cfg: ReTraceTrainConfig, resume: bool = False, show_bar: bool = False) -> dict:
    """Train (or resume) a ReTrace fusion on ``backbone_model`` (frozen, or fine-tuned jointly
    when ``cfg.backbone_lr > 0``)."""
    cfg.validate()
    data, evd = _retrace_data(data_dirs, eval_dir)
    run = _set_up(backbone_model, cfg, Path(out), resume)
    run.conf = fusion_config(run.fusion, run.model, INCLUDED if run.joint else backbone)
    if run.start == 0 and evd is not None and cfg.eval_every:
        run.best = _untrained_candidate(run.model, target, run.fusion, evd, cfg, run.conf,
                                        run.out)
    t0 = time.perf_counter()
    _step_loop(run, target, data, evd, cfg, show_bar)
    return _summary(run, cfg, data, time.perf_counter() - t0)


def _retrace_data(data_dirs: list, eval_dir) -> tuple[TrainData, RolloutSet | None]:
    """(training sequences of the --data folders, held-out eval split or None when absent or
    empty); clear errors for no folder or no sequences."""
    if not data_dirs:
        raise SettingsError("give at least one --data folder (rollouts or prefill)")
    data = TrainData(data_dirs[0], list(data_dirs[1:]))
    if not len(data):
        raise SpecvizError("no training sequences in the --data folders")
    ev = RolloutSet(eval_dir, split="eval") if eval_dir else None
    return data, (ev if ev is not None and len(ev) else None)


def _optimizer(fusion: ReTraceFusion, model, cfg: ReTraceTrainConfig, joint: bool):
    """(AdamW, LambdaLR, trained params): the fusion at ``cfg.lr``, and jointly the backbone at
    ``cfg.backbone_lr``."""
    groups = [{"params": list(fusion.parameters())}]
    if joint:
        groups.append({"params": list(model.parameters()), "lr": cfg.backbone_lr})
    opt = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    return opt, sched, [p for g in groups for p in g["params"]]


def _set_up(backbone_model, cfg: ReTraceTrainConfig, out: Path, resume: bool) -> _Run:
    """The run: the backbone (float32, eval mode, trainable only when joint), a new fusion and
    their optimizer, restored from ``out/train_state.pt`` on ``resume``; refuses to overwrite
    an earlier run otherwise. Creates ``out``."""
    joint = cfg.backbone_lr > 0
    model = backbone_model.float().eval().requires_grad_(joint)
    rng = random.Random(cfg.seed)
    state_path = out / "train_state.pt"
    fusion = ReTraceFusion(model.hidden_size)
    opt, sched, trained = _optimizer(fusion, model, cfg, joint)
    run = _Run(model, fusion, opt, sched, trained, rng, joint, out, state_path)
    if resume and state_path.is_file():
        run.start, run.best = _resume(state_path, fusion, model, opt, sched, rng, joint,
                                      run.best)
    elif state_path.is_file():
        raise SpecvizError(f"{out} already holds a training run: pass --resume or another --out")
    out.mkdir(parents=True, exist_ok=True)
    return run


def _step_loop(run: _Run, target, data: TrainData, evd, cfg: ReTraceTrainConfig,
               show_bar: bool) -> None:
    """The steps from ``run.start``: train, log the loss every 10 steps, evaluate every
    ``cfg.eval_every`` steps and at the last, checkpoint as often (50 without evals)."""
    weights = slot_weights(run.model.block_size, cfg.gamma)
    bar = step_bar(show_bar, cfg.steps, "retrace", run.start)
    batcher = ShuffledOrder(data, run.rng)
    for step in range(run.start, cfg.steps):
        n = step + 1
        _train_step(run, target, batcher, cfg, weights)
        _show_step(bar, run.hist)
        if n % 10 == 0 and run.hist:
            append_log(run.out, {"step": n, "loss": round(run.hist[-1], 5)})
        if evd is not None and cfg.eval_every and (n % cfg.eval_every == 0 or n == cfg.steps):
            _evaluate_and_keep_best(run, target, evd, cfg, n)
        if n % max(1, cfg.eval_every or 50) == 0 or n == cfg.steps:
            _save_run(run, cfg, n)
    if bar is not None:
        bar.close()


def _train_step(run: _Run, target, batcher: ShuffledOrder, cfg: ReTraceTrainConfig,
                weights: torch.Tensor) -> None:
    """One step: the batch's round-r+1 loss backpropagated (grad norm clipped at 1.0) and
    recorded when any slot was valid; the schedule advances either way."""
    tot, wsum = _batch_loss(run.model, target, run.fusion, batcher, cfg, weights, run.joint)
    if float(wsum) > 0:
        loss = tot / wsum
        run.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(run.trained, 1.0)
        run.opt.step()
        run.hist.append(float(loss.detach()))
    run.sched.step()


def _show_step(bar, hist: list) -> None:
    """Advance the bar (if shown) and show the mean of the last 20 losses."""
    if bar is None:
        return
    bar.update(1)
    if hist:
        bar.set_postfix_str(f"loss {sum(hist[-20:]) / len(hist[-20:]):.3f}")


def _evaluate_and_keep_best(run: _Run, target, evd, cfg: ReTraceTrainConfig, step: int) -> None:
    """The held-out eval, logged; a new best accepted length is saved to out/best."""
    run.last_eval = evaluate(run.model, target, run.fusion, evd, cfg.eval_sequences)
    append_log(run.out, {"step": step, **{k: round(v, 4) for k, v in run.last_eval.items()}})
    if run.last_eval["accepted_fused"] > run.best["accepted_fused"]:
        run.best = {"step": step, "accepted_fused": run.last_eval["accepted_fused"]}
        save_checkpoint(run.fusion, run.model, run.conf, run.out / BEST_DIR, cfg, step)


def _save_run(run: _Run, cfg: ReTraceTrainConfig, step: int) -> None:
    """The checkpoint in ``out`` and ``train_state.pt`` (weights, optimizer, schedule, RNG and
    best record) for ``--resume``."""
    save_checkpoint(run.fusion, run.model, run.conf, run.out, cfg, step)
    torch.save({"step": step, "fusion": run.fusion.state_dict(),
                "backbone": run.model.state_dict() if run.joint else None,
                "optimizer": run.opt.state_dict(), "scheduler": run.sched.state_dict(),
                "rng": run.rng.getstate(), "best": run.best}, run.state_path)


def _summary(run: _Run, cfg: ReTraceTrainConfig, data: TrainData, seconds: float) -> dict:
    """The run's result: steps run, time, losses, last eval and best held-out record."""
    return {"out": str(run.out), "steps_run": cfg.steps - run.start, "seconds": seconds,
            "losses": run.hist, "eval": run.last_eval, "train_sequences": len(data),
            "best": run.best if run.best["accepted_fused"] > float("-inf") else None}
