"""Training-loop plumbing shared by the DFlash, ReTrace and EDR trainers.

The learning-rate schedule (linear warmup, cosine decay to a floor), the epoch-wise shuffled
order of training sequences (its RNG is the run's, saved for ``--resume``), and the one JSON line
per record of a run's ``train_log.jsonl`` (read by the app and the tests), and the progress
bars of the trainers' steps and of the data makers' batches.
"""
from __future__ import annotations

import json
import math
import random
import time
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


def step_bar(show: bool, total: int, desc: str, initial: int = 0, unit: str = "step"):
    """A tqdm bar over a run's steps (or a data maker's prompts, texts, shards: ``unit``);
    None when not shown."""
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit)


def report_batch(bar, progress, step: int, n_done: int, total: int, tokens: int, t0: float,
                 rate_format: str = ".1f") -> None:
    """A data maker finished a batch of ``step`` items: advance the bar (showing tokens/s since
    ``t0``) and call ``progress(done, total, tokens)``."""
    if bar is not None:
        bar.update(step)
        rate = tokens / max(time.perf_counter() - t0, 1e-9)
        bar.set_postfix_str(f"{rate:{rate_format}} tok/s")
    if progress:
        progress(n_done, total, tokens)
