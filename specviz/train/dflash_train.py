"""DFlash training on stored rollouts (METHODS §1) and a simulated-tau evaluation.

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
(:func:`~specviz.drafters.dflash.save_dflash_checkpoint`) and ``train_state.pt`` (float32 weights,
optimizer, scheduler, step, RNG) for ``--resume``; ``train_log.jsonl`` records loss and eval tau.

Eval: the exact simulated tau on the eval split (:mod:`.simulated_tau`). The batched block
forward lives in :mod:`.block_forward`, the schedule/order/log plumbing in :mod:`.loop`.
"""
from __future__ import annotations

import copy
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ..drafters.dflash import MAX_BLOCK_SIZE, DFlashDraftModel, new_dflash_for_target
from ..errors import SettingsError, SpecvizError
from .block_forward import anchor_hidden
from .loop import ShuffledOrder, append_log, lr_lambda, step_bar
from .rollout_store import RolloutSet, read_meta
from .simulated_tau import simulated_tau
from .train_data import TrainData, reply_vocab

STATE_NAME = "train_state.pt"


@dataclass
class TrainConfig:
    block_size: int = 8
    num_layers: int = 2
    steps: int = 1000
    batch_size: int = 8            # rollouts per step
    anchors_per_seq: int = 16
    lr: float = 6e-4
    warmup: float = 0.04           # fraction of steps
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    gamma: float = 4.0
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_rollouts: int = 32
    save_every: int | None = None  # default: eval_every
    seed: int = 0
    intermediate_size: int | None = None
    save_dtype: str = "float32"
    init: str = "random"           # "random" | "target" (copy the target's top layers) | a
    #                                DFlash checkpoint folder to continue from (same shape)
    negatives: int = 4096          # sampled-softmax negatives per step; -1 = full vocabulary
    soft_weight: float = 0.0       # weight of the target's top-k soft labels (soft_labels.py)

    def validate(self) -> "TrainConfig":
        if not 2 <= int(self.block_size) <= MAX_BLOCK_SIZE:
            raise SettingsError(f"--block-size must be between 2 and {MAX_BLOCK_SIZE}")
        if self.num_layers < 1:
            raise SettingsError("--layers (drafter layers) must be at least 1")
        if self.steps < 1 or self.batch_size < 1 or self.anchors_per_seq < 1:
            raise SettingsError("--steps, --batch-size and --anchors-per-seq must be at least 1")
        if not self.lr > 0 or not 0 <= self.warmup < 1 or not self.gamma > 0:
            raise SettingsError("--lr and --gamma must be > 0 and --warmup in [0, 1)")
        if self.init not in ("random", "target") and not Path(self.init).is_dir():
            raise SettingsError("--init must be 'random', 'target' or a DFlash checkpoint folder "
                                f"(no folder {self.init})")
        if not 0.0 <= float(self.soft_weight) <= 1.0:
            raise SettingsError("--soft-weight must be between 0 (hard labels) and 1")
        if self.save_dtype not in ("float32", "bfloat16", "float16"):
            raise SettingsError("--save-dtype must be float32, bfloat16 or float16")
        return self


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
    from .soft_labels import slot_soft_targets, soft_ce

    T = int(tokens.shape[0])
    lo, hi = max(0, prompt_len - 1), T - 2
    if hi < lo:
        z = torch.zeros(())
        return z, z
    cand = list(range(lo, hi + 1))
    picks = sorted(rng.sample(cand, min(n_anchors, len(cand))))
    anchors = torch.tensor(picks)
    B = model.block_size
    labels, valid = block_labels(tokens, greedy, anchors, B)
    head = target.model.get_output_embeddings()
    h = anchor_hidden(model, target, tokens, hidden, anchors)
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
    labels = labels.to(logits.device)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                         reduction="none").view_as(valid)
    if soft is not None and soft_weight > 0:
        ids, p = slot_soft_targets(soft, anchors, B)
        ce = (1.0 - soft_weight) * ce + soft_weight * soft_ce(logits, ids, p, vocab)
    w = weights.view(1, -1).expand_as(valid) * valid
    w = w.to(ce.device)
    return (ce * w).sum(), w.sum()


# --------------------------------------------------------------------------- the loop
def _save(model, opt, sched, step: int, cfg: TrainConfig, out: Path, rng: random.Random,
          meta: dict) -> None:
    from ..drafters.dflash import save_dflash_checkpoint

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


