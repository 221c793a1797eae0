"""The set-up of a DFlash training run (:func:`specviz.train.dflash_train.train_dflash`).

Its data (the rollouts' meta, training sequences and eval split, checked against the target),
its drafter (fresh -- random, from the target's top layers or continued from a checkpoint -- or
resumed from ``train_state.pt``), the drafter's draft vocabulary and the optimizer.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..drafters.dflash import DFlashDraftModel, new_dflash_for_target
from ..errors import SpecvizError
from .loop import lr_lambda
from .rollout_store import RolloutSet, read_meta
from .train_data import TrainData, reply_vocab

if TYPE_CHECKING:
    from .dflash_train import TrainConfig

STATE_NAME = "train_state.pt"


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
