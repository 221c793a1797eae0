"""DSpark: DFlash plus a Markov head, the block drafted left to right (docs/methods/dspark.md).

DFlash drafts every slot of a block in parallel, so slot k cannot see what slot k-1 drafted:
two slots may each be plausible but not together ("the the"). DSpark adds to every slot's logits
a low-rank bias from the PREVIOUS token, W2 W1[x_{k-1}] (the "Markov head": W1 an embedding of
every target word into ``markov_rank`` dimensions, W2 a projection onto the draft vocabulary),
and drafts the block left to right: slot 1 is biased by the last committed token, slot k by the
token drafted at slot k-1. The drafter network still runs ONE forward per round; the chain only
adds a rank-r bias and an argmax per slot.

Conventions:

* weights: the DFlash layout plus ``markov_in.weight`` [V, r] and ``markov_out.weight`` [Vd, r]
  (``dflash_config.markov_rank`` = r; Vd = the draft vocabulary, or V without one). A new head
  (:func:`add_markov_head`) starts with W2 = 0, so an untrained DSpark drafts exactly what its
  DFlash backbone drafts; so does ``dspark`` given a plain DFlash checkpoint (no head).
* training and offline evaluation are teacher-forced: slot k's bias uses the rollout token
  y_{k-1}. Under greedy verification slot k only matters when slots 1..k-1 were accepted, i.e.
  when the drafted x_{k-1} equals y_{k-1}, so the teacher-forced acceptance (and the EDR of
  :mod:`specviz.analysis.edr`) is exact for the left-to-right drafter.
* sampling (``draft_temperature > 0``): each slot is sampled from softmax(logits_k / T) given the
  token sampled before it, and those rows are the draft's q -- standard autoregressive drafting,
  lossless under rejection sampling.

Bundled drafter: ``specviz/weights/dspark-smollm2-135m-instruct`` (the bundled DFlash drafter
with a rank-16 Markov head, fine-tuned with the EDR objective: docs/methods/dspark.md).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...errors import SettingsError
from ..registry import MethodSpec
from .checkpoint import bundled_checkpoint
from .drafter import DFlashDrafter
from .model import DFlashDraftModel
from .params import PARAMS

BUNDLED = {"SmolLM2-135M-Instruct": "dspark-smollm2-135m-instruct"}
DEFAULT_RANK = 16


@torch.no_grad()
def add_markov_head(model: DFlashDraftModel, rank: int = DEFAULT_RANK, seed: int = 0,
                    std: float = 1.0) -> DFlashDraftModel:
    """Give a DFlash drafter a Markov head in place: W1 a random unit-scale code per word, W2 = 0
    (drafts unchanged until trained; fine-tuning gives the head a larger step, EDRTrainConfig)."""
    if model.markov_rank:
        raise SettingsError(f"the drafter already has a Markov head (rank {model.markov_rank})")
    if not 1 <= int(rank) <= 256:
        raise SettingsError(f"--markov-rank must be from 1 to 256, got {rank}")
    dc = dict(model.config.get("dflash_config") or {})
    vd = int(model.draft_vocab.numel()) if model.draft_vocab is not None \
        else int(model.config["vocab_size"])
    dc["markov_rank"] = int(rank)
    dc["draft_vocab_size"] = vd
    model.config["dflash_config"] = dc
    model.markov_rank = int(rank)
    p = next(model.parameters())
    g = torch.Generator().manual_seed(int(seed))
    model.markov_in = torch.nn.Embedding(int(model.config["vocab_size"]), int(rank))
    model.markov_in.weight.copy_(torch.randn(model.markov_in.weight.shape, generator=g) * std)
    model.markov_out = torch.nn.Linear(int(rank), vd, bias=False)
    model.markov_out.weight.zero_()
    model.markov_in.to(device=p.device, dtype=p.dtype)
    model.markov_out.to(device=p.device, dtype=p.dtype)
    return model


def chain_scores(model: DFlashDraftModel, base: torch.Tensor, first_prev: int,
                 temperature: float = 0.0, generator: torch.Generator | None = None
                 ) -> tuple[torch.Tensor, list[int]]:
    """Left-to-right drafting over the draft vocabulary: ``base`` [k, Vd] slot scores without
    bias; returns (biased scores [k, Vd] float32, drafted word ids). Slot j is biased by the
    token before it (``first_prev`` for slot 1), then argmax'ed (or sampled at T > 0)."""
    dv = model.draft_vocab
    prev, rows, chain = int(first_prev), [], []
    for j in range(base.shape[0]):
        bias = model.markov_bias(torch.tensor(prev))
        row = base[j].float() + (0.0 if bias is None else bias.float().to(base.device))
        if temperature > 0:
            idx = int(torch.multinomial(torch.softmax(row / temperature, -1).cpu(), 1,
                                        generator=generator))
        else:
            idx = int(row.argmax())
        prev = int(dv[idx]) if dv is not None else idx
        rows.append(row)
        chain.append(prev)
    return torch.stack(rows) if rows else base.float(), chain


class DSparkDrafter(DFlashDrafter):
    """DFlash + Markov head, the block drafted left to right (module docstring)."""

    name = "dspark"
    chains = True

    def __init__(self, target=None, checkpoint: str | Path | None = None,
                 model: DFlashDraftModel | None = None, block_size: int | None = None,
                 draft_temperature: float = 0.0, seed: int = 0,
                 dtype: str | torch.dtype | None = None, device: str | None = None,
                 cut: str = "auto", weights: str = "float", gate_cost: str = "measured"):
        if target is not None and (checkpoint is None or not str(checkpoint).strip()) \
                and model is None:
            checkpoint = bundled_checkpoint(target, BUNDLED)
            if checkpoint is None:
                raise SettingsError("dspark needs a trained DSpark drafter for this target: pass "
                                    "checkpoint=PATH (train finetune --markov-rank R); only the "
                                    "embedded SmolLM2-135M-Instruct has a bundled one")
        super().__init__(target, checkpoint, model=model, block_size=block_size,
                         draft_temperature=draft_temperature, seed=seed, dtype=dtype,
                         device=device, cut=cut, weights=weights, gate_cost=gate_cost)

    def draft_logits(self, tokens: list[int], k: int) -> tuple[torch.Tensor, list[int] | None]:
        m = self.model
        head = self.target.model.get_output_embeddings()
        with self.target.lock, torch.inference_mode():
            base = m.draft_scores(self.block_hidden(tokens)[:k], head, None)
            rows, chain = chain_scores(m, base, tokens[-1], self.draft_temperature,
                                       self.generator)
        return m.full_vocab(rows, head.weight.shape[0]).cpu(), chain

    def config(self) -> dict[str, Any]:
        return {**super().config(), "markov_rank": int(self.model.markov_rank)}


SPECS = (MethodSpec("dspark", DSparkDrafter, "DSpark", "DSpark: DFlash + a low-rank "
                    "previous-token (Markov) head, block drafted left to right (bundled for "
                    "the embedded model)", kind="learned", needs_target=True,
                    params=tuple(p for p in PARAMS.values()
                                 if p.name not in ("tree", "state_probe"))),)
