"""Fine-tuning a DFlash drafter to minimise expected decoding rounds (docs/methods/edr.md, EDR), or
with the block-local baselines, from the same initial weights for the same steps.

Per rollout y (a stored target rollout with its tapped features) and objective:

* ``edr``: the acceptance matrix a[n, t] of EVERY state n is computed once without grad;
  occupancies d and values V follow exactly (:mod:`specviz.analysis.edr`). ``num_starts``
  round starts are drawn with probability d[n] / sum(d) and recomputed WITH grad; the
  Horvitz-Thompson-weighted TD surrogate (:func:`specviz.train.objectives.round_terms`, weight
  sum(d) / num_starts) has the exact EDR gradient in expectation. The acceptance is
  - *sampled* (what the EDR paper trains with) on rollouts sampled at T > 0, which
    store the target's p(y_t): a[n, t] = min(1, q_T(y[n+t-1]) / p(y[n+t-1])) with q_T the
    drafter's softmax at the same temperature -- exactly the probability that slot t of a
    sampled speculative round was an accepted draft, given the target's token there was y
    (:func:`specviz.analysis.edr.sampled_acceptance`). Its gradient is the paper's
    coefficient a * 1[q < p] on grad log q(y), through autograd;
  - *relaxed* on greedy rollouts: a[n, t] = q(y[n+t-1]), a smooth stand-in for greedy
    acceptance (whose gradient is zero almost everywhere).
* ``decay_ce``: DFlash's slot-weighted CE (weights exp(-(k-1)/gamma), as
  :func:`specviz.train.dflash_train.sequence_loss`) at ``num_starts`` uniformly drawn states,
  over the same draft-vocabulary softmax (and temperature) as ``edr`` -- the block-local
  baseline.
* ``survival``: 1 - mean prefix survival at ``num_starts`` uniformly drawn states.

Eval: exact offline expected rounds on held-out rollouts (:mod:`specviz.analysis.offline_eval`),
greedy on greedy rollouts and sampled on sampled ones.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..analysis.edr import evaluate, greedy_acceptance, occupancy, values
from ..drafters.dflash.offline import (all_state_acceptance, dflash_state_drafts, sequence_context,
                                       state_acceptance, state_logprobs)
from ..errors import SettingsError, SpecvizError
from .dflash_train import save_run, slot_weights
from .loop import ShuffledOrder, append_log, lr_lambda, step_bar
from .objectives import check_objective, round_terms, survival_surrogate
from .rollout_store import RolloutSet



@dataclass
class EDRTrainConfig:
    objective: str = "edr"
    steps: int = 200
    batch_size: int = 4          # rollouts per step
    num_starts: int = 48         # round starts per rollout (sampled)
    lr: float = 1e-4
    warmup: float = 0.05
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    gamma: float = 4.0           # decay_ce slot weights
    head_lr_scale: float = 20.0  # lr multiplier of a DSpark Markov head (starts at zero)
    grad_clip: float = 1.0
    eval_every: int = 50
    eval_rollouts: int = 32
    seed: int = 0
    save_dtype: str = "bfloat16"
    block_size: int = 0          # for save_run's record (0 = the drafter's)
    num_layers: int = 0

    def validate(self) -> "EDRTrainConfig":
        check_objective(self.objective)
        if self.steps < 1 or self.batch_size < 1 or self.num_starts < 1:
            raise SettingsError("--steps, --batch-size and --num-starts must be at least 1")
        if not self.lr > 0:
            raise SettingsError("--lr must be > 0")
        return self


def edr_loss(model, target, tokens, hidden, prompt_len: int, num_starts: int,
             gen: torch.Generator, p_reply: torch.Tensor | None = None,
             temperature: float = 1.0) -> tuple[torch.Tensor, float]:
    """(TD surrogate with the exact EDR gradient in expectation, EDR of a) for one rollout;
    sampled acceptance when ``p_reply`` (the rollout's p(y_t)) is given."""
    T, P = int(tokens.shape[0]), int(prompt_len)
    ctx_kv = sequence_context(model, hidden, T)
    with torch.no_grad():
        a0 = all_state_acceptance(model, target, tokens, ctx_kv, P, p_reply, temperature)
        V, d = values(a0), occupancy(a0)
    idx = torch.multinomial(d.float(), num_starts, replacement=True, generator=gen)
    uniq, inv = idx.unique(return_inverse=True)
    rows = state_acceptance(model, target, tokens, ctx_kv, P, uniq, p_reply,
                            temperature).double()
    a = a0.index_put((uniq,), rows)
    g = round_terms(a, V)
    w = float(d.sum()) / num_starts
    return (w * g[uniq][inv]).sum(), float(V[0])


def objective_loss_for(cfg: EDRTrainConfig, model, target, tokens, hidden, prompt_len: int,
                       weights, rng: random.Random, gen: torch.Generator,
                       p_reply: torch.Tensor | None = None,
                       temperature: float = 1.0) -> torch.Tensor:
    """The loss of ``cfg.objective`` on one rollout (sampled acceptance with ``p_reply``)."""
    if cfg.objective == "edr":
        return edr_loss(model, target, tokens, hidden, prompt_len, cfg.num_starts, gen,
                        p_reply, temperature)[0]
    T, P = int(tokens.shape[0]), int(prompt_len)
    states = torch.tensor(sorted(rng.sample(range(T - P), min(cfg.num_starts, T - P))))
    ctx_kv = sequence_context(model, hidden, T)
    if cfg.objective == "decay_ce":   # DFlash's slot-weighted CE, same softmax support as edr
        lp, ok = state_logprobs(model, target, tokens, ctx_kv, P, states,
                                temperature if p_reply is not None else 1.0)
        w = weights.view(1, -1).to(lp.device) * ok
        return -(lp * w).sum() / w.sum().clamp_min(1e-9)
    return survival_surrogate(state_acceptance(model, target, tokens, ctx_kv, P, states,
                                               p_reply, temperature))


@torch.no_grad()
def offline_edr(model, target, rollouts: RolloutSet, limit: int) -> dict:
    """Exact expected rounds of the drafter on held-out rollouts: greedy acceptance on greedy
    rollouts, sampled acceptance (drafting at the rollouts' temperature) on sampled ones."""
    was = model.training
    model.eval()
    edr = toks = 0.0
    per = []
    for i in range(min(limit, len(rollouts))):
        t, h, p = rollouts.load(i)
        y = t[p:].tolist()
        if not y:
            continue
        pr = rollouts.target_p(i)
        if pr is None:
            a = greedy_acceptance(dflash_state_drafts(model, target, t, h, p), y)
        else:
            a = all_state_acceptance(model, target, t, sequence_context(model, h, t.shape[0]),
                                     p, pr, rollouts.temperature)
        r = evaluate(a)
        edr, toks = edr + r.edr, toks + len(y)
        per.append(r.edr)
    model.train(was)
    return {"expected_rounds": edr, "tokens": toks, "tau": toks / edr if edr else 0.0,
            "per_rollout": per}


@dataclass
class _Run:
    """What the phases of :func:`finetune` share: the drafter, its optimizer, the training
    rollouts in shuffled order and the run's random sources."""
    model: torch.nn.Module
    params: list
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    batcher: ShuffledOrder
    gen: torch.Generator
    weights: torch.Tensor


def finetune(target, model, rollouts_dir, eval_dir, out, cfg: EDRTrainConfig,
             show_bar: bool = False) -> dict:
    """Fine-tune ``model`` (a DFlashDraftModel, modified in place) with ``cfg.objective``."""
    cfg.validate()
    train, ev = _finetune_data(rollouts_dir, eval_dir)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    run = _set_up(model, train, cfg)
    bar = step_bar(show_bar, cfg.steps, f"finetune ({cfg.objective})")
    t0 = time.perf_counter()
    evals = [] if ev is None else [_eval_record(run, target, ev, cfg, 0, out)]
    hist = _step_loop(run, target, ev, cfg, out, bar, evals)
    if bar is not None:
        bar.close()
    acceptance = _save_run(run, train, cfg, out, evals)
    return {"out": str(out), "losses": hist, "evals": evals, "acceptance": acceptance,
            "seconds": time.perf_counter() - t0}


def _finetune_data(rollouts_dir, eval_dir) -> tuple[RolloutSet, RolloutSet | None]:
    """(train rollouts, eval split or None when absent or empty); an error without train
    rollouts."""
    train = RolloutSet(rollouts_dir, split="train")
    if not len(train):
        raise SpecvizError(f"{rollouts_dir} has no train rollouts")
    ev = RolloutSet(eval_dir, split="eval") if eval_dir else None
    return train, (ev if ev is not None and len(ev) else None)


def _optimizer(model, cfg: EDRTrainConfig):
    """(AdamW, LambdaLR); a new DSpark Markov head starts at zero: it gets a larger step
    (``cfg.head_lr_scale``) than the trained backbone."""
    head = [p for n, p in model.named_parameters() if n.startswith("markov_")]
    rest = [p for n, p in model.named_parameters() if not n.startswith("markov_")]
    groups = [{"params": rest}] + ([{"params": head, "lr": cfg.lr * cfg.head_lr_scale}]
                                   if head else [])
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))


