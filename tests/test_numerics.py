"""Batch-invariant verification (specviz.numerics): the invariant attention computes what SDPA
computes; padded forwards, padded trees and the first-branch guard keep greedy decoding
lossless; on the embedded model in bfloat16 a width W is found and every method's greedy
output equals plain decoding's, token for token."""
import copy
import random

import pytest
import torch

from specviz.engine import DecodeSettings, Session
from specviz.numerics import (invariant_width, pad_tree_inputs, padded,
                              register_attention, first_branch_only)
from specviz.run import generate
from specviz.tree import TokenTree
from specviz.verify import Verdict

from conftest import make_tiny_target, repetitive_prompt
from test_engine import FixedTreeDrafter, hf_greedy


def _logits(model, ids, cache=None, **kw):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True,
                     **kw).logits[0]


def test_invariant_attention_computes_what_sdpa_computes():
    from transformers import DynamicCache

    ref = make_tiny_target(seed=5).model
    inv = copy.deepcopy(ref)
    inv.set_attn_implementation(register_attention())
    ids = list(range(3, 40))
    for m in (ref, inv):  # prefill (no mask: causal), a cached chain, a cached tree
        m._c = DynamicCache(config=m.config)
    outs = {}
    for name, m in (("ref", ref), ("inv", inv)):
        pre = _logits(m, ids[:20], m._c)
        step = _logits(m, ids[20:25], m._c)
        tree = TokenTree([7, 8, 9, 10], [-1, 0, -1, 2])
        n0 = m._c.get_seq_length()
        tr = _logits(m, [11] + tree.tokens, m._c, attention_mask=tree.attention_mask(n0),
                     position_ids=tree.position_ids(n0))
        outs[name] = (pre, step, tr)
    for a, b in zip(outs["ref"], outs["inv"]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    # the prefill is causal: the first row does not see the later tokens
    torch.testing.assert_close(outs["inv"][0][0], _logits(inv, ids[:1])[0], atol=1e-4, rtol=1e-4)


def test_pad_tree_inputs_hides_padding_from_real_rows():
    tree = TokenTree([5, 6, 7], [-1, -1, 0])
    mask, pos = tree.attention_mask(2), tree.position_ids(2)
    m2, p2 = pad_tree_inputs(mask, pos, 6)
    assert m2.shape == (1, 1, 6, 8) and p2.shape == (1, 6)
    assert torch.equal(m2[0, 0, :4, :6], mask[0, 0])       # real rows unchanged
    assert not m2[0, 0, :4, 6:].any()                        # ... and blind to padding
    assert m2[0, 0, 4, :7].all() and not m2[0, 0, 4, 7]      # padding: causal over everything
    assert p2[0].tolist() == [2, 3, 3, 4, 5, 6]
    assert pad_tree_inputs(mask, pos, 3)[0] is mask          # no padding needed
    assert padded([4, 5], 4) == [4, 5, 0, 0] and padded([4, 5, 6], 2) == [4, 5, 6]


def test_first_branch_only_keeps_the_exact_rows_of_a_path():
    tree = TokenTree.from_sequences([[4, 5], [6, 7, 8]])
    v = first_branch_only(tree, Verdict(path=[2, 3], token=9))
    assert v.path == [] and v.token == 6 and v.rows == [0]
    assert first_branch_only(tree, Verdict(path=[], token=9)).token == 9
    on_first = Verdict(path=[0, 1], token=9)
    assert first_branch_only(tree, on_first) is on_first
    # a path that follows the first branch, then leaves it: its first-branch part, then the
    # target's token at the last exact row (= the next path node's token), as a chain would
    tree = TokenTree.from_sequences([[4, 5, 6], [4, 7, 8]])   # nodes: 4 5 6 | 7 8 (7 under 4)
    v = first_branch_only(tree, Verdict(path=[0, 3, 4], token=9))
    assert v.path == [0] and v.token == 7 and v.rows == [0, 1]


class _Counting:
    """Records the width of every target forward."""

    def __init__(self, target, monkeypatch):
        self.widths = []
        orig = target.model.forward

        def fwd(*a, **kw):
            self.widths.append(kw["input_ids"].shape[1])
            return orig(*a, **kw)
        monkeypatch.setattr(target.model, "forward", fwd)


def test_padded_sessions_stay_lossless_and_cut_off_branch_paths(monkeypatch):
    target = make_tiny_target(seed=6)
    rng = random.Random(4)
    prompts = [repetitive_prompt(rng, 64, 24) for _ in range(6)]
    s = DecodeSettings(max_new_tokens=24)
    plain = {i: generate(target, "ar", p, s).output_ids for i, p in enumerate(prompts)}
    target.min_width = 4
    counter = _Counting(target, monkeypatch)
    cuts = 0
    for i, p in enumerate(prompts):
        truth = plain[i]
        assert generate(target, "ar", p, s).output_ids == truth
        assert generate(target, "pld", p, s).output_ids == truth

        def branches(toks, p=p):  # a wrong first branch, the true reply second
            done = len(toks) - len(p)
            return [[3, 3, 3], truth[done:done + 4]] if done < len(truth) else [[3]]
        sess = Session(target, FixedTreeDrafter(branches), p, s)
        tr = sess.run()
        assert tr.output_ids == truth
        cuts += sum(1 for r in tr.rounds if r.extras.get("path_cut"))
        assert all(r.accepted < r.extras["path_cut"] for r in tr.rounds if r.extras.get("path_cut"))
    decode_widths = [w for w in counter.widths if w <= 8]
    assert cuts > 10 and min(decode_widths) == 4  # every decoding forward was padded


@pytest.fixture(scope="module")
def bf16_target():
    from specviz.models import load_target

    t = load_target("default", dtype="bfloat16")
    if not t.numerics.invariant:
        pytest.skip(f"no width-invariant bfloat16 on this CPU: {t.numerics.reason}")
    return t


def test_bfloat16_target_is_width_invariant(bf16_target):
    from specviz.models import check_tokens

    assert bf16_target.dtype == torch.bfloat16
    assert bf16_target.model.config._attn_implementation == "specviz_invariant"
    assert invariant_width(bf16_target.model, check_tokens(bf16_target.tokenizer)) == \
        bf16_target.min_width


@pytest.mark.parametrize("per_category", [
    pytest.param(1, id="5-prompts"), pytest.param(4, id="20-prompts", marks=pytest.mark.slow)])
def test_bfloat16_greedy_identical_for_every_method(bf16_target, per_category):
    """Token for token, no near-tie allowance: example prompts of five kinds, one of each by
    default, four with -m slow (PLD, AdaPLD -- chains here, as only a first branch counts under
    padding; DFlash on every other one)."""
    from conftest import example_prompts

    prompts = [r["prompt"] for r in example_prompts(per_category)]
    assert len(prompts) == 5 * per_category
    s = DecodeSettings(max_new_tokens=24)
    for i, p in enumerate(prompts):
        ar = generate(bf16_target, "ar", p, s).output_ids
        for m in ("pld", "adapld") + (("dflash",) if i % 2 == 0 else ()):
            assert generate(bf16_target, m, p, s).output_ids == ar, f"{m} on prompt {i}"


def test_tiny_hf_generate_unchanged_by_registration():
    register_attention()  # registering must not change any other model's attention
    t = make_tiny_target(seed=7)
    assert t.model.config._attn_implementation != "specviz_invariant"
    ids = [5, 9, 12]
    assert generate(t, "ar", ids, DecodeSettings(max_new_tokens=8)).output_ids == \
        hf_greedy(t, ids, 8)


def test_auto_choice_returns_a_consistent_model(embedded_target):
    """The measured choice on this CPU: float32 with no padding, or a bfloat16 copy with its
    invariant width, its timings recorded; the float32 weights are untouched."""
    from specviz.models import check_tokens
    from specviz.numerics import choose_cpu_numerics

    before = embedded_target.model.lm_head.weight.clone()
    model, info = choose_cpu_numerics(embedded_target.model, check_tokens(embedded_target.tokenizer))
    assert torch.equal(embedded_target.model.lm_head.weight, before)
    assert info.dtype == str(next(model.parameters()).dtype).replace("torch.", "")
    if info.dtype == "bfloat16":
        # W = 2 on an AVX512-BF16 CPU; 1 where bfloat16 rows never depend on the width
        assert model is not embedded_target.model and 1 <= info.min_width <= 8
        assert info.invariant
        assert set(info.times_ms) >= {"float32@1", "float32@8"} and info.check_s < 30
    else:
        assert model is embedded_target.model and info.min_width == 1
    assert info.reason in info.summary()