def _continue_from(folder: str, fresh: DFlashDraftModel) -> DFlashDraftModel:
    """The weights of the checkpoint in ``folder`` (strict), which must have the run's shape."""
    from ..drafters.dflash import load_dflash_checkpoint

    old = load_dflash_checkpoint(folder)
    if (old.block_size, len(old.layers), old.target_layer_ids) != \
            (fresh.block_size, len(fresh.layers), fresh.target_layer_ids):
        raise SpecvizError(f"--init {folder} has block size {old.block_size}, {len(old.layers)} "
                           f"layers, target layers {old.target_layer_ids}; this run wants "
                           f"{fresh.block_size}, {len(fresh.layers)}, {fresh.target_layer_ids}")
    return old


def _check_rollouts(target, meta: dict, rollouts_dir, train_set: "TrainData") -> None:
    """Clear errors for an empty training set or rollouts made with another target."""
    if not len(train_set):
        raise SpecvizError(f"{rollouts_dir} has no train rollouts and no --prefill data given")
    tc = getattr(target.model.config, "text_config", None) or target.model.config
    if int(meta["hidden_size"]) != int(tc.hidden_size) or \
            int(meta["num_target_layers"]) != int(tc.num_hidden_layers):
        raise SpecvizError(f"the rollouts were made with another target ({meta.get('model')}): "
                           "hidden size / layer count differ")


def _resumed(state_path: Path, cfg: TrainConfig, out: Path, rng: random.Random
             ) -> tuple[DFlashDraftModel, dict, int]:
    """(model, saved state, step) of an interrupted run; ``rng`` gets its saved state."""
    st = torch.load(state_path, map_location="cpu", weights_only=False)
    model = DFlashDraftModel(st["config"])
    model.load_state_dict(st["model"], strict=True)
    old = st["train_config"]
    if int(old["block_size"]) != cfg.block_size or int(old["num_layers"]) != cfg.num_layers:
        raise SpecvizError(f"{out} was trained with block size {old['block_size']} and "
                           f"{old['num_layers']} layers; resume with the same settings")
    rng.setstate(st["rng"])
    model.draft_vocab = st.get("draft_vocab")
    if model.draft_vocab is None and Path(cfg.init).is_dir():
        # a state saved before it kept the draft vocabulary: a continued drafter's earlier
        # words come from the checkpoint it continued (else a resume would drop them)
        from ..drafters.dflash import load_dflash_checkpoint

        model.draft_vocab = load_dflash_checkpoint(cfg.init).draft_vocab
    return model, st, int(st["step"])


def _fresh(target, cfg: TrainConfig, meta: dict) -> DFlashDraftModel:
    """A new drafter for ``target``: random, from the target's top layers, or continued."""
    model = new_dflash_for_target(target, num_layers=cfg.num_layers, block_size=cfg.block_size,
                                  target_layer_ids=list(meta["target_layer_ids"]),
                                  intermediate_size=cfg.intermediate_size, seed=cfg.seed)
    if cfg.init == "target":
        from ..drafters.dflash import init_from_target

        init_from_target(model, target)
    elif cfg.init != "random":
        model = _continue_from(cfg.init, model)
    return model


def _draft_vocabulary(model: DFlashDraftModel, train_set: "TrainData", cfg: TrainConfig
                      ) -> torch.Tensor | None:
    """The words the drafter is trained on (every reply token, plus the words a continued
    drafter had); they become its draft vocabulary (saved with it, used at inference and by the
    tau estimate) -- words outside it are never proposed. None: full-vocabulary softmax."""
    active = reply_vocab(train_set) if cfg.negatives >= 0 else None
    prior = getattr(model, "draft_vocab", None)
    if active is not None and prior is not None:
        active = torch.unique(torch.cat([active, prior.to(active)]))
    model.draft_vocab = None if active is None else active.clone()
    return active


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


def _model_and_state(target, cfg: TrainConfig, meta: dict, out: Path, resume: bool,
                     rng: random.Random) -> tuple[DFlashDraftModel, dict | None, int]:
    """(model, saved state or None, first step): resumed, or fresh (refusing to overwrite)."""
    state_path = out / STATE_NAME
    if resume and state_path.is_file():
        return _resumed(state_path, cfg, out, rng)
    if state_path.is_file():
        raise SpecvizError(f"{out} already holds a training run: pass --resume or another --out")
    return _fresh(target, cfg, meta), None, 0