def _set_up(model, train: RolloutSet, cfg: EDRTrainConfig) -> _Run:
    """The run: ``model`` in float32 training mode, its optimizer and random sources; records
    the drafter's block size and layer count in ``cfg`` (for the saved record)."""
    model = model.float().train().requires_grad_(True)
    params = [p for p in model.parameters() if p.requires_grad]
    opt, sched = _optimizer(model, cfg)
    rng, gen = random.Random(cfg.seed), torch.Generator().manual_seed(cfg.seed)
    weights = slot_weights(model.block_size, cfg.gamma)
    cfg.block_size, cfg.num_layers = int(model.block_size), len(model.layers)
    return _Run(model, params, opt, sched, ShuffledOrder(train, rng), gen, weights)


def _eval_record(run: _Run, target, ev: RolloutSet, cfg: EDRTrainConfig, step: int,
                 out: Path) -> dict:
    """The offline EDR eval at ``step`` (without the per-rollout list), logged."""
    rec = {"step": step, **{k: v for k, v in offline_edr(run.model, target, ev,
                                                          cfg.eval_rollouts).items()
                            if k != "per_rollout"}}
    append_log(out, rec)
    return rec


def _step_loop(run: _Run, target, ev: RolloutSet | None, cfg: EDRTrainConfig, out: Path, bar,
               evals: list) -> list:
    """The ``cfg.steps`` steps (their losses): the loss logged every 10 steps, the offline EDR
    evaluated every ``cfg.eval_every`` steps and at the last (appended to ``evals``)."""
    hist = []
    for step in range(cfg.steps):
        tot = _train_step(run, target, cfg)
        hist.append(tot)
        if bar is not None:
            bar.update(1)
        if (step + 1) % 10 == 0:
            append_log(out, {"step": step + 1, "loss": round(tot, 5)})
        if ev is not None and cfg.eval_every and \
                ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            evals.append(_eval_record(run, target, ev, cfg, step + 1, out))
            if bar is not None:
                bar.set_postfix_str(f"EDR {evals[-1]['expected_rounds']:.1f}")
    return hist


