"""GQA attention without KV-cache copies (specviz.attention): same logits as transformers' SDPA
on chain and tree verify forwards, no repeat_kv under a mask, switched on only where it applies."""
from __future__ import annotations

import copy

import pytest
import torch

from specviz.attention import ATTENTION, use_gqa_attention
from specviz.tree import TokenTree

from conftest import make_tiny_target


def _cache(model, ids):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return cache


def _verify_logits(model, prompt, ids, tree=None):
    """Logits of one forward over ``ids`` on a cache of ``prompt`` (a tree: its mask)."""
    cache = _cache(model, prompt)
    kw = {}
    if tree is not None:
        kw = {"attention_mask": tree.attention_mask(len(prompt)),
              "position_ids": tree.position_ids(len(prompt))}
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True,
                     **kw).logits


@pytest.fixture(scope="module")
def pair():
    base = make_tiny_target(seed=3).model
    base.set_attn_implementation("sdpa")
    gqa = copy.deepcopy(base)
    assert use_gqa_attention(gqa) and gqa.config._attn_implementation == ATTENTION
    return base, gqa


def test_chain_and_tree_forwards_give_the_same_logits(pair):
    base, gqa = pair
    prompt = [(7 * i + 3) % 60 + 2 for i in range(40)]
    for k in (1, 2, 5, 9):
        ids = [(5 * i + 1) % 60 + 2 for i in range(k)]
        assert torch.equal(_verify_logits(base, prompt, ids), _verify_logits(gqa, prompt, ids))
    tree = TokenTree([11, 12, 13, 14, 15], [-1, 0, 0, 1, -1])
    ids = [9] + tree.tokens
    a, b = _verify_logits(base, prompt, ids, tree), _verify_logits(gqa, prompt, ids, tree)
    assert torch.equal(a, b)
    with torch.inference_mode():   # a prefill (no cache, no mask) takes transformers' own path
        x = torch.tensor([prompt])
        assert torch.equal(base(input_ids=x).logits, gqa(input_ids=x).logits)


def test_no_kv_copy_under_a_mask(pair, monkeypatch):
    import transformers.integrations.sdpa_attention as sdpa

    base, gqa = pair
    calls = []
    real = sdpa.repeat_kv
    monkeypatch.setattr(sdpa, "repeat_kv", lambda h, n: calls.append(n) or real(h, n))
    prompt = list(range(2, 30))
    _verify_logits(base, prompt, [3, 4, 5])
    assert calls                          # transformers copies the cache per layer here
    calls.clear()
    _verify_logits(gqa, prompt, [3, 4, 5])
    assert not calls                      # the GQA path shares the key/value heads


def test_only_where_it_applies():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    mha = LlamaForCausalLM(cfg)
    mha.set_attn_implementation("sdpa")
    assert not use_gqa_attention(mha) and mha.config._attn_implementation == "sdpa"
    eager = make_tiny_target(seed=4).model
    eager.set_attn_implementation("eager")
    assert not use_gqa_attention(eager) and eager.config._attn_implementation == "eager"


@pytest.mark.integration
def test_the_embedded_target_verifies_with_it(embedded_target):
    """Loaded targets on a CPU use it (the integration tests' lossless runs go through it)."""
    from specviz.engine import DecodeSettings
    from specviz.run import generate

    assert embedded_target.model.config._attn_implementation == ATTENTION
    s = DecodeSettings(max_new_tokens=24)
    prompt = "List three colours of the rainbow, one per line."
    ar = generate(embedded_target, "ar", prompt, s)
    pld = generate(embedded_target, "pld", prompt, s)
    assert pld.output_ids == ar.output_ids and any(len(r.draft) > 1 for r in pld.rounds)
