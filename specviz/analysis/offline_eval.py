"""Offline comparison of drafters on the SAME cached target rollouts (docs/methods/edr.md, EDR):
expected decoding rounds and mean accepted length per category, paired differences with bootstrap
confidence intervals -- no speculative decoding, no target forward.

Per rollout and drafter: the draft at every state n (:func:`state_drafts`; for DFlash all states
in a few batched drafter forwards, :func:`dflash_state_drafts`), greedy acceptance against the
rollout, and :func:`specviz.analysis.edr.evaluate`. On rollouts SAMPLED at T > 0 (which store
the target's p(y_t)) the block drafters draft at the same temperature and their acceptance is
the sampled one, a[n, t] = min(1, q_T(y) / p(y)) (:func:`sampled_state_acceptance`); a
deterministic drafter (PLD) keeps the 0/1 acceptance, which is what min(1, q/p) is for a
one-hot q. For drafters that are deterministic and
Markov in n (PLD, DFlash and DSpark with ``cut="off"``) the expected rounds equal the rounds of a real
greedy speculative run on the rollout's prompt exactly (tested; :func:`real_rounds` checks it on
a sample). Drafters with a memory of earlier rounds are refused: AdaPLD's statistics and the
cost-aware cut would be an approximation here, and ReTrace's memory needs the previous verify
pass (run the bench for those).

Drafter specs: ``METHOD`` or ``METHOD:CHECKPOINT`` (e.g. ``dflash:runs/dflash-b8``).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..drafters.dflash.offline import dflash_state_drafts, sampled_state_acceptance
from ..errors import SettingsError, SpecvizError
from .edr import evaluate, greedy_acceptance, state_drafts

MARKOV = {"pld": {}, "dflash": {"cut": "off", "tree": 0}, "dspark": {"cut": "off"}}
BLOCK_DRAFTERS = ("dflash", "dspark")   # drafts at all states in batched drafter forwards


@dataclass
class DrafterSpec:
    label: str
    method: str
    params: dict = field(default_factory=dict)


def at_temperature(method: str, params: dict, temperature: float) -> dict:
    """``params`` of a drafter evaluated at ``temperature``: a block drafter drafts at it too
    (sampled acceptance needs the drafter's q at the target's temperature)."""
    if temperature > 0 and method in BLOCK_DRAFTERS:
        return dict(params, draft_temperature=float(temperature))
    return dict(params)


def parse_drafters(spec: str) -> list[DrafterSpec]:
    """'pld,dflash:runs/x' -> specs; unknown or non-Markov methods raise a SettingsError."""
    out = []
    for part in [p.strip() for p in str(spec).split(",") if p.strip()]:
        method, _, ckpt = part.partition(":")
        method = method.strip().lower()
        if method not in MARKOV:
            raise SettingsError(f"eval supports the drafters that are Markov in the state "
                                f"({', '.join(MARKOV)}), not '{method}': its drafts depend on "
                                "earlier rounds (run `python -m specviz bench` for it)")
        params = dict(MARKOV[method])
        if ckpt:
            params["checkpoint"] = ckpt
        out.append(DrafterSpec(part, method, params))
    if len(out) < 1:
        raise SettingsError("--drafters is empty (e.g. --drafters pld,dflash)")
    if len({d.label for d in out}) != len(out):
        raise SettingsError("--drafters lists the same drafter twice")
    return out


# --------------------------------------------------------------------------- drafts per state
def check_rollouts(target, rollout_set, drafters: dict) -> None:
    """One clear error when the rollouts were made by another target or tapped other layers
    than a hidden-state drafter reads."""
    meta = rollout_set.meta
    tc = target.text_config
    want = {"hidden_size": int(tc.hidden_size), "num_target_layers": int(tc.num_hidden_layers),
            "vocab_size": int(target.model.get_input_embeddings().num_embeddings)}
    bad = [f"{k} {meta.get(k)} (rollouts) vs {v} (target)" for k, v in want.items()
           if meta.get(k) is not None and int(meta[k]) != v]
    if bad:
        raise SpecvizError(f"the rollouts in {rollout_set.folder} were made by another target "
                           f"or tokenizer ({meta.get('model')}): " + "; ".join(bad))
    for label, d in drafters.items():
        ids = getattr(getattr(d, "model", None), "target_layer_ids", None)
        if ids is not None and list(ids) != list(meta.get("target_layer_ids", [])):
            raise SpecvizError(f"{label} reads target layers {list(ids)} but the rollouts stored "
                               f"layers {meta.get('target_layer_ids')}: make rollouts with "
                               f"--layers {','.join(map(str, ids))}")


def acceptance_for(spec: DrafterSpec, drafter, target, rollout_set, i: int) -> torch.Tensor:
    """The acceptance matrix of a drafter on rollout ``i``: sampled for block drafters on
    sampled rollouts, else greedy (0/1) from its drafts at every state."""
    t, h, p = rollout_set.load(i)
    pr = rollout_set.target_p(i)
    if pr is not None and spec.method in BLOCK_DRAFTERS:
        return sampled_state_acceptance(drafter.model, target, t, h, p, pr,
                                        rollout_set.temperature, drafter.block_size)
    return greedy_acceptance(drafts_for(spec, drafter, target, rollout_set, i), t[p:].tolist())


def drafts_for(spec: DrafterSpec, drafter, target, rollout_set, i: int) -> list[list[int]]:
    """The drafts at every state of rollout ``i`` (batched for DFlash)."""
    t, h, p = rollout_set.load(i)
    if spec.method in BLOCK_DRAFTERS:
        return dflash_state_drafts(drafter.model, target, t, h, p, drafter.block_size)
    return state_drafts(drafter, rollout_set.rollout(i), target)


# --------------------------------------------------------------------------- statistics
def bootstrap_ci(values_a: list[float], values_b: list[float], tokens: list[int],
                 n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Paired bootstrap over rollouts: relative change of total expected rounds (B vs A) and
    the ratio of mean accepted lengths, with percentile intervals."""
    n = len(values_a)
    if n == 0:
        return {}
    rng = random.Random(seed)

    def stats(idx):
        ea, eb = sum(values_a[i] for i in idx), sum(values_b[i] for i in idx)
        toks = sum(tokens[i] for i in idx)
        return (eb - ea) / ea if ea else 0.0, (toks / eb) / (toks / ea) if ea and eb else 0.0

    point = stats(range(n))
    boots = [stats([rng.randrange(n) for _ in range(n)]) for _ in range(n_boot)]
    lo, hi = (1 - level) / 2, 1 - (1 - level) / 2

    def q(xs, f):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, max(0, int(round(f * (len(xs) - 1)))))]
    rel, ratio = [b[0] for b in boots], [b[1] for b in boots]
    return {"rounds_change": point[0], "rounds_change_ci": [q(rel, lo), q(rel, hi)],
            "tau_ratio": point[1], "tau_ratio_ci": [q(ratio, lo), q(ratio, hi)],
            "rollouts": n, "bootstrap": n_boot, "level": level}