def _train_step(run: _Run, target, cfg: EDRTrainConfig) -> float:
    """One optimizer step over ``cfg.batch_size`` rollouts (grad norm clipped at
    ``cfg.grad_clip``); the step's loss."""
    run.opt.zero_grad(set_to_none=True)
    tot = 0.0
    for _ in range(cfg.batch_size):
        tot += _rollout_backward(run, target, cfg)
    torch.nn.utils.clip_grad_norm_(run.params, cfg.grad_clip)
    run.opt.step()
    run.sched.step()
    return tot


def _rollout_backward(run: _Run, target, cfg: EDRTrainConfig) -> float:
    """Backpropagate the next training rollout's loss / ``cfg.batch_size``; its value (0.0 for
    a rollout under 2 reply tokens, skipped)."""
    i = run.batcher.next()
    train = run.batcher.data
    t, h, p = train.load(i)
    if int(t.shape[0]) - p < 2:
        return 0.0
    loss = objective_loss_for(cfg, run.model, target, t, h, p, run.weights, run.batcher.rng,
                              run.gen, train.target_p(i), train.temperature) / cfg.batch_size
    loss.backward()
    return float(loss.detach())


def _save_run(run: _Run, train: RolloutSet, cfg: EDRTrainConfig, out: Path,
              evals: list) -> str:
    """The drafter (and its train state) in ``out`` and ``finetune.json`` (config, evals and
    the kind of acceptance trained on); that kind, described."""
    save_run(run.model, run.opt, run.sched, cfg.steps, cfg, out, run.batcher.rng,
          {"model": train.meta.get("model")})
    acceptance = (f"sampled (T={train.temperature:g})" if train.temperature > 0
                  else "relaxed q(y) on greedy rollouts")
    (out / "finetune.json").write_text(json.dumps({"config": asdict(cfg), "evals": evals,
                                                   "acceptance": acceptance},
                                                  indent=2) + "\n")
    return acceptance
