"""DFlash training on stored rollouts (docs/methods/dflash.md) and a simulated-tau evaluation.

Per step: ``batch_size`` training rollouts, ``anchors_per_seq`` random anchors a in the reply
(a in [prompt_len-1, T-2], i.e. the last committed token of some decoding state). Each block is
[token a, MASK x (B-1)] at positions a..a+B-1 and sees the context features (the stored tapped
hidden states) of positions < a only: the per-layer context K/V of a sequence is computed ONCE and
every block of that sequence attends to its own prefix of it through a boolean mask. Slot k
(1..B-1) is trained with CE against token a+k (slots past the reply end are ignored), weighted
w_k = exp(-(k-1)/gamma), normalised over the valid slots of the batch. The target's embedding and
LM head are frozen; only the drafter's weights (incl. the learned mask embedding) train.
The softmax of a step runs over every word that occurs in a training reply plus ``negatives``
random other words (a sampled softmax: the 49k-word head is ~90 % of a CPU step otherwise); that
reply vocabulary is saved as the drafter's *draft vocabulary* (FR-Spec-style restriction of the
drafter's head, which also makes drafting cheaper; verification, hence losslessness, is
unaffected).
AdamW, linear warmup then cosine decay to 10 %, grad-norm clip 1.0.

Output folder: ``config.json`` + ``model.safetensors`` in the published layout
(:func:`~specviz.drafters.dflash.checkpoint.save_dflash_checkpoint`) and ``train_state.pt`` (float32
weights, optimizer, scheduler, step, RNG) for ``--resume``; ``train_log.jsonl`` records loss and
eval tau.

Eval: the exact simulated tau on the eval split (:mod:`.simulated_tau`). The batched block forward
lives in :mod:`..drafters.dflash.offline`, the schedule/order/log plumbing in :mod:`.loop`, the
run's set-up (data checks, fresh/continued/resumed drafter, draft vocabulary, optimizer) in
:mod:`.dflash_setup`.
"""
from __future__ import annotations

import copy
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ..drafters.dflash.model import DFlashDraftModel
from ..drafters.dflash.offline import anchor_hidden
from ..errors import SpecvizError
from .dflash_setup import (STATE_NAME, TrainConfig, draft_vocabulary, make_optimizer,
                           model_and_state, run_data)
from .loop import ShuffledOrder, append_log, step_bar
from .rollout_store import RolloutSet
from .simulated_tau import simulated_tau
from .train_data import TrainData


# --------------------------------------------------------------------------- the forward
def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for slots k = 1..B-1 (normalised over valid slots in the loss)."""
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1) / float(gamma))


def step_vocab(active: torch.Tensor, vocab_size: int, negatives: int,
               gen: torch.Generator) -> torch.Tensor:
    """The step's softmax support: ``active`` (every reply token) plus ``negatives`` ids drawn
    uniformly from the rest of the vocabulary, so unseen words are still pushed down."""
    if negatives <= 0 or active.numel() >= vocab_size:
        return active
    rest = torch.ones(vocab_size, dtype=torch.bool)
    rest[active] = False
    pool = rest.nonzero().view(-1)
    pick = pool[torch.randperm(pool.numel(), generator=gen)[:negatives]]
    return torch.cat([active, pick]).sort().values


def sequence_loss(model, target, tokens, hidden, prompt_len: int, n_anchors: int,
                  weights: torch.Tensor, rng: random.Random,
                  vocab: torch.Tensor | None = None,
                  vocab_weight: torch.Tensor | None = None,
                  greedy: torch.Tensor | None = None, soft=None, soft_weight: float = 0.0
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of w_k * CE over valid slots, sum of w_k over valid slots) for random anchors.

    Labels: a greedy rollout's own next tokens, or -- for a prefill-labelled text (``greedy`` =
    the target's greedy next token at every position) -- the exact-prefix labels of
    :func:`specviz.train.prefill.exact_prefix_labels` (later slots masked).
    ``vocab`` (sorted ids containing every label) restricts the softmax to those rows of the
    frozen LM head -- a sampled softmax: ~5x less work in the 49k-word head, which is 90 % of a
    CPU step. None = the full vocabulary. ``vocab_weight`` = ``head.weight[vocab]`` when the
    caller already gathered it (once per step, shared by the step's sequences).
    ``soft`` (the sequence's top-k, :mod:`.soft_labels`) with ``soft_weight`` lam > 0: each
    valid slot's loss is (1 - lam) * CE + lam * soft CE against the target's top-k."""
    from .prefill import block_labels

    anchors = _random_anchors(int(tokens.shape[0]), prompt_len, n_anchors, rng)
    if anchors is None:
        z = torch.zeros(())
        return z, z
    B = model.block_size
    labels, valid = block_labels(tokens, greedy, anchors, B)
    h = anchor_hidden(model, target, tokens, hidden, anchors)
    logits, labels, vocab = _slot_logits(target, h, labels, valid, vocab, vocab_weight)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                         reduction="none").view_as(valid)
    if soft is not None and soft_weight > 0:
        ce = _with_soft_labels(ce, logits, soft, anchors, B, vocab, soft_weight)
    w = weights.view(1, -1).expand_as(valid) * valid
    w = w.to(ce.device)
    return (ce * w).sum(), w.sum()


