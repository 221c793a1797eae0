"""specviz.kernels: oneDNN packed linears, dispatched per row bucket where measured faster; the
same maths as the default kernel, safe fallbacks, and speculative decoding stays lossless."""
from __future__ import annotations

import copy
import random

import pytest
import torch
import torch.nn.functional as F

from specviz import kernels
from specviz.analysis.lossless import compare_outputs
from specviz.drafters.dflash.checkpoint import new_dflash_for_target
from specviz.drafters.dflash.drafter import DFlashDrafter
from specviz.engine import DecodeSettings, Session
from specviz.run import generate

from conftest import make_tiny_target, repetitive_prompt

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no oneDNN packed linear ops")


def _linear(seed=0, i=48, o=80):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(i, o)
    lin.requires_grad_(False)
    return lin


def test_packed_dispatch_gives_the_default_kernels_result_at_every_row_count():
    lin = _linear()
    kernels.install(lin, ["1", "2+"])
    with torch.inference_mode():
        for rows in (1, 2, 3, 8, 17, 64):
            x = torch.randn(1, rows, 48)
            assert torch.allclose(lin(x), F.linear(x, lin.weight, lin.bias), atol=1e-5)
    kernels.uninstall(lin)
    assert "forward" not in lin.__dict__ and lin not in kernels._PACKS


