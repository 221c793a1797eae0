"""Training objectives on EDR's acceptance matrix (specviz.train.objectives): the TD surrogate's
gradient is the exact gradient of the expected decoding rounds (autograd and finite
differences), its occupancy-subsampled Horvitz-Thompson form is unbiased, and it trains."""
from __future__ import annotations

import pytest
import torch

from specviz.analysis import edr
from specviz.drafters.dflash.offline import acceptance_from_probs
from specviz.errors import SettingsError
from specviz.train.objectives import (OBJECTIVES, edr_exact, objective_loss, survival_surrogate,
                                      td_surrogate)

L, K = 12, 5


def random_a(seed: int, L: int = L, K: int = K) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 0.05 + 0.9 * torch.rand(L, K, generator=g, dtype=torch.float64)


def grad_of(f, a: torch.Tensor) -> torch.Tensor:
    a = a.clone().requires_grad_(True)
    return torch.autograd.grad(f(a), a)[0]


def test_edr_exact_matches_the_evaluator_and_batches():
    a = torch.stack([random_a(s) for s in range(3)])
    v = edr_exact(a)
    assert v.shape == (3,)
    for i in range(3):
        assert abs(float(v[i]) - edr.evaluate(a[i]).edr) < 1e-12
        assert abs(float(v[i]) - float(edr.occupancy(a[i]).sum())) < 1e-12


def test_td_gradient_equals_autograd_of_exact_edr():
    for seed in range(3):
        a = random_a(seed)
        exact = grad_of(edr_exact, a)
        td = grad_of(td_surrogate, a)
        assert torch.allclose(td, exact, atol=1e-9, rtol=0)
        assert exact.abs().max() > 1e-3   # (signs vary: accepting more can cost rounds)
        assert abs(float(td_surrogate(a)) - float(edr_exact(a))) < 1e-12   # value = EDR
    a = torch.stack([random_a(s) for s in range(3)])                       # batched: sum
    assert torch.allclose(grad_of(td_surrogate, a), grad_of(lambda x: edr_exact(x).sum(), a),
                          atol=1e-9, rtol=0)


def test_td_gradient_equals_central_finite_differences():
    a, h = random_a(7), 1e-6
    td = grad_of(td_surrogate, a)
    for n, t in [(0, 0), (0, 4), (3, 2), (6, 1), (10, 0)]:
        e = torch.zeros_like(a)
        e[n, t] = h
        fd = (float(edr_exact(a + e)) - float(edr_exact(a - e))) / (2 * h)
        assert abs(float(td[n, t]) - fd) < 1e-7
    assert float(td[11, 0]) == 0.0 and float(td[8, 4]) == 0.0  # past the budget


def test_subsampled_gradient_is_unbiased():
    a, draws = random_a(3), 4000
    exact = grad_of(edr_exact, a)
    rep = a.repeat(draws, 1, 1).requires_grad_(True)       # one row per independent draw
    gen = torch.Generator().manual_seed(0)
    per = torch.autograd.grad(td_surrogate(rep, num_starts=2, generator=gen), rep)[0]
    mean, se = per.mean(0), per.std(0) / draws ** 0.5
    assert ((mean - exact).abs() <= 5 * se + 1e-12).all()
    assert (mean - exact).abs().max() < 0.1 * exact.abs().max()
    assert per.std(0).max() > 1e-3                          # it really is a random estimate
    g1 = grad_of(lambda x: td_surrogate(x, 3, torch.Generator().manual_seed(5)), a)
    g2 = grad_of(lambda x: td_surrogate(x, 3, torch.Generator().manual_seed(5)), a)
    assert torch.equal(g1, g2)


def test_td_surrogate_trains_a_tiny_drafter():
    torch.manual_seed(0)
    F_, V = 16, 8
    x = torch.randn(L, F_, dtype=torch.float64)
    y = torch.randint(0, V, (L + K,))
    slot_tok = y[torch.arange(L).view(L, 1) + torch.arange(K)]           # y[n + t - 1]
    lin = torch.nn.Linear(F_, K * V).double()
    opt = torch.optim.Adam(lin.parameters(), lr=0.05)

    def acceptance():
        q = lin(x).view(L, K, V).softmax(-1)
        return acceptance_from_probs(q.gather(-1, slot_tok.unsqueeze(-1)).squeeze(-1))

    with torch.no_grad():
        before = float(edr_exact(acceptance()))
    for _ in range(50):
        opt.zero_grad()
        td_surrogate(acceptance()).backward()
        opt.step()
    with torch.no_grad():
        after = float(edr_exact(acceptance()))
    assert after < before - 2.0 and after >= 1.0


