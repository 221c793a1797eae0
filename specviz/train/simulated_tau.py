"""Simulated tau: a drafter's exact greedy acceptance along stored rollouts (docs/methods/dflash.md,
docs/methods/adapld.md).

Along a fixed rollout, start at the reply's first position n = P, draft a block from context
< n-1 with anchor token n-1, accept the longest prefix equal to the rollout, jump to
n + accepted + 1. For rollouts that are the target's greedy replies this equals the tau of real
greedy speculative decoding with this drafter (same budget clipping as Session), with no target
forward: it is the held-out number every DFlash training run reports.
"""
from __future__ import annotations

import torch

from .rollout_store import RolloutSet


@torch.no_grad()
def simulated_tau_one(model, target, tokens: torch.Tensor, hidden: torch.Tensor,
                      prompt_len: int, block_size: int | None = None) -> tuple[int, int]:
    """(new tokens, rounds) of greedy speculative decoding replayed along one fixed rollout
    (:func:`specviz.analysis.replay.replay`: exact for greedy, no target forward)."""
    from ..analysis.replay import Rollout, replay
    from ..drafters.dflash.drafter import DFlashDrafter

    drafter = DFlashDrafter(target, model=model, block_size=block_size or None, cut="off",
                            tree=0)   # the chain's tau: what training improves
    rollout = Rollout(tokens.tolist(), int(prompt_len), hidden,
                      [i + 1 for i in model.target_layer_ids])
    trace = replay(drafter, rollout, target, eos_token_ids=set(), token_texts=False)
    return trace.new_tokens, trace.num_rounds


def simulated_tau(model, target, rollouts: RolloutSet, limit: int | None = None,
                  block_size: int | None = None) -> dict:
    """Mean tokens per round over (up to ``limit``) rollouts of ``rollouts``."""
    was = model.training
    model.eval()
    toks = rnds = 0
    per = []
    n = len(rollouts) if limit is None else min(limit, len(rollouts))
    for i in range(n):
        t, h, p = rollouts.load(i)
        a, r = simulated_tau_one(model, target, t, h, p, block_size)
        toks, rnds = toks + a, rnds + r
        per.append(a / r if r else 0.0)
    model.train(was)
    return {"tau": toks / rnds if rnds else 0.0, "rollouts": n, "tokens": toks, "rounds": rnds,
            "tau_mean_per_rollout": sum(per) / len(per) if per else 0.0}