def _random_anchors(T: int, prompt_len: int, n_anchors: int, rng: random.Random
                    ) -> torch.Tensor | None:
    """Up to ``n_anchors`` sorted random anchors in [prompt_len-1, T-2] (None: no room)."""
    lo, hi = max(0, prompt_len - 1), T - 2
    if hi < lo:
        return None
    cand = list(range(lo, hi + 1))
    return torch.tensor(sorted(rng.sample(cand, min(n_anchors, len(cand)))))


def _slot_logits(target, h: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor,
                 vocab: torch.Tensor | None, vocab_weight: torch.Tensor | None):
    """(slot logits [K, B-1, V], labels on their device, ``vocab`` on the head's device) over
    the frozen LM head: every word, or the sampled softmax over the rows ``vocab`` (the labels
    become indices into it; a valid label outside it is an error)."""
    head = target.model.get_output_embeddings()
    if vocab is None:
        logits = head(h.to(head.weight.dtype)).float()                        # [K, B-1, V]
    else:
        vocab = vocab.to(head.weight.device)
        idx = torch.searchsorted(vocab, labels.to(vocab.device))
        ok = vocab[idx.clamp(max=vocab.numel() - 1)] == labels.to(vocab.device)
        if not bool(ok[valid.to(ok.device)].all()):
            raise SpecvizError("a label is missing from the training vocabulary")
        labels = idx.clamp(max=vocab.numel() - 1)
        if vocab_weight is None:
            vocab_weight = head.weight[vocab]
        logits = F.linear(h.to(head.weight.dtype), vocab_weight).float()
    return logits, labels.to(logits.device), vocab


def _with_soft_labels(ce, logits, soft, anchors, B: int, vocab, soft_weight: float):
    """Each slot's loss as (1 - lam) * CE + lam * soft CE against the target's top-k."""
    from .soft_labels import slot_soft_targets, soft_ce

    ids, p = slot_soft_targets(soft, anchors, B)
    return (1.0 - soft_weight) * ce + soft_weight * soft_ce(logits, ids, p, vocab)


# --------------------------------------------------------------------------- the loop
def save_run(model, opt, sched, step: int, cfg: TrainConfig, out: Path, rng: random.Random,
          meta: dict) -> None:
    from ..drafters.dflash.checkpoint import save_dflash_checkpoint

    m = model
    if cfg.save_dtype != "float32":
        m = copy.deepcopy(model).to(getattr(torch, cfg.save_dtype))
    m.config.setdefault("dflash_config", {})
    m.config["specviz_training"] = {"step": step, "rollouts_model": meta.get("model"),
                                    "block_size": cfg.block_size, "gamma": cfg.gamma}
    save_dflash_checkpoint(m, out)
    tmp = out / (STATE_NAME + ".tmp")
    torch.save({"step": step, "model": {k: v.detach().float().cpu() for k, v in model.state_dict().items()},
                "config": dict(model.config), "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(), "train_config": asdict(cfg),
                "rng": rng.getstate(), "draft_vocab": model.draft_vocab}, tmp)
    tmp.replace(out / STATE_NAME)


