"""Training-loop plumbing shared by the DFlash, ReTrace and EDR trainers.

The learning-rate schedule (linear warmup, cosine decay to a floor), the epoch-wise shuffled
order of training sequences (its RNG is the run's, saved for ``--resume``), and the one JSON line
per record of a run's ``train_log.jsonl`` (read by the app and the tests), and the steps'
progress bar.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

LOG_NAME = "train_log.jsonl"


def lr_lambda(cfg):
    """LambdaLR factor at a step: linear warmup over ``cfg.warmup`` of ``cfg.steps``, then cosine
    decay to ``cfg.min_lr_ratio``."""
    warm = max(1, int(round(cfg.warmup * cfg.steps))) if cfg.warmup > 0 else 0

    def f(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        t = (step - warm) / max(1, cfg.steps - warm)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))
    return f


@dataclass
class ShuffledOrder:
    """Training sequences in a fresh shuffled order each epoch (``rng``: the run's, saved)."""

    data: "TrainData"
    rng: random.Random
    order: list[int] = field(default_factory=list)

    def next(self) -> int:
        if not self.order:
            self.order = list(range(len(self.data)))
            self.rng.shuffle(self.order)
        return self.order.pop()


def append_log(out: Path, rec: dict) -> None:
    """One JSON line in ``out``'s training log (``train_log.jsonl``, read by the app and tests)."""
    with open(out / LOG_NAME, "a") as fh:
        fh.write(json.dumps(rec) + "\n")


def step_bar(show: bool, total: int, desc: str, initial: int = 0):
    """A tqdm bar over a run's steps (None when not shown)."""
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="step")
