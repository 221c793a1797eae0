"""The DFlash layouts against vLLM's own code (docs/methods/dflash.md#published-layouts), on the
same tiny weights and inputs: DFlash2's grouped convolution and edge scores, each layer's
attention resolution on the published combinations, and whole block forwards through vLLM's
decoder layers (tests/vllm_reference.py, run once in .venv-vllm for the whole module)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from specviz.drafters.dflash.checkpoint import load_dflash_checkpoint
from specviz.drafters.dflash.dflash2 import (capped_top_k, greedy_walk, grouped_conv,
                                             score_edges)
from specviz.drafters.dflash.layouts import layer_attentions
from specviz.models import ModelLoadError
from tests.test_dflash import published_config, published_weights, write_checkpoint
from tests.test_dflash_layouts import TOPK, dflash2_config, dflash2_weights

FULL, SLIDE = "full_attention", "sliding_attention"
N_CONTEXT = 7


def pieces_inputs() -> dict:
    g = torch.Generator().manual_seed(1)
    B, H, taps, gsize, V, r, k, L = 4, 64, 3, 16, 50, 8, 5, 3
    return {"x": torch.randn(3 * B, H, generator=g),
            "delta": torch.randn(3 * B, taps, H // gsize, generator=g),
            "base": torch.randn(taps, H, generator=g), "block": B, "groups": H // gsize,
            "gsize": gsize, "taps": taps, "pred": torch.randn(V, r, generator=g),
            "succ": torch.randn(V, r, generator=g),
            "cand": torch.randint(0, V, (2, L, k), generator=g),
            "unary": torch.randn(2, L, k, generator=g), "hid": torch.randn(2, L, r, generator=g),
            "anchor": torch.randint(0, V, (2,), generator=g), "k": k}


def resolution_configs() -> list[dict]:
    """The published combinations of windows, layer types, use_swa and causality."""
    mimo = {"use_swa": True, "swa_window_size": 5, "mask_token_id": 127, "target_layer_ids": [0]}
    derived = published_config(use_sliding_window=True, max_window_layers=1)
    del derived["layer_types"], derived["sliding_window"]
    return [published_config(), published_config(is_causal=True), dflash2_config(),
            published_config(layer_types=[SLIDE, FULL], sliding_window=6,
                             use_sliding_window=True),
            published_config(layer_types=[SLIDE, FULL], sliding_window=6),
            published_config(layer_types=[SLIDE, SLIDE], sliding_window=6),
            published_config(dflash_config=mimo),
            published_config(dflash_config={**mimo, "causal": True}),
            published_config(layer_types=[SLIDE, SLIDE], use_sliding_window=True),
            published_config(layer_types=[SLIDE, FULL], use_sliding_window=True,
                             sliding_window=9, dflash_config={**mimo, "causal": False}),
            derived]


def mixed_drafter() -> tuple[dict, dict]:
    """A DFlash drafter with a sliding causal layer (window 3, shorter than the context), a
    full layer, attention sinks, a value scale and interleaved RoPE."""
    cfg = published_config(layer_types=[SLIDE, FULL], sliding_window=3, use_sliding_window=True,
                           is_neox_style=False)
    cfg["dflash_config"].update(attention_sink_bias=True, attention_value_scale=0.5)
    w = published_weights(cfg)
    for i in range(2):
        w[f"layers.{i}.self_attn.attention_sink_bias"] = torch.tensor([0.5, -1.0, 1.0, 0.0])
    return cfg, w


def forward_inputs(cfg: dict, w: dict) -> dict:
    g = torch.Generator().manual_seed(3)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    k = len(cfg["dflash_config"]["target_layer_ids"])
    B = cfg.get("block_size") or cfg["dflash_config"]["block_size"]
    return {"state": w, "context": torch.randn(N_CONTEXT, k * H, generator=g),
            "block_emb": torch.randn(B, H, generator=g),
            "lm_head": 0.3 * torch.randn(V, H, generator=g), "anchor": torch.tensor(5)}


def jobs() -> dict:
    d2 = dflash2_config()
    d2w = dflash2_weights(d2)
    mixed, mixed_w = mixed_drafter()
    return {"pieces": ("pieces", pieces_inputs()), "resolve": ("resolve", resolution_configs()),
            "dflash2": ("forward", (d2, forward_inputs(d2, d2w))),
            "mixed": ("forward", (mixed, forward_inputs(mixed, mixed_w)))}


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    """(the jobs, vLLM's results): one .venv-vllm process for every comparison."""
    from specviz.errors import SpecvizError
    from specviz.served.server import vllm_python

    try:
        py = vllm_python()
    except SpecvizError as exc:
        pytest.skip(str(exc))
    d = tmp_path_factory.mktemp("vllm_reference")
    todo = jobs()
    torch.save(todo, d / "jobs.pt")
    res = subprocess.run([str(py), str(Path(__file__).with_name("vllm_reference.py")),
                          str(d / "jobs.pt"), str(d / "results.pt")],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return todo, torch.load(d / "results.pt")


def specviz_forward(tmp_path, cfg: dict, t: dict):
    """(specviz's model of ``cfg`` with the job's weights, its block states [B, H])."""
    m = load_dflash_checkpoint(write_checkpoint(tmp_path / "ckpt", cfg, t["state"]))
    with torch.no_grad():
        ctx = m.context_kv(t["context"][None], torch.arange(N_CONTEXT))
        return m, m.forward_block(t["block_emb"][None], ctx, N_CONTEXT)[0]


def test_dflash2_pieces_equal_vllms(vllm):
    todo, results = vllm
    t, theirs = todo["pieces"][1], results["pieces"]
    mine_conv = grouped_conv(t["x"], t["delta"], t["base"], t["block"], t["groups"], t["gsize"],
                             t["taps"])
    mine_edges = score_edges(t["pred"], t["succ"], t["cand"], t["unary"], t["hid"], t["anchor"],
                             t["k"])
    assert torch.allclose(mine_conv, theirs["conv"], atol=1e-5)
    assert torch.allclose(mine_edges, theirs["edges"], atol=1e-5)


def test_layer_attention_equals_vllms_resolution(vllm):
    """(window, causal) per layer on the config as vLLM loads it; an error where vLLM errs."""
    todo, results = vllm
    configs, theirs = todo["resolve"][1], results["resolve"]
    assert len(theirs) == len(configs)
    for cfg, want in zip(configs, theirs):
        try:
            mine = [list(a) for a in layer_attentions(cfg, cfg["num_hidden_layers"])]
        except ModelLoadError as exc:
            mine = f"error: {exc}"
        if isinstance(want, str):
            assert isinstance(mine, str), (cfg, want, mine)
        else:
            assert mine == want, cfg


def test_dflash2_block_forward_equals_vllms_layers(vllm, tmp_path):
    """vLLM's DFlash2Qwen3DecoderLayer x2, final norm, candidate top-K (LogitsProcessor:
    multiplier, softcap) and CandidateSelector give specviz's states, candidates and edges."""
    todo, results = vllm
    cfg, t = todo["dflash2"][1]
    theirs = results["dflash2"]
    m, h = specviz_forward(tmp_path, cfg, t)
    assert torch.allclose(h, theirs["hidden"], atol=1e-5)
    head = torch.nn.Linear(h.shape[1], cfg["vocab_size"], bias=False)
    with torch.no_grad():
        head.weight.copy_(t["lm_head"])
        ids, unary = capped_top_k(m.draft_scores(h[1:], head, None), TOPK, m.output_multiplier,
                                  m.logit_softcap)
        edges = m.candidate_selector(ids[None], unary[None], h[1:][None], t["anchor"].view(1))[0]
    assert torch.equal(ids, theirs["ids"])
    assert torch.allclose(unary, theirs["unary"], atol=1e-5)
    assert torch.allclose(edges, theirs["edges"], atol=1e-4)
    assert greedy_walk(edges) == greedy_walk(theirs["edges"])


def test_sliding_sink_scaled_interleaved_forward_equals_vllms_layers(vllm, tmp_path):
    """vLLM's DFlashQwen3DecoderLayer (its own window/causality resolution, q/k norms, RoPE
    style, value scale) gives specviz's block states; NeoX RoPE instead would not."""
    todo, results = vllm
    cfg, t = todo["mixed"][1]
    theirs = results["mixed"]
    m, h = specviz_forward(tmp_path, cfg, t)
    assert [(layer.window, layer.causal) for layer in m.layers] == [(3, True), (None, False)]
    assert torch.allclose(h, theirs["hidden"], atol=1e-5)
    _, h2 = specviz_forward(tmp_path / "neox", {**cfg, "is_neox_style": True}, t)
    assert not torch.allclose(h2, theirs["hidden"], atol=1e-3)