def _batch_loss(model, target, cfg: TrainConfig, batcher: ShuffledOrder,
                weights: torch.Tensor, vocab: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted loss sum, weight sum) over ``cfg.batch_size`` sequences of one step."""
    head = target.model.get_output_embeddings()
    vocab_weight = None if vocab is None else head.weight.detach()[vocab.to(head.weight.device)]
    dev = next(model.parameters()).device
    tot = torch.zeros((), device=dev)
    wsum = torch.zeros((), device=dev)
    for _ in range(cfg.batch_size):
        j = batcher.next()
        t, h, p = batcher.data.load(j)
        ls, ws = sequence_loss(model, target, t, h, p, cfg.anchors_per_seq, weights, batcher.rng,
                               vocab, vocab_weight, greedy=batcher.data.greedy(j),
                               soft=batcher.data.soft(j) if cfg.soft_weight > 0 else None,
                               soft_weight=cfg.soft_weight)
        tot, wsum = tot + ls.to(dev), wsum + ws.to(dev)
    return tot, wsum


def _step(model, target, cfg: TrainConfig, batcher: ShuffledOrder, weights: torch.Tensor,
          vocab: torch.Tensor | None, params, opt, sched) -> tuple[float, float] | None:
    """One optimizer step; (loss, grad norm before clipping), or None when no slot was valid."""
    opt.zero_grad(set_to_none=True)
    tot, wsum = _batch_loss(model, target, cfg, batcher, weights, vocab)
    if float(wsum) <= 0:
        return None
    loss = tot / wsum
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
    opt.step()
    sched.step()
    return float(loss.detach()), float(gn)


def _eval_record(model, target, eval_set: RolloutSet, cfg: TrainConfig, step: int):
    """(simulated-tau result, log record) on the eval split, or (None, None) when it is empty."""
    if not len(eval_set):
        return None, None
    res = simulated_tau(model, target, eval_set, limit=cfg.eval_rollouts)
    return res, {"step": step, "eval_tau": round(res["tau"], 4), "eval_rollouts": res["rollouts"]}


@dataclass
class _Run:
    """What the phases of :func:`train_dflash` share: the drafter, its optimizer, the run's RNG,
    folder and rollouts' meta, and what the run has recorded so far."""
    model: DFlashDraftModel
    params: list
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    rng: random.Random
    out: Path
    meta: dict
    start: int
    log: Callable[[dict], None] | None = None
    history: list = field(default_factory=list)
    last_eval: dict | None = None
    ema: float | None = None

    def emit(self, rec: dict, to_file: bool = True) -> None:
        """``rec`` to train_log.jsonl (``to_file``) and to the caller's ``log``."""
        if to_file:
            append_log(self.out, rec)
        if self.log:
            self.log(rec)


def train_dflash(target, rollouts_dir: str | Path, out: str | Path, cfg: TrainConfig,
                 resume: bool = False, show_bar: bool = False,
                 log: Callable[[dict], None] | None = None, prefill: list | tuple = ()) -> dict:
    """Train (or resume) a DFlash drafter for ``target`` on the train rollouts in
    ``rollouts_dir`` plus the prefill-labelled folders ``prefill``; eval on its eval split."""
    cfg.validate()
    meta, train_set, eval_set = run_data(target, rollouts_dir, prefill, cfg)
    run = _set_up(target, cfg, meta, Path(out), resume, log)
    active = draft_vocabulary(run.model, train_set, cfg)
    run.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    _step_loop(run, target, cfg, train_set, eval_set, active, show_bar)
    el = time.perf_counter() - t0
    _finish(run, target, cfg, eval_set)
    return _summary(run, cfg, el, train_set, eval_set, active)


def _set_up(target, cfg: TrainConfig, meta: dict, out: Path, resume: bool, log) -> _Run:
    """The run: its drafter (resumed or fresh) in float32 on the target's device, training, and
    its optimizer; refuses a target that is not float32 on CPU."""
    rng = random.Random(cfg.seed)
    model, st, start = model_and_state(target, cfg, meta, out, resume, rng)
    model = model.to(device=target.device, dtype=torch.float32).train().requires_grad_(True)
    head = target.model.get_output_embeddings()
    if head.weight.dtype != torch.float32 and str(target.device) == "cpu":
        raise SpecvizError("train the drafter with a float32 target on CPU")
    params, opt, sched = make_optimizer(model, cfg, st)
    return _Run(model, params, opt, sched, rng, out, meta, start, log)


