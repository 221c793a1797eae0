"""EDR's Markov reward process (specviz.analysis.edr): exact for deterministic greedy drafters
(== the rounds of a replayed run), inside the Monte Carlo interval for sampled acceptance."""
from __future__ import annotations

import random

import torch

from specviz.analysis.edr import (evaluate, greedy_acceptance, occupancy, sampled_acceptance,
                                  values)
from specviz.analysis.replay import replay
from specviz.drafters import make_drafter
from specviz.drafters.base import DraftContext

from conftest import repetitive_prompt
from test_replay import dflash_cases, rollout_of


def test_expected_rounds_equal_replayed_rounds_for_a_deterministic_drafter(tiny_target):
    rng = random.Random(2)
    for _ in range(8):
        ro = rollout_of(tiny_target, repetitive_prompt(rng, 64, rng.randint(20, 50)), 30)
        P, y = ro.prompt_len, ro.tokens[ro.prompt_len:]
        pld = make_drafter("pld", tiny_target)   # PLD is Markov in the state: stateless lookup
        pld.begin(tiny_target, ro.tokens[:P])
        drafts = [pld.propose(DraftContext(ro.tokens[:P + n], P, len(y) - n - 1, 0)).tokens
                  for n in range(len(y))]
        res = evaluate(greedy_acceptance(drafts, y, K=10))
        tr = replay(make_drafter("pld", tiny_target), ro, tiny_target)
        assert res.edr == tr.num_rounds and abs(res.mean_accepted_length - tr.tau) < 1e-12
        assert abs(float(res.occupancy.sum()) - res.edr) < 1e-9
        starts = {r.start - P for r in tr.rounds}  # deterministic: occupancy 1 where rounds start
        assert {n for n, x in enumerate(res.occupancy.tolist()) if x > 0.5} == starts


def test_state_drafts_make_edr_exact_for_pld_and_dflash(tiny_target):
    from specviz.analysis.edr import state_drafts
    from specviz.drafters.dflash.drafter import DFlashDrafter

    for model, ro in dflash_cases(tiny_target, 9, 4, 24):
        y = ro.tokens[ro.prompt_len:]
        for make in (lambda: make_drafter("pld", tiny_target),
                     lambda: DFlashDrafter(tiny_target, model=model, cut="off", tree=0)):
            res = evaluate(greedy_acceptance(state_drafts(make(), ro, tiny_target), y, K=10))
            assert res.edr == replay(make(), ro, tiny_target).num_rounds


def test_sampled_acceptance_matches_monte_carlo():
    g = torch.Generator().manual_seed(0)
    L, K = 40, 5
    a = torch.rand(L, K, generator=g, dtype=torch.float64) * 0.5 + 0.45
    V, d = values(a), occupancy(a)
    assert abs(float(d.sum()) - float(V[0])) < 1e-9 and d[0] == 1.0
    rng = random.Random(1)
    runs = []
    for _ in range(3000):
        n, rounds = 0, 0
        while n < L:
            j = 0
            while j < min(K, L - n - 1) and rng.random() < float(a[n, j]):
                j += 1
            n, rounds = n + j + 1, rounds + 1
        runs.append(rounds)
    mean = sum(runs) / len(runs)
    se = (sum((r - mean) ** 2 for r in runs) / (len(runs) - 1) / len(runs)) ** 0.5
    assert abs(mean - float(V[0])) < 4 * se, (mean, float(V[0]), se)


def test_position_acceptance_and_sampled_rule():
    a = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    res = evaluate(a)   # state 0 accepts 1 -> state 2, where the budget fits one slot: accepted
    assert res.edr == 2 and res.occupancy.tolist() == [1.0, 0.0, 1.0, 0.0]  # -> 4 = the end
    assert res.position_acceptance.tolist() == [1.0, 0.0]
    assert res.value.tolist() == [2.0, 2.0, 1.0, 1.0, 0.0] and res.mean_accepted_length == 2.0
    q, p = torch.tensor([0.2, 0.9]), torch.tensor([0.4, 0.3])
    assert sampled_acceptance(q, p).tolist() == [0.5, 1.0]
