"""The settings and set-up of a DFlash training run (:func:`.dflash_train.train_dflash`).

Its settings (:class:`TrainConfig`), its data (the rollouts' meta, training sequences and eval
split, checked against the target), its drafter (fresh -- random, from the target's top layers or
continued from a checkpoint -- or resumed from ``train_state.pt``), the drafter's draft vocabulary
and the optimizer.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from ..drafters.dflash.checkpoint import MAX_BLOCK_SIZE, new_dflash_for_target
from ..drafters.dflash.model import DFlashDraftModel
from ..errors import SettingsError, SpecvizError
from .loop import lr_lambda
from .rollout_store import RolloutSet, read_meta
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


def run_data(target, rollouts_dir, prefill, cfg: TrainConfig):
    """(meta, train data, eval split) of a run, checked against the target and the settings."""
    meta = read_meta(rollouts_dir)
    train_set = TrainData(rollouts_dir, prefill)
    if cfg.soft_weight > 0:
        train_set.check_soft()
    eval_set = RolloutSet(rollouts_dir, split="eval")
    _check_rollouts(target, meta, rollouts_dir, train_set)
    return meta, train_set, eval_set


def _check_rollouts(target, meta: dict, rollouts_dir, train_set: TrainData) -> None:
    """Clear errors for an empty training set or rollouts made with another target."""
    if not len(train_set):
        raise SpecvizError(f"{rollouts_dir} has no train rollouts and no --prefill data given")
    tc = target.text_config
    if int(meta["hidden_size"]) != int(tc.hidden_size) or \
            int(meta["num_target_layers"]) != int(tc.num_hidden_layers):
        raise SpecvizError(f"the rollouts were made with another target ({meta.get('model')}): "
                           "hidden size / layer count differ")


def model_and_state(target, cfg: TrainConfig, meta: dict, out: Path, resume: bool,
                    rng: random.Random) -> tuple[DFlashDraftModel, dict | None, int]:
    """(model, saved state or None, first step): resumed, or fresh (refusing to overwrite)."""
    state_path = out / STATE_NAME
    if resume and state_path.is_file():
        return _resumed(state_path, cfg, out, rng)
    if state_path.is_file():
        raise SpecvizError(f"{out} already holds a training run: pass --resume or another --out")
    return _fresh(target, cfg, meta), None, 0


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
        from ..drafters.dflash.checkpoint import load_dflash_checkpoint

        model.draft_vocab = load_dflash_checkpoint(cfg.init).draft_vocab
    return model, st, int(st["step"])


def _fresh(target, cfg: TrainConfig, meta: dict) -> DFlashDraftModel:
    """A new drafter for ``target``: random, from the target's top layers, or continued."""
    model = new_dflash_for_target(target, num_layers=cfg.num_layers, block_size=cfg.block_size,
                                  target_layer_ids=list(meta["target_layer_ids"]),
                                  intermediate_size=cfg.intermediate_size, seed=cfg.seed)
    if cfg.init == "target":
        from ..drafters.dflash.checkpoint import init_from_target

        init_from_target(model, target)
    elif cfg.init != "random":
        model = _continue_from(cfg.init, model)
    return model


def _continue_from(folder: str, fresh: DFlashDraftModel) -> DFlashDraftModel:
    """The weights of the checkpoint in ``folder`` (strict), which must have the run's shape."""
    from ..drafters.dflash.checkpoint import load_dflash_checkpoint

    old = load_dflash_checkpoint(folder)
    if (old.block_size, len(old.layers), old.target_layer_ids) != \
            (fresh.block_size, len(fresh.layers), fresh.target_layer_ids):
        raise SpecvizError(f"--init {folder} has block size {old.block_size}, {len(old.layers)} "
                           f"layers, target layers {old.target_layer_ids}; this run wants "
                           f"{fresh.block_size}, {len(fresh.layers)}, {fresh.target_layer_ids}")
    return old


def draft_vocabulary(model: DFlashDraftModel, train_set: TrainData, cfg: TrainConfig
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


def make_optimizer(model, cfg: TrainConfig, st: dict | None):
    """(trainable params, AdamW, LambdaLR), restored from a resumed state ``st``."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    if st is not None:
        opt.load_state_dict(st["optimizer"])
        sched.load_state_dict(st["scheduler"])
    return params, opt, sched
