"""Fitting the forward gate's state probe (:mod:`specviz.drafters.dflash.state_probe`).

Examples are exact: for every state n of a greedy rollout (n reply tokens committed), the
features are the target's tapped hidden states at the position before the block's anchor (what
the live drafter has when it decides -- the anchor's own row is computed by the round's verify),
and the label is the accepted length of the drafter's whole greedy block at that state (offline
replay, :func:`specviz.drafters.dflash.offline.dflash_state_drafts`). The rollouts must come from
prompts the drafter was NOT trained on: on its training replies a drafter accepts more than it
ever will on new text, and the probe would learn that optimism.

Rollouts are split by prompt (seeded) into a fitting part and a held-out part; the report says
how well the probe ranks held-out states (Pearson r, and the accepted tokens the states it would
skip actually had).
"""
from __future__ import annotations

import random

import torch
from tqdm.auto import tqdm

from ..analysis.edr import greedy_acceptance
from ..drafters.dflash.offline import dflash_state_drafts
from ..drafters.dflash.state_probe import StateProbe, fit_state_probe, skip_threshold
from ..errors import SettingsError


def probe_examples(model, target, rollout_set, indices, block_size: int | None = None,
                   progress: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [N, F] float32, accepted length [N] float32) over the states of the rollouts
    ``indices`` of ``rollout_set`` (greedy rollouts only: the labels are exact there)."""
    if rollout_set.temperature > 0:
        raise SettingsError("the state probe is fitted on greedy rollouts (temperature 0): "
                            f"{rollout_set.folder} was sampled at T = {rollout_set.temperature}")
    k = (block_size or model.block_size) - 1
    xs, ys = [], []
    for i in tqdm(list(indices), desc="probe states", unit="rollout", disable=not progress):
        tokens, hidden, p = rollout_set.load(i)
        reply = tokens[p:].tolist()
        if not reply or p < 2:
            continue
        drafts = dflash_state_drafts(model, target, tokens, hidden, p, block_size)
        acc = greedy_acceptance(drafts, reply, K=k).cumprod(1).sum(1)
        xs.append(hidden[p - 2 + torch.arange(len(reply))].float())
        ys.append(acc.float())
    if not xs:
        raise SettingsError("no rollout with a reply and a prompt of 2+ tokens to fit the probe on")
    return torch.cat(xs), torch.cat(ys)


def split_rollouts(n: int, holdout: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """(fit, held-out) rollout indices, split by prompt with a seeded shuffle."""
    idx = list(range(n))
    random.Random(seed).shuffle(idx)
    cut = int(round(n * holdout))
    return sorted(idx[cut:]), sorted(idx[:cut])


def check_holdout(holdout: float) -> None:
    """One clear error for a held-out share outside (0, 1)."""
    if not 0.0 < holdout < 1.0:
        raise SettingsError(f"--holdout must be between 0 and 1 (exclusive), got {holdout}")


def measured_threshold(model, target, prompt_ids: list[int], tokens: int = 12) -> float:
    """The live skip threshold c(2) + d - 1 on this machine now: c(2) from the target's measured
    cost model, d the drafter's mean timed forward over a short real run on ``prompt_ids``, in
    one-token steps of the same model."""
    from ..costs import cost_curve
    from ..drafters.dflash.drafter import DFlashDrafter
    from ..engine import DecodeSettings, Session

    cost = cost_curve("auto", target)
    drafter = DFlashDrafter(target, model=model, cut="off", tree=0)
    rounds = Session(target, drafter, prompt_ids,
                     DecodeSettings(max_new_tokens=tokens)).run().rounds
    drafted = [r.t_draft for r in rounds if r.draft]   # (not a last round with no budget)
    d = sum(drafted) / max(1, len(drafted)) / max(1e-9, cost.step_time)
    return skip_threshold(cost.relative(2), d)


def probe_report(probe: StateProbe, x: torch.Tensor, y: torch.Tensor,
                 threshold: float) -> dict:
    """How the probe does on states it was not fitted on: Pearson r of predicted vs true
    accepted length, and at a skip threshold the share of states skipped, their mean true
    accepted length and that of the states kept."""
    pred = probe.predict(x)
    r = float(torch.corrcoef(torch.stack([pred, y.float()]))[0, 1]) if len(y) > 1 else 0.0
    skip = pred < threshold
    mean = (lambda t: round(float(t.mean()), 3) if t.numel() else None)
    return {"states": int(len(y)), "pearson_r": round(r, 3), "mean_accepted": mean(y),
            "threshold": threshold, "skipped": round(float(skip.float().mean()), 3),
            "accepted_when_skipped": mean(y[skip]), "accepted_when_kept": mean(y[~skip])}


def fit_gate_probe(model, target, rollout_sets, holdout: float = 0.2,
                   alphas: tuple[float, ...] = (100.0, 1000.0, 10000.0), seed: int = 0,
                   drafter_sha256: str = "", progress: bool = True) -> StateProbe:
    """Fit a state probe for the drafter ``model`` on greedy ``rollout_sets`` (prompts it was
    not trained on): examples from a per-prompt split, the ridge penalty chosen from ``alphas``
    by held-out Pearson r, then refitted on every example; the held-out report of the chosen
    penalty (skips counted at this machine's :func:`measured_threshold`) is kept in
    ``probe.report``."""
    check_holdout(holdout)
    fit_x, fit_y, ho_x, ho_y = [], [], [], []
    for rs in rollout_sets:
        fit, held = split_rollouts(len(rs), holdout, seed)
        for idx, xs, ys in ((fit, fit_x, fit_y), (held, ho_x, ho_y)):
            if idx:
                x, y = probe_examples(model, target, rs, idx, progress=progress)
                xs.append(x)
                ys.append(y)
    if not fit_x or not ho_x:
        raise SettingsError("the probe needs rollouts on both sides of the held-out split "
                            f"(holdout {holdout}): give more rollouts")
    layers = [int(i) for i in model.target_layer_ids]
    x, y, hx, hy = torch.cat(fit_x), torch.cat(fit_y), torch.cat(ho_x), torch.cat(ho_y)
    tokens, _, p = rollout_sets[0].load(0)
    threshold = measured_threshold(model, target, tokens[:p].tolist())
    reports = {a: probe_report(fit_state_probe(x, y, layers, a), hx, hy, threshold)
               for a in alphas}
    best = max(alphas, key=lambda a: reports[a]["pearson_r"])
    probe = fit_state_probe(torch.cat([x, hx]), torch.cat([y, hy]), layers, best, drafter_sha256)
    probe.report = {"alpha": best, "held_out": reports[best], "fit_states": int(len(y)),
                    "alphas": {str(a): reports[a]["pearson_r"] for a in alphas},
                    "rollouts": [str(rs.folder) for rs in rollout_sets]}
    return probe
