"""EDR with sampled acceptance (docs/methods/edr.md, training at T > 0): sampled rollouts store the
target's p(y_t); the offline expected rounds with a[n, t] = min(1, q_T(y)/p(y)) agree with real
sampled speculative runs (Monte Carlo, paired); fine-tuning and the eval CLI use it."""
from __future__ import annotations

import json
import math

import pytest
import torch

from specviz.analysis.edr import evaluate
from specviz.analysis.offline_eval import offline_compare, parse_drafters, real_rounds
from specviz.bench import PromptItem
from specviz.drafters.dflash.checkpoint import new_dflash_for_target, save_dflash_checkpoint
from specviz.drafters.dflash.drafter import DFlashDrafter
from specviz.drafters.dflash.offline import sampled_state_acceptance
from specviz.engine import DecodeSettings, Session
from specviz.errors import SpecvizError
from specviz.train.rollout_store import RolloutSet
from specviz.train.rollouts import make_rollouts

T = 1.0


def _items(n: int):
    return [PromptItem(f"p{i}", "ab"[i % 2], " ".join(f"t{(i * 5 + j % 3) % 60 + 2}"
                                                       for j in range(6 + i % 3)), "x")
            for i in range(n)]


@pytest.fixture(scope="module")
def sampled(tmp_path_factory, tiny_target):
    d = tmp_path_factory.mktemp("sampled")
    make_rollouts(tiny_target, _items(8), d / "ro", max_new_tokens=16, layer_ids=[0, 1],
                  holdout=0.5, temperature=T, seed=3)
    model = new_dflash_for_target(tiny_target, num_layers=1, block_size=5, seed=3,
                                  target_layer_ids=[0, 1])
    save_dflash_checkpoint(model, d / "dd")
    return d, model


def _features(target, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(tapped hidden states of layers 0 and 1 [T, 2H], logits [T, V]) of one forward."""
    with torch.no_grad():
        out = target.model(torch.tensor([tokens]), output_hidden_states=True)
    return torch.cat([out.hidden_states[1][0], out.hidden_states[2][0]], -1), out.logits[0]


def test_sampled_rollouts_store_the_targets_p_of_each_token(sampled, tiny_target):
    d, _ = sampled
    rs = RolloutSet(d / "ro")
    assert rs.temperature == T and len(rs) == 8
    for i in range(len(rs)):
        t, _, p = rs.load(i)
        pr = rs.target_p(i)
        _, logits = _features(tiny_target, t.tolist())
        want = torch.softmax(logits[p - 1:-1].double() / T, -1).gather(
            -1, t[p:].view(-1, 1)).squeeze(-1)
        assert pr.shape == want.shape and torch.allclose(pr, want, atol=1e-4)


def test_greedy_rollouts_have_no_p_and_a_sampled_folder_without_p_is_named(tmp_path, tiny_target):
    make_rollouts(tiny_target, _items(2), tmp_path / "g", max_new_tokens=6, layer_ids=[0, 1])
    rs = RolloutSet(tmp_path / "g")
    assert rs.temperature == 0 and rs.target_p(0) is None
    meta = json.loads((tmp_path / "g" / "meta.json").read_text())
    meta["temperature"] = 0.7                 # claims sampling, stores no p(y)
    (tmp_path / "g" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SpecvizError, match="stores no target probabilities"):
        RolloutSet(tmp_path / "g").target_p(0)


def test_offline_sampled_rounds_agree_with_real_sampled_runs(sampled, tiny_target):
    """E[rounds of a real sampled run] = E_y[EDR(y)] with a = min(1, q_T(y)/p(y)): over 240
    real runs (temperature 1, the drafter sampling at 1), the paired difference between each
    run's rounds and the offline EDR of its own output is zero within 4 standard errors."""
    _, model = sampled
    prompt, L = [5, 9, 14, 5, 9], 14
    diffs, reals, offs = [], [], []
    for seed in range(240):
        dr = DFlashDrafter(tiny_target, model=model, cut="off", draft_temperature=T, seed=seed)
        tr = Session(tiny_target, dr, prompt,
                     DecodeSettings(max_new_tokens=L, temperature=T, seed=seed)).run()
        toks = prompt + tr.output_ids
        hid, logits = _features(tiny_target, toks)
        P = len(prompt)
        p_y = torch.softmax(logits[P - 1:-1].double() / T, -1).gather(
            -1, torch.tensor(tr.output_ids).view(-1, 1)).squeeze(-1)
        a = sampled_state_acceptance(model, tiny_target, torch.tensor(toks), hid, P, p_y, T)
        off = evaluate(a).edr
        diffs.append(tr.num_rounds - off)
        reals.append(tr.num_rounds)
        offs.append(off)
    n = len(diffs)
    mean = sum(diffs) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in diffs) / (n - 1) / n)
    assert 0 < se and abs(mean) < 4 * se, (mean, se)
    # the drafts are accepted often enough for the test to mean something
    assert sum(offs) / n < 0.95 * L
    assert min(reals) < L