def test_only_the_buckets_that_gain_use_the_packed_kernel(monkeypatch):
    lin = _linear()
    kernels.install(lin, ["2+"])
    calls = []
    real = kernels.packed_linear
    monkeypatch.setattr(kernels, "packed_linear", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    with torch.inference_mode():
        lin(torch.randn(1, 1, 48))
        lin(torch.randn(1, 5, 48))
    assert calls == [5]                      # one row: the default kernel; five: packed
    t = {"plain@1": 1.0, "packed@1": 2.0, "plain@2": 2.0, "packed@2": 1.0, "plain@8": 3.0,
         "packed@8": 1.2}
    assert kernels.buckets_that_gain(t) == ["2+"]
    t.update({"packed@1": 0.5})
    assert kernels.buckets_that_gain(t) == ["1", "2+"]
    t.update({"packed@1": 0.99, "packed@2": 1.99, "packed@8": 2.99})   # < 5 % gain: not used
    assert kernels.buckets_that_gain(t) == []


def test_grad_a_changed_weight_and_a_deep_copy_fall_back_to_the_default_kernel():
    lin = _linear()
    kernels.install(lin, ["1", "2+"])
    x = torch.randn(4, 48, requires_grad=True)
    lin(x).sum().backward()                  # training: the default kernel, with gradients
    assert x.grad is not None
    with torch.no_grad():
        lin.weight.mul_(2.0)                 # the pack is stale now: never used again
    with torch.inference_mode():
        y = torch.randn(3, 48)
        assert torch.allclose(lin(y), F.linear(y, lin.weight, lin.bias), atol=1e-5)
    assert lin not in kernels._PACKS
    other = _linear(seed=1)
    kernels.install(other, ["1", "2+"])
    twin = copy.deepcopy(other)              # packed weights are opaque: not on the module
    with torch.no_grad():
        twin.weight.add_(1.0)
    with torch.inference_mode():
        y = torch.randn(3, 48)
        assert torch.allclose(twin(y), F.linear(y, twin.weight, twin.bias), atol=1e-5)


def _example(target):
    return lambda: target.model(input_ids=torch.tensor([[3, 4]]))


def test_one_traced_forward_finds_the_call_order_and_the_sibling_groups():
    target = make_tiny_target(seed=5)
    order, groups = kernels.call_order(target.model, _example(target))
    layers = target.model.model.layers
    assert order[0] is layers[0].self_attn.q_proj and order[-1] is target.model.lm_head
    want = [[l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj] for l in layers] + \
        [[l.mlp.gate_proj, l.mlp.up_proj] for l in layers]
    assert sorted(map(tuple, groups), key=lambda g: order.index(g[0])) == \
        sorted(map(tuple, want), key=lambda g: order.index(g[0]))
    assert kernels.call_order(target.model)[1] == []    # no forward to trace: no groups

    def broken():
        raise RuntimeError("this model needs other inputs")
    linears, groups = kernels.call_order(target.model, broken)
    assert groups == [] and set(linears) == set(order)  # a failing trace: module order, no groups


def test_fused_siblings_give_each_members_own_result_and_fall_back_when_they_must():
    target = make_tiny_target(seed=6)
    attn = target.model.model.layers[0].self_attn
    mods = [attn.q_proj, attn.k_proj, attn.v_proj]
    kernels.install_group(mods, ["1", "2+"])
    with torch.inference_mode():
        for rows in (1, 2, 5, 17):
            x = torch.randn(1, rows, 32)
            got = [m(x) for m in mods]                          # the leader computes all three
            assert all(torch.allclose(g, F.linear(x, m.weight), atol=1e-5)
                       for g, m in zip(got, mods))
        x, y = torch.randn(1, 3, 32), torch.randn(1, 3, 32)
        mods[0](x)
        assert torch.allclose(mods[1](y), F.linear(y, mods[1].weight), atol=1e-5)  # not x: own
    with torch.no_grad():
        attn.v_proj.weight.mul_(2.0)                            # stale pack: the group is dropped
    with torch.inference_mode():
        x = torch.randn(1, 4, 32)
        assert [torch.allclose(m(x), F.linear(x, m.weight), atol=1e-5) for m in mods] == [True] * 3
    assert not any(m in kernels._GROUPS for m in mods)
    kernels.uninstall(target.model)


def test_tuning_times_every_shape_and_group_in_forward_order_and_reports_what_it_chose():
    target = make_tiny_target(seed=5)
    choice = kernels.tune_linears(target.model, example=_example(target))
    shapes = {f"{m.out_features}x{m.in_features}" for m in target.model.modules()
              if isinstance(m, torch.nn.Linear)}
    assert set(choice.packed) == shapes
    assert set(choice.fused) == {"fused:32x32+16x32+16x32", "fused:64x32+64x32"}
    assert set(choice.times_ms) == shapes | set(choice.fused)
    assert all(set(choice.times_ms[s]) == {f"{k}@{r}" for k in ("plain", "packed")
                                           for r in (1, 2, 8)} for s in shapes)
    assert all(set(choice.times_ms[g]) == {f"{k}@{r}" for k in ("plain", "packed", "fused")
                                           for r in (1, 2, 8)} for g in choice.fused)
    installed = sum(1 for m in target.model.modules()
                    if m in kernels._PACKS or m in kernels._GROUPS)
    assert installed == choice.modules and isinstance(choice.summary(), str)
    assert choice.groups == sum(2 for b in choice.fused.values() if b)  # 2 layers per kind
    again = kernels.tune_linears(target.model, known=choice)   # all known: nothing timed again
    assert again.times_ms == choice.times_ms
    kernels.uninstall(target.model)


def test_speculative_decoding_on_packed_linears_is_lossless():
    """Every linear of a tiny target forced onto the packed kernel and every sibling group fused
    (both buckets): DFlash's
    greedy output equals plain decoding's on the same packed target, and on the default one."""
    target = make_tiny_target(seed=9)
    rng = random.Random(3)
    s = DecodeSettings(max_new_tokens=32)
    prompts = [repetitive_prompt(rng, 64, 24) for _ in range(4)]
    plain = [generate(target, "ar", ids, s).output_ids for ids in prompts]
    for m in target.model.modules():
        if isinstance(m, torch.nn.Linear):
            kernels.install(m, ["1", "2+"])
    for group in kernels.call_order(target.model, _example(target))[1]:
        kernels.install_group(group, ["1", "2+"])       # q/k/v and gate/up fused as well
    model = new_dflash_for_target(target, num_layers=1, block_size=6, seed=2)
    for ids, want in zip(prompts, plain):
        ar = generate(target, "ar", ids, s)
        tr = Session(target, DFlashDrafter(target, model=model, cut="off"), ids, s).run()
        assert compare_outputs(target, ids, ar.output_ids, tr.output_ids).ok
        assert compare_outputs(target, ids, want, ar.output_ids).ok
    kernels.uninstall(target.model)


def test_a_drafter_on_a_tuned_target_fuses_its_own_siblings_and_drafts_the_same_logits():
    """The DFlash drafter reuses the target's choice per shape / group: one traced block forward
    finds its q/k/v and gate/up (its context path calls k/v alone: they fall back), and its
    block logits equal the untuned drafter's."""
    from specviz.drafters.dflash.runtime import block_example

    target = make_tiny_target(seed=9)
    model = new_dflash_for_target(target, num_layers=2, block_size=6, seed=2)
    twin = copy.deepcopy(model)
    order, groups = kernels.call_order(model, block_example(model))
    assert len(groups) == 4                                  # 2 layers x (q/k/v, gate/up)
    all_on = ["1", "2+"]
    target.kernels = kernels.KernelChoice(
        times_ms={k: {} for k in {kernels.shape_key(m) for m in order} |
                  {kernels.group_key(g) for g in groups}},
        packed={kernels.shape_key(m): all_on for m in order},
        fused={kernels.group_key(g): all_on for g in groups})
    tuned = DFlashDrafter(target, model=model, cut="off")
    assert sum(1 for m in model.modules() if m in kernels._GROUPS) == 10
    target.kernels = None
    plain = DFlashDrafter(target, model=twin, cut="off")
    ids = list(range(2, 40))
    with torch.inference_mode():
        out = target.model(input_ids=torch.tensor([ids[:-1]]), output_hidden_states=True)
    for d in (tuned, plain):
        d.begin(target, ids, out.hidden_states)
    assert torch.allclose(tuned.block_logits(ids), plain.block_logits(ids), atol=1e-4)
    kernels.uninstall(model)