def _optimizer(model, cfg: TrainConfig, st: dict | None):
    """(trainable params, AdamW, LambdaLR), restored from a resumed state ``st``."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    if st is not None:
        opt.load_state_dict(st["optimizer"])
        sched.load_state_dict(st["scheduler"])
    return params, opt, sched


def _eval_record(model, target, eval_set: RolloutSet, cfg: TrainConfig, step: int):
    """(simulated-tau result, log record) on the eval split, or (None, None) when it is empty."""
    if not len(eval_set):
        return None, None
    res = simulated_tau(model, target, eval_set, limit=cfg.eval_rollouts)
    return res, {"step": step, "eval_tau": round(res["tau"], 4), "eval_rollouts": res["rollouts"]}


def train_dflash(target, rollouts_dir: str | Path, out: str | Path, cfg: TrainConfig,
                 resume: bool = False, show_bar: bool = False,
                 log: Callable[[dict], None] | None = None, prefill: list | tuple = ()) -> dict:
    """Train (or resume) a DFlash drafter for ``target`` on the train rollouts in
    ``rollouts_dir`` plus the prefill-labelled folders ``prefill``; eval on its eval split."""
    cfg.validate()
    meta, train_set, eval_set = _data(target, rollouts_dir, prefill, cfg)
    out = Path(out)
    rng = random.Random(cfg.seed)
    model, st, start = _model_and_state(target, cfg, meta, out, resume, rng)
    model = model.to(device=target.device, dtype=torch.float32).train().requires_grad_(True)
    head = target.model.get_output_embeddings()
    if head.weight.dtype != torch.float32 and str(target.device) == "cpu":
        raise SpecvizError("train the drafter with a float32 target on CPU")
    params, opt, sched = _optimizer(model, cfg, st)
    weights = slot_weights(cfg.block_size, cfg.gamma)
    active = _draft_vocabulary(model, train_set, cfg)
    vgen = torch.Generator().manual_seed(cfg.seed + start)
    save_every = cfg.save_every or cfg.eval_every or cfg.steps
    out.mkdir(parents=True, exist_ok=True)
    bar = step_bar(show_bar, cfg.steps, "dflash", start)
    history, last_eval, ema = [], None, None
    batcher = ShuffledOrder(train_set, rng)
    t0 = time.perf_counter()

    def emit(rec, to_file=True):
        if to_file:
            append_log(out, rec)
        if log:
            log(rec)

    for step in range(start, cfg.steps):
        vocab = None if active is None else step_vocab(active, int(head.weight.shape[0]),
                                                       cfg.negatives, vgen)
        done_step = _step(model, target, cfg, batcher, weights, vocab, params, opt, sched)
        if done_step is None:
            continue
        lv, gn = done_step
        ema = lv if ema is None else 0.9 * ema + 0.1 * lv
        history.append(lv)
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"loss {ema:.3f}"
                                + (f" tau {last_eval['tau']:.2f}" if last_eval else ""))
        emit({"step": step + 1, "loss": round(lv, 5), "lr": sched.get_last_lr()[0],
              "grad_norm": round(gn, 4)}, (step + 1) % 10 == 0 or step + 1 == cfg.steps)
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0:
            last_eval, rec = _eval_record(model, target, eval_set, cfg, step + 1)
            if rec:
                emit(rec)
        if (step + 1) % save_every == 0 or step + 1 == cfg.steps:
            _save(model, opt, sched, step + 1, cfg, out, rng, meta)
    if bar is not None:
        bar.close()
    el = time.perf_counter() - t0
    done = cfg.steps - start
    if last_eval is None or (cfg.eval_every and cfg.steps % cfg.eval_every):
        res, rec = _eval_record(model, target, eval_set, cfg, cfg.steps)
        if rec:
            last_eval = res
            emit(rec)
    if done <= 0:
        _save(model, opt, sched, cfg.steps, cfg, out, rng, meta)
    return {"out": str(out), "steps": cfg.steps, "steps_run": done, "seconds": el,
            "steps_per_s": done / el if el > 0 and done else 0.0,
            "loss_first": history[0] if history else None,
            "loss_last": history[-1] if history else None, "losses": history,
            "eval": last_eval, "train_rollouts": len(train_set), "eval_rollouts": len(eval_set),
            "active_vocab": None if active is None else int(active.numel())}


def _data(target, rollouts_dir, prefill, cfg: TrainConfig):
    """(meta, train data, eval split) of a run, checked against the target and the settings."""
    meta = read_meta(rollouts_dir)
    train_set = TrainData(rollouts_dir, prefill)
    if cfg.soft_weight > 0:
        train_set.check_soft()
    eval_set = RolloutSet(rollouts_dir, split="eval")
    _check_rollouts(target, meta, rollouts_dir, train_set)
    return meta, train_set, eval_set