def _step_loop(run: _Run, target, cfg: TrainConfig, train_set: TrainData, eval_set: RolloutSet,
               active: torch.Tensor | None, show_bar: bool) -> None:
    """The steps from ``run.start``, each over a fresh sampled softmax of ``active`` (when
    restricted); a step without a valid slot records, evaluates and saves nothing."""
    weights = slot_weights(cfg.block_size, cfg.gamma)
    vocab_size = int(target.model.get_output_embeddings().weight.shape[0])
    vgen = torch.Generator().manual_seed(cfg.seed + run.start)
    save_every = cfg.save_every or cfg.eval_every or cfg.steps
    bar = step_bar(show_bar, cfg.steps, "dflash", run.start)
    batcher = ShuffledOrder(train_set, run.rng)
    for step in range(run.start, cfg.steps):
        vocab = None if active is None else step_vocab(active, vocab_size, cfg.negatives, vgen)
        done_step = _step(run.model, target, cfg, batcher, weights, vocab, run.params, run.opt,
                          run.sched)
        if done_step is None:
            continue
        _record_step(run, bar, cfg, step + 1, *done_step)
        _eval_and_save(run, target, cfg, eval_set, step + 1, save_every)
    if bar is not None:
        bar.close()


def _record_step(run: _Run, bar, cfg: TrainConfig, step: int, lv: float, gn: float) -> None:
    """The step's loss in the history, its running mean on the bar, its record to ``log`` (and
    every 10th step's and the last's to train_log.jsonl)."""
    run.ema = lv if run.ema is None else 0.9 * run.ema + 0.1 * lv
    run.history.append(lv)
    if bar is not None:
        bar.update(1)
        bar.set_postfix_str(f"loss {run.ema:.3f}"
                            + (f" tau {run.last_eval['tau']:.2f}" if run.last_eval else ""))
    run.emit({"step": step, "loss": round(lv, 5), "lr": run.sched.get_last_lr()[0],
              "grad_norm": round(gn, 4)}, step % 10 == 0 or step == cfg.steps)


def _eval_and_save(run: _Run, target, cfg: TrainConfig, eval_set: RolloutSet, step: int,
                   save_every: int) -> None:
    """The simulated-tau eval every ``cfg.eval_every`` steps; the checkpoint and train state
    every ``save_every`` steps and at the last."""
    if cfg.eval_every and step % cfg.eval_every == 0:
        run.last_eval, rec = _eval_record(run.model, target, eval_set, cfg, step)
        if rec:
            run.emit(rec)
    if step % save_every == 0 or step == cfg.steps:
        save_run(run.model, run.opt, run.sched, step, cfg, run.out, run.rng, run.meta)


def _finish(run: _Run, target, cfg: TrainConfig, eval_set: RolloutSet) -> None:
    """The closing eval (unless the last step had one) and, when no step was left to run, the
    checkpoint."""
    if run.last_eval is None or (cfg.eval_every and cfg.steps % cfg.eval_every):
        res, rec = _eval_record(run.model, target, eval_set, cfg, cfg.steps)
        if rec:
            run.last_eval = res
            run.emit(rec)
    if cfg.steps - run.start <= 0:
        save_run(run.model, run.opt, run.sched, cfg.steps, cfg, run.out, run.rng, run.meta)


def _summary(run: _Run, cfg: TrainConfig, el: float, train_set: TrainData,
             eval_set: RolloutSet, active: torch.Tensor | None) -> dict:
    """The run's result: steps run and speed, losses, last eval, data and vocabulary sizes."""
    done = cfg.steps - run.start
    history = run.history
    return {"out": str(run.out), "steps": cfg.steps, "steps_run": done, "seconds": el,
            "steps_per_s": done / el if el > 0 and done else 0.0,
            "loss_first": history[0] if history else None,
            "loss_last": history[-1] if history else None, "losses": history,
            "eval": run.last_eval, "train_rollouts": len(train_set),
            "eval_rollouts": len(eval_set),
            "active_vocab": None if active is None else int(active.numel())}
