"""The DFlash layouts published now (docs/methods/dflash.md#published-layouts): sliding-window
DFlash and DFlash2, loaded strictly from tiny random checkpoints written with the published
config keys and tensor names, greedy lossless on a tiny target; the comparisons with vLLM's own
code are in tests/test_dflash_vllm.py."""
from __future__ import annotations

import copy
import json
import random
import subprocess

import pytest
import torch

from specviz.analysis.lossless import compare_outputs
from specviz.drafters import make_drafter
from specviz.drafters.dflash.checkpoint import (load_dflash_checkpoint, resolve_checkpoint,
                                                save_dflash_checkpoint)
from specviz.drafters.dflash.dflash2 import greedy_walk
from specviz.drafters.dflash.layouts import layer_attentions, layout_of
from specviz.drafters.dflash.model import DFlashAttention, block_mask
from specviz.engine import DecodeSettings, Session
from specviz.models import ModelLoadError
from specviz.run import generate
from specviz.trace import Trace
from tests.test_dflash import (published_config, published_weights, qwen3_target,  # noqa: F401
                               random_prompt, write_checkpoint)

TAPS, GROUP, RANK, TOPK = 3, 16, 8, 4


def dflash2_config(**over):
    """A DFlash2 config.json (z-lab's keys) sized for the tiny Qwen3 target."""
    cfg = published_config(architectures=["DFlash2DraftModel"],
                           layer_types=["sliding_attention"] * 2, sliding_window=2048, use_sliding_window=True,
                           rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    cfg.pop("block_size")
    cfg["dflash_config"] = {"block_size": 4, "mask_token_id": 127, "target_layer_ids": [0, 1, 2],
                            "conv_kernel_size": TAPS, "conv_group_size": GROUP,
                            "selector_rank": RANK, "selector_top_k": TOPK, "causal": False,
                            "input_embedding_scale": 1.5, "output_multiplier": 0.5,
                            "final_logit_softcapping": 30.0}
    cfg.update(over)
    return cfg


def dflash2_weights(cfg, seed=0):
    g = torch.Generator().manual_seed(seed + 100)
    w = published_weights(cfg, seed)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    for i in range(cfg["num_hidden_layers"]):
        for side in ("attention_conv", "mlp_conv"):
            p = f"layers.{i}.{side}."
            w[p + "base_kernel"] = 0.3 * torch.randn(2, TAPS, H, generator=g) + \
                torch.tensor([1.0] + [0.0] * (TAPS - 1)).view(1, TAPS, 1)
            w[p + "kernel_projection.weight"] = 0.05 * torch.randn(2 * TAPS * (H // GROUP), H,
                                                                   generator=g)
    w["candidate_selector.hidden_projection.weight"] = 0.2 * torch.randn(RANK, H, generator=g)
    w["candidate_selector.predecessor_codebook"] = torch.randn(V, RANK, generator=g)
    w["candidate_selector.successor_codebook"] = torch.randn(V, RANK, generator=g)
    return w


# ---------------------------------------------------------------- layouts from config.json
def test_layouts_are_told_apart_by_class_or_keys():
    assert layout_of(published_config()) == "dflash"
    assert layout_of(dflash2_config()) == "dflash2"
    sglang = dflash2_config(architectures=["DFlashDraftModel"])      # SGLang reads the keys
    assert layout_of(sglang) == "dflash2"
    with pytest.raises(ModelLoadError, match="not a DFlash drafter"):
        layout_of(published_config(architectures=["LlamaForCausalLM"]))
    bad = dflash2_config()
    del bad["dflash_config"]["selector_rank"]
    with pytest.raises(ModelLoadError, match="misses dflash_config.selector_rank"):
        layout_of(bad)
    scaled = published_config(is_neox_style=False)
    scaled["dflash_config"]["attention_value_scale"] = 2.0
    assert layout_of(scaled) == "dflash"                         # run, not refused
    with pytest.raises(ModelLoadError, match="two layouts: dflash2, domino"):
        layout_of(dflash2_config(projector_type="domino"))


def test_layer_attention_resolved_as_vllm_does():
    """(window, causal) per layer: the rules of vLLM's _resolve_layer_attention."""
    full, slide = "full_attention", "sliding_attention"
    mixed = published_config(layer_types=[slide, full], sliding_window=6, use_sliding_window=True)
    assert layer_attentions(mixed, 2) == [(6, True), (None, False)]   # sliding layers causal
    with pytest.raises(ModelLoadError, match="no window"):   # Qwen3Config drops the window
        layer_attentions(dict(mixed, use_sliding_window=False), 2)
    derived = published_config(use_sliding_window=True, max_window_layers=1)
    del derived["layer_types"], derived["sliding_window"]    # Qwen3Config's defaults: 4096, and
    assert layer_attentions(derived, 2) == [(None, False), (4096, True)]  # layers >= 1 slide
    assert layer_attentions(published_config(), 2) == [(None, False)] * 2
    mimo = published_config(dflash_config={"use_swa": True, "swa_window_size": 5,
                                           "mask_token_id": 127, "target_layer_ids": [0]})
    assert layer_attentions(mimo, 2) == [(5, False)] * 2      # use_swa: every layer slides
    assert layer_attentions(dflash2_config(), 2) == [(2048, False)] * 2   # causal: false
    assert layer_attentions(published_config(is_causal=True), 2) == [(None, True)] * 2
    with pytest.raises(ModelLoadError, match="no window"):
        layer_attentions(published_config(layer_types=[slide] * 2), 2)
    with pytest.raises(ModelLoadError, match="2 entries"):
        layer_attentions(published_config(), 3)
    m = block_mask(n=5, t=3, window=4, causal=False, device="cpu")   # query at 5 sees 2..7
    assert m[0].tolist() == [False, False, True, True, True, True, True, True]
    assert block_mask(n=3, t=3, window=4, causal=False, device="cpu") is None
    c = block_mask(n=2, t=3, window=None, causal=True, device="cpu")
    assert c.tolist() == [[True, True, True, False, False], [True, True, True, True, False],
                          [True, True, True, True, True]]


def test_attention_sinks_join_the_softmax():
    """A sink is one more logit per head with a zero value: the softmax over the keys and the
    sink, written out by hand."""
    torch.manual_seed(0)
    cfg = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
    a = DFlashAttention(cfg, sinks=True)
    with torch.no_grad():
        a.attention_sink_bias.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
    x, n, t = torch.randn(1, 3, 32), 4, 3
    ck, cv = torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8)
    cos, sin = torch.ones(1, t, 8), torch.zeros(1, t, 8)
    with torch.no_grad():
        out = a(x, ck, cv, cos, sin, window=None, causal=True)
        q = a.q_norm(a.q_proj(x).view(1, t, 4, 8)).transpose(1, 2)
        k, v = a.kv(x, cos, sin)
        k = torch.cat([ck, k], 2).repeat_interleave(2, 1)
        v = torch.cat([cv, v], 2).repeat_interleave(2, 1)
        logits = q @ k.transpose(-1, -2) / 8 ** 0.5
        logits = logits.masked_fill(~block_mask(n, t, None, True, "cpu"), float("-inf"))
        sink = a.attention_sink_bias.view(1, 4, 1, 1).expand(1, 4, t, 1)
        w = torch.softmax(torch.cat([logits, sink], -1), -1)[..., :-1]
        want = a.o_proj((w @ v).transpose(1, 2).reshape(1, t, -1))
    assert torch.allclose(out, want, atol=1e-5)


# ---------------------------------------------------------------- strict loads
def test_swa_checkpoint_loads_and_is_lossless(tmp_path, qwen3_target):
    cfg = published_config(layer_types=["sliding_attention", "full_attention"], sliding_window=5,
                           use_sliding_window=True)
    cfg.pop("block_size")
    cfg["dflash_config"]["block_size"] = 4
    folder = write_checkpoint(tmp_path / "swa", cfg, published_weights(cfg))
    full = write_checkpoint(tmp_path / "full", published_config(),
                            published_weights(published_config()))
    d = make_drafter("dflash", qwen3_target, checkpoint=str(folder), cut="off", tree=0)
    assert [(layer.window, layer.causal) for layer in d.model.layers] == [(5, True), (None, False)]
    ids = random_prompt(random.Random(3), 127, 20, 24)
    s = DecodeSettings(max_new_tokens=20)
    tr = Session(qwen3_target, d, ids, s).run()
    assert tr.output_ids == generate(qwen3_target, "ar", ids, s).output_ids
    # the window matters once the context is longer than it: drafts differ from full attention
    f = make_drafter("dflash", qwen3_target, checkpoint=str(full), cut="off", tree=0)
    Session(qwen3_target, d, ids, s)
    Session(qwen3_target, f, ids, s)
    assert not torch.allclose(d.block_logits(ids), f.block_logits(ids))


def test_sink_checkpoint_loads_strictly_and_is_lossless(tmp_path, qwen3_target):
    cfg = published_config()
    cfg["dflash_config"]["attention_sink_bias"] = True
    w = published_weights(cfg)
    for i in range(2):
        w[f"layers.{i}.self_attn.attention_sink_bias"] = torch.tensor([0.5, -1.0, 1.0, 0.0])
    folder = write_checkpoint(tmp_path / "sink", cfg, w)
    d = make_drafter("dflash", qwen3_target, checkpoint=str(folder), cut="off", tree=0)
    assert sorted(d.model.state_dict()) == sorted(w)
    ids = random_prompt(random.Random(4), 127, 6, 12)
    s = DecodeSettings(max_new_tokens=16)
    assert Session(qwen3_target, d, ids, s).run().output_ids == \
        generate(qwen3_target, "ar", ids, s).output_ids
    missing = {k: v for k, v in w.items() if "sink" not in k}
    with pytest.raises(ModelLoadError, match="missing weight keys: layers.0.self_attn.attention"):
        load_dflash_checkpoint(write_checkpoint(tmp_path / "nosink", cfg, missing))


def test_dflash2_checkpoint_loads_strictly(tmp_path, qwen3_target):
    cfg = dflash2_config()
    w = dflash2_weights(cfg)
    folder = write_checkpoint(tmp_path / "d2", cfg, w)
    m = load_dflash_checkpoint(folder)
    assert m.layout == "dflash2" and sorted(m.state_dict()) == sorted(w)
    assert m.input_embedding_scale == 1.5 and m.logit_softcap == 30.0
    out = save_dflash_checkpoint(m, tmp_path / "again")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DFlash2DraftModel"]
    assert sorted(load_dflash_checkpoint(out).state_dict()) == sorted(w)
    for drop in ("candidate_selector.successor_codebook", "layers.1.mlp_conv.base_kernel"):
        w2 = {k: v for k, v in w.items() if k != drop}
        with pytest.raises(ModelLoadError, match="missing weight keys: " + drop):
            load_dflash_checkpoint(write_checkpoint(tmp_path / drop, cfg, w2))
    w3 = dict(w, **{"layers.0.attention_conv.base_kernel": torch.zeros(2, TAPS + 1, 64)})
    with pytest.raises(ModelLoadError, match="shapes do not match"):
        load_dflash_checkpoint(write_checkpoint(tmp_path / "shape", cfg, w3))
    bad = copy.deepcopy(cfg)
    bad["dflash_config"]["conv_group_size"] = 7
    with pytest.raises(ModelLoadError, match="conv_group_size=7 must divide"):
        load_dflash_checkpoint(write_checkpoint(tmp_path / "grp", bad, w))


def greedy_traces(target, folder, seed: int, runs: int) -> list[Trace]:
    """Greedy runs of the drafter in ``folder`` on random prompts, each checked equal to plain
    decoding and with drafted rounds: their traces (schema-checked)."""
    rng, out = random.Random(seed), []
    for _ in range(runs):
        d = make_drafter("dflash", target, checkpoint=str(folder), cut="off", tree=0)
        ids = random_prompt(rng, 127, 4, 20)
        s = DecodeSettings(max_new_tokens=24)
        tr = Session(target, d, ids, s).run()
        ar = generate(target, "ar", ids, s)
        assert compare_outputs(target, ids, ar.output_ids, tr.output_ids).ok
        assert any(r.draft for r in tr.rounds)
        Trace.from_json(tr.to_json())     # the round extras pass the trace schema
        out.append(tr)
    return out


def test_dflash2_greedy_lossless_with_the_selector_in_the_trace(tmp_path, qwen3_target):
    cfg = dflash2_config()
    folder = write_checkpoint(tmp_path / "d2", cfg, dflash2_weights(cfg))
    for tr in greedy_traces(qwen3_target, folder, seed=5, runs=4):
        for r in (r for r in tr.rounds if r.draft):
            sel = r.extras["selector"]
            assert len(sel["path"]) == len(r.draft) and len(sel["candidates"][0]) == TOPK
            assert [row[j] for row, j in zip(sel["candidates"], sel["path"])] == r.draft


def test_selector_walk_follows_the_best_edges():
    torch.manual_seed(0)
    scores = torch.randn(5, TOPK, TOPK)
    path = greedy_walk(scores)
    prev = 0
    for step, j in enumerate(path):
        assert j == int(scores[step, prev].argmax())
        prev = j


def assert_sampled_drafts_keep_the_law(layout: str, fill, **dflash_config) -> None:
    """A ``layout`` drafter for the sampling pair's target (its backbone copied from the
    pair's drafter, every other tensor from ``fill(name, tensor)``), drafting at temperature 1:
    the first two committed tokens keep the target's law (the chi-square check of the other
    block drafters)."""
    from specviz.drafters.dflash.drafter import DFlashDrafter
    from specviz.drafters.dflash.layouts import ARCHITECTURES
    from specviz.drafters.dflash.model import DFlashDraftModel
    from tests.conftest import assert_same_law, first_two_token_counts, sampling_pair

    target, base = sampling_pair()
    cfg = copy.deepcopy(base.config)
    cfg["architectures"] = [a for a, lay in ARCHITECTURES.items() if lay == layout]
    cfg["dflash_config"].update(dflash_config)
    m = DFlashDraftModel(cfg)
    base_sd = base.state_dict()
    with torch.no_grad():
        for k, v in m.state_dict().items():
            v.copy_(base_sd[k] if k in base_sd else fill(k, v))
    m.eval().requires_grad_(False)
    used = {"accepted": 0}

    def on_trace(tr):
        used["accepted"] += sum(r.accepted for r in tr.rounds)

    counts, exact = first_two_token_counts(
        target, [3, 7, 5], lambda seed: DFlashDrafter(target, model=m, draft_temperature=1.0,
                                                      seed=seed, cut="off"),
        2000, dict(temperature=0.9, top_p=0.95), on_trace=on_trace)
    assert_same_law(counts, exact, tv_tol=0.13)
    assert used["accepted"] > 100


def test_dflash2_sampling_is_lossless():
    """Each step of the selector's walk sampled."""
    g = torch.Generator().manual_seed(3)

    def fill(name, v):
        if name.endswith("base_kernel"):       # the convolutions start as the identity
            return torch.zeros_like(v).index_fill_(1, torch.tensor([0]), 1.0)
        return 0.1 * torch.randn(v.shape, generator=g)

    assert_sampled_drafts_keep_the_law("dflash2", fill, conv_kernel_size=2, conv_group_size=16,
                                       selector_rank=4, selector_top_k=4)


def test_revision_flag_pins_hub_ids(tmp_path):
    """``--revision`` (run, bench): a hub-id checkpoint becomes ID@REV; nothing to pin, or a
    pin already given, is one clear error."""
    import os
    import sys
    from pathlib import Path

    from specviz.cli_common import pin_revision
    from specviz.errors import SpecvizError

    got = pin_revision({"ar": {}, "dflash": {"checkpoint": "z-lab/X-DFlash"}}, "v2")
    assert got == {"ar": {}, "dflash": {"checkpoint": "z-lab/X-DFlash@v2"}}
    assert pin_revision({"dflash": {}}, None) == {"dflash": {}}
    with pytest.raises(SpecvizError, match="given as a hub id"):
        pin_revision({"dflash": {"checkpoint": str(tmp_path)}}, "v2")
    with pytest.raises(SpecvizError, match="already names a revision"):
        pin_revision({"dflash": {"checkpoint": "z-lab/X@v1"}}, "v2")
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_COLOR="1")
    r = subprocess.run([sys.executable, "-m", "specviz", "run", "--prompt", "hi", "--method",
                        "dflash", "--revision", "v2"], cwd=Path(__file__).parents[1], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == ("error: --revision pins a drafter checkpoint given as a hub id: "
                                "add --param checkpoint=ORG/NAME")


def test_revision_pin_is_named():
    with pytest.raises(ModelLoadError, match="at revision abc123"):
        resolve_checkpoint("z-lab/not-a-real-drafter-xyz@abc123")
    with pytest.raises(ModelLoadError, match="neither a local folder"):
        resolve_checkpoint("z-lab/x@")


def test_offline_paths_refuse_what_they_cannot_run(tmp_path):
    from specviz.drafters.dflash.offline import forward_blocks
    from specviz.errors import SettingsError

    cfg = dflash2_config()
    m = load_dflash_checkpoint(write_checkpoint(tmp_path / "d2", cfg, dflash2_weights(cfg)))
    with pytest.raises(SettingsError, match="full-attention DFlash layout only"):
        forward_blocks(m, torch.zeros(1, 4, 64), torch.tensor([0]), [])