def summarize(rows: list[dict], labels: list[str]) -> dict:
    """Per category (and 'all'): rollouts, tokens, expected rounds and tau per drafter; paired
    bootstrap of every drafter against the first."""
    cats = sorted({r["category"] for r in rows}) + ["all"]
    out = {}
    for c in cats:
        sub = [r for r in rows if c == "all" or r["category"] == c]
        toks = [r["tokens"] for r in sub]
        ent = {"rollouts": len(sub), "tokens": sum(toks), "drafters": {}}
        for lab in labels:
            e = sum(r[f"edr:{lab}"] for r in sub)
            ent["drafters"][lab] = {"expected_rounds": e, "tau": sum(toks) / e if e else 0.0}
        ent["paired"] = {f"{lab} vs {labels[0]}": bootstrap_ci(
            [r[f"edr:{labels[0]}"] for r in sub], [r[f"edr:{lab}"] for r in sub], toks)
            for lab in labels[1:]}
        out[c] = ent
    return out


# --------------------------------------------------------------------------- the comparison
def offline_compare(target, rollout_set, specs: list[DrafterSpec], limit: int | None = None,
                    progress: Callable[[int, int], None] | None = None) -> dict:
    """Expected rounds of every drafter on every rollout (same rollouts), with timings."""
    from ..drafters import make_drafter

    n = len(rollout_set) if limit is None else min(limit, len(rollout_set))
    if n == 0:
        raise SpecvizError("no rollouts to evaluate (empty folder or split)")
    T = rollout_set.temperature
    drafters = {s.label: make_drafter(s.method, target, **at_temperature(s.method, s.params, T))
                for s in specs}
    check_rollouts(target, rollout_set, drafters)
    rows, secs = [], {s.label: 0.0 for s in specs}
    for i in range(n):
        t, _, p = rollout_set.load(i)
        y = t[p:].tolist()
        if not y:
            continue
        row = {"key": rollout_set.rows[i].get("key"), "category": rollout_set.rows[i].get(
            "category", ""), "tokens": len(y), "prompt_len": p}
        for s in specs:
            t0 = time.perf_counter()
            res = evaluate(acceptance_for(s, drafters[s.label], target, rollout_set, i))
            secs[s.label] += time.perf_counter() - t0
            row[f"edr:{s.label}"] = res.edr
        rows.append(row)
        if progress:
            progress(i + 1, n)
    labels = [s.label for s in specs]
    return {"rows": rows, "summary": summarize(rows, labels), "seconds_offline": secs,
            "drafters": {s.label: {"method": s.method, "params": s.params} for s in specs}}