def test_offline_compare_and_real_runs_on_sampled_rollouts(sampled, tiny_target):
    d, _ = sampled
    rs = RolloutSet(d / "ro", split="eval")
    specs = parse_drafters(f"pld,dflash:{d / 'dd'}")
    res = offline_compare(tiny_target, rs, specs)
    for row in res["rows"]:
        assert 1 <= row[f"edr:dflash:{d / 'dd'}"] <= row["tokens"]
    real = real_rounds(tiny_target, rs, specs, 2)
    for s in specs:
        assert real[s.label]["rollouts"] == 2 and len(real[s.label]["rounds"]) == 2


def test_finetune_on_sampled_rollouts_uses_sampled_acceptance(sampled, tiny_target, tmp_path):
    import copy

    from specviz.drafters.dflash.offline import sequence_context
    from specviz.drafters.dflash.offline import state_acceptance, state_logprobs
    from specviz.train.edr_train import EDRTrainConfig, edr_loss, finetune

    d, model = sampled
    rs = RolloutSet(d / "ro", split="train")
    t, h, p = rs.load(0)
    pr = rs.target_p(0)
    states = torch.arange(t.shape[0] - p)
    ctx = sequence_context(model, h, t.shape[0])
    a = state_acceptance(model, tiny_target, t, ctx, p, states, pr, T).double()
    lp, ok = state_logprobs(model, tiny_target, t, ctx, p, states, T)
    idx = states.view(-1, 1) + torch.arange(a.shape[1]).view(1, -1)
    pp = pr[idx.clamp(max=len(pr) - 1)]
    want = torch.where(ok, torch.minimum(torch.ones_like(pp), lp.exp().double() / pp),
                       torch.zeros_like(pp))
    assert torch.allclose(a, want, atol=1e-9)
    _, e = edr_loss(copy.deepcopy(model), tiny_target, t, h, p, 8, torch.Generator(), pr, T)
    assert abs(e - evaluate(a.detach()).edr) < 1e-6       # the logged value: sampled EDR
    cfg = EDRTrainConfig(objective="edr", steps=4, batch_size=2, num_starts=6, lr=3e-3,
                         eval_every=2, eval_rollouts=4)
    res = finetune(tiny_target, copy.deepcopy(model), d / "ro", d / "ro", tmp_path / "ft", cfg)
    assert res["acceptance"] == "sampled (T=1)"
    ev = RolloutSet(d / "ro", split="eval")
    want0 = sum(evaluate(sampled_state_acceptance(model, tiny_target, *ev.load(i),
                                                  ev.target_p(i), T)).edr
                for i in range(min(4, len(ev))))
    assert abs(res["evals"][0]["expected_rounds"] - want0) < 1e-6
    saved = json.loads((tmp_path / "ft" / "finetune.json").read_text())
    assert saved["acceptance"].startswith("sampled")