def test_sampled_acceptance_is_min_one_q_over_p():
    q = torch.tensor([[0.2, 0.9], [0.5, 0.0]])
    p = torch.tensor([[0.4, 0.3], [0.5, 0.2]])
    assert torch.allclose(acceptance_from_probs(q, p), torch.tensor([[0.5, 1.0], [1.0, 0.0]]))
    assert torch.equal(acceptance_from_probs(q), q)


def test_survival_surrogate_in_unit_interval_and_decreasing_in_a():
    a = random_a(1)
    vals = [float(survival_surrogate(a * s)) for s in (0.0, 0.3, 0.7, 1.0)]
    assert all(0.0 <= v <= 1.0 for v in vals)
    assert all(x > y for x, y in zip(vals, vals[1:]))
    assert vals[0] == 1.0
    g = grad_of(survival_surrogate, a)
    assert (g[edr.budget_mask(L, K)] < 0).all()
    assert float(survival_surrogate(torch.ones(L, K))) > 0.0   # budget-masked slots count 0


def test_objective_registry_and_unknown_name():
    assert set(OBJECTIVES) == {"decay_ce", "edr", "survival"}
    a = random_a(2)
    assert abs(float(objective_loss("edr", a)) - float(edr_exact(a))) < 1e-12
    assert float(objective_loss("survival", a)) == float(survival_surrogate(a))
    with pytest.raises(SettingsError) as e:
        objective_loss("rounds", a)
    assert all(name in str(e.value) for name in OBJECTIVES)
    with pytest.raises(SettingsError):
        objective_loss("decay_ce", a)
    with pytest.raises(SettingsError):
        objective_loss("edr")


# ---------------------------------------------------------------- fine-tuning a DFlash drafter
def test_finetune_objectives_run_from_the_same_weights(tmp_path, tiny_target):
    import copy

    from specviz.bench import PromptItem
    from specviz.drafters.dflash.checkpoint import load_dflash_checkpoint, new_dflash_for_target
    from specviz.drafters.dflash.offline import sequence_context
    from specviz.drafters.dflash.offline import state_acceptance
    from specviz.train.edr_train import EDRTrainConfig, edr_loss, finetune
    from specviz.train.rollout_store import RolloutSet
    from specviz.train.rollouts import make_rollouts

    items = [PromptItem(f"p{i}", "c", " ".join(f"t{(i * 3 + j % 5) % 60 + 2}" for j in range(6)),
                        "x") for i in range(12)]
    make_rollouts(tiny_target, items, tmp_path / "ro", max_new_tokens=20, layer_ids=[0, 1],
                  holdout=0.25)
    init = new_dflash_for_target(tiny_target, num_layers=1, block_size=5, seed=1,
                                 target_layer_ids=[0, 1])
    rs = RolloutSet(tmp_path / "ro", split="train")
    t, h, p = rs.load(0)
    loss, e = edr_loss(copy.deepcopy(init), tiny_target, t, h, p, 16, torch.Generator())
    ctx = sequence_context(init, h, t.shape[0])
    a = state_acceptance(init, tiny_target, t, ctx, p, torch.arange(t.shape[0] - p)).double().detach()
    assert abs(e - float(edr_exact(a))) < 1e-6          # the logged value is the exact EDR
    results = {}
    for obj in ("edr", "decay_ce", "survival"):
        cfg = EDRTrainConfig(objective=obj, steps=12, batch_size=3, num_starts=8, lr=3e-3,
                             eval_every=6, eval_rollouts=4)
        res = finetune(tiny_target, copy.deepcopy(init), tmp_path / "ro", tmp_path / "ro",
                       tmp_path / obj, cfg)
        assert [x["step"] for x in res["evals"]] == [0, 6, 12]
        results[obj] = res
        assert load_dflash_checkpoint(tmp_path / obj).block_size == 5
    # same initial weights: the same step-0 evaluation for every objective
    assert len({r["evals"][0]["expected_rounds"] for r in results.values()}) == 1