def real_rounds(target, rollout_set, specs: list[DrafterSpec], n: int) -> dict:
    """Real speculative runs of each drafter on the first ``n`` rollouts' prompts: rounds, wall
    seconds, and how many produced the rollout's text. Greedy rollouts: greedy runs, whose
    rounds must equal the offline expected rounds. Sampled rollouts: runs sampled at the
    rollouts' temperature (block drafters drafting at it too, seed = rollout index); each is a
    fresh random rollout, so only the means compare."""
    from ..drafters import make_drafter
    from ..engine import DecodeSettings, Session

    out = {}
    T = rollout_set.temperature
    for s in specs:
        secs, rounds = 0.0, []
        params = at_temperature(s.method, s.params, T)
        for i in range(min(n, len(rollout_set))):
            t, _, p = rollout_set.load(i)
            L = int(t.shape[0]) - p
            if L <= 0:
                continue
            t0 = time.perf_counter()
            tr = Session(target, make_drafter(s.method, target, **params), t[:p].tolist(),
                         DecodeSettings(max_new_tokens=L, temperature=T, seed=i)).run()
            secs += time.perf_counter() - t0
            rounds.append((tr.num_rounds, tr.output_ids == t[p:].tolist()))
        out[s.label] = {"rollouts": len(rounds), "seconds": secs,
                        "rounds": [r for r, _ in rounds],
                        "same_text": sum(ok for _, ok in rounds)}
    return out


# --------------------------------------------------------------------------- one prompt
@dataclass
class PromptMRP:
    """One prompt's rollout (greedy or sampled) and, per drafter, its acceptance matrix and
    MRP."""
    rollout: object                 # specviz.analysis.replay.Rollout
    acceptance: dict                # label -> a [L, K]
    results: dict                   # label -> MRPResult
    drafts: dict                    # label -> drafts per state


def prompt_mrp(target, prompt_ids: list[int], specs: list[DrafterSpec],
               max_new_tokens: int, temperature: float = 0.0, seed: int = 0) -> PromptMRP:
    """Generate the target's reply to ``prompt_ids`` (greedy, or sampled at ``temperature``
    with ``seed``; with the tapped features the hidden-state drafters need) and evaluate every
    drafter's MRP on it: greedy acceptance, or on a sampled reply the sampled acceptance
    min(1, q_T(y)/p(y)) of the block drafters drafting at that temperature."""
    from ..drafters import make_drafter
    from ..train.rollouts import generate_batch
    from .replay import Rollout

    drafters = {s.label: make_drafter(s.method, target, **s.params) for s in specs}
    layers = sorted({i for d in drafters.values()
                     for i in (getattr(getattr(d, "model", None), "target_layer_ids", None) or [])})
    res = generate_batch(target, [list(prompt_ids)], max_new_tokens, layers or [0],
                         store_dtype=torch.float32, temperature=temperature,
                         generator=torch.Generator().manual_seed(int(seed)))
    tokens = list(prompt_ids) + res.replies[0]
    P = len(prompt_ids)
    ro = Rollout(tokens, P, res.hidden[0], [i + 1 for i in (layers or [0])])
    y = tokens[P:]
    p_y = None if res.probs is None else torch.tensor(res.probs[0], dtype=torch.float64)
    acc, out, drafts = {}, {}, {}
    for s in specs:
        d = drafters[s.label]
        if s.method in BLOCK_DRAFTERS:
            H = res.hidden[0].shape[-1] // len(layers)
            cols = torch.cat([res.hidden[0][:, j * H:(j + 1) * H]
                              for j in [layers.index(i) for i in d.model.target_layer_ids]], -1)
            dr = dflash_state_drafts(d.model, target, torch.tensor(tokens), cols, P,
                                     d.block_size)
            if p_y is not None and y:
                acc[s.label] = sampled_state_acceptance(d.model, target, torch.tensor(tokens),
                                                        cols, P, p_y, temperature, d.block_size)
        else:
            dr = state_drafts(d, ro, target)
        if s.label not in acc:
            acc[s.label] = greedy_acceptance(dr, y, K=max([len(x) for x in dr] + [1]))
        out[s.label] = evaluate(acc[s.label])
        drafts[s.label] = dr
    return PromptMRP(ro, acc, out, drafts)
