"""Domino drafters (docs/methods/dflash.md#published-layouts): the config checks SGLang makes,
strict loads of tiny random checkpoints with the published tensor names, the draft against an
oracle written from SGLang's rollout (``domino_greedy_rollout``: an nn.GRU re-run over the
whole prefix, full vocabulary or the candidate pool), greedy lossless on a tiny target and the
target's law kept when sampling."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from specviz.drafters.dflash.checkpoint import load_dflash_checkpoint, save_dflash_checkpoint
from specviz.drafters.dflash.domino import domino_block
from specviz.drafters.dflash.layouts import layout_of
from specviz.models import ModelLoadError
from specviz.viz.tables import domino_table
from tests.test_dflash import (published_config, published_weights, qwen3_target,  # noqa: F401
                               write_checkpoint)
from tests.test_dflash_layouts import assert_sampled_drafts_keep_the_law, greedy_traces

GRU, EMB = 16, 8


def domino_config(**dc):
    """A Domino config.json as the published ones write it (emb_dim also at the top level)."""
    cfg = published_config(architectures=["DominoDraftModel"], emb_dim=EMB)
    cfg["dflash_config"].update({"projector_type": "domino", "gru_hidden_dim": GRU,
                                 "emb_dim": EMB, "pure_draft_prefix_len": 1,
                                 "shift_label": True, **dc})
    return cfg


def domino_weights(cfg, seed=0):
    g = torch.Generator().manual_seed(seed + 200)
    w = published_weights(cfg, seed)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    w["prefix_gru.weight_ih_l0"] = 0.3 * torch.randn(3 * GRU, H, generator=g)
    w["prefix_gru.weight_hh_l0"] = 0.3 * torch.randn(3 * GRU, GRU, generator=g)
    w["embed_proj.0.weight"] = 0.3 * torch.randn(EMB, H + GRU, generator=g)
    w["embed_proj.2.weight"] = 2.0 * torch.randn(V, EMB, generator=g)
    return w


def test_configs_are_checked_as_sglang_checks_them():
    assert layout_of(domino_config()) == "domino"
    by_projector = domino_config()
    by_projector["architectures"] = ["DFlashDraftModel"]
    assert layout_of(by_projector) == "domino"
    assert layout_of(domino_config(projector_type="causal_v5")) == "domino"
    top_only = domino_config()
    del top_only["dflash_config"]["emb_dim"]
    assert layout_of(top_only) == "domino"
    cases = {"emb_dim differs": dict(emb_dim=EMB + 1), "pure_draft_prefix_len must be 1":
             dict(pure_draft_prefix_len=2), "shift_label must be": dict(shift_label=1),
             "misses dflash_config.gru_hidden_dim": dict(gru_hidden_dim=None)}
    for message, dc in cases.items():
        with pytest.raises(ModelLoadError, match=message):
            layout_of(domino_config(**dc))


def test_domino_checkpoint_loads_strictly(tmp_path):
    cfg = domino_config()
    w = domino_weights(cfg)
    m = load_dflash_checkpoint(write_checkpoint(tmp_path / "dom", cfg, w))
    assert m.layout == "domino" and m.shift_label and sorted(m.state_dict()) == sorted(w)
    out = save_dflash_checkpoint(m, tmp_path / "again")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DominoDraftModel"]
    assert sorted(load_dflash_checkpoint(out).state_dict()) == sorted(w)
    w2 = {k: v for k, v in w.items() if k != "prefix_gru.weight_hh_l0"}
    with pytest.raises(ModelLoadError, match="missing weight keys: prefix_gru.weight_hh_l0"):
        load_dflash_checkpoint(write_checkpoint(tmp_path / "miss", cfg, w2))
    w3 = dict(w, **{"embed_proj.2.weight": torch.zeros(127, EMB)})
    with pytest.raises(ModelLoadError, match="shapes do not match"):
        load_dflash_checkpoint(write_checkpoint(tmp_path / "shape", cfg, w3))


def sglang_oracle(m, h, head, embed, anchor, k, pool=None):
    """SGLang's native oracle: base logits on the shifted slots, the first word alone, then
    the GRU (re-run on the whole prefix) and the correction; the pool if one is given."""
    z = h[0:k] if m.shift_label else h[1:k + 1]
    base = F.linear(z, head.weight)
    words = [int(base[0].argmax())]
    cand = None
    if pool is not None and k > 1 and 0 < pool < base.shape[-1]:
        cand = torch.topk(base[1:].amax(0), pool).indices
    for i in range(1, k):
        _, state = m.prefix_gru(embed(torch.tensor([[anchor] + words])))
        bias = m.embed_proj(torch.cat([z[i], state[0, 0]]))
        row = base[i] + bias
        words.append(int(row.argmax()) if cand is None else int(cand[row[cand].argmax()]))
    return words


@pytest.mark.parametrize("shift_label", [True, False])
def test_draft_equals_sglangs_rollout(tmp_path, shift_label):
    cfg = domino_config(shift_label=shift_label)
    m = load_dflash_checkpoint(write_checkpoint(tmp_path / "dom", cfg, domino_weights(cfg)))
    g = torch.Generator().manual_seed(4)
    head = torch.nn.Linear(64, 128, bias=False)
    embed = torch.nn.Embedding(128, 64)
    corrected = 0
    with torch.no_grad():
        head.weight.copy_(0.5 * torch.randn(128, 64, generator=g))
        embed.weight.copy_(torch.randn(128, 64, generator=g))
        for trial in range(12):
            h = torch.randn(4, 64, generator=g)
            anchor = trial * 7 % 128
            for k in (3, 2, 1):
                for pool in (2048, 5):
                    rows, words, info = domino_block(m, h, head, embed, anchor, k, pool=pool)
                    assert words == sglang_oracle(m, h, head, embed, anchor, k, pool)
                    assert rows.shape == (k, 128) and info["backbone"][0] == words[0]
                    assert [int(r.argmax()) for r in rows] == words
                    corrected += sum(info["corrected"])
    assert corrected > 0      # the correction head changed some words: the check can tell


def test_domino_greedy_lossless_with_the_corrections_in_the_trace(tmp_path, qwen3_target):
    cfg = domino_config()
    folder = write_checkpoint(tmp_path / "dom", cfg, domino_weights(cfg))
    for tr in greedy_traces(qwen3_target, folder, seed=6, runs=3):
        drafted = [r for r in tr.rounds if r.draft]
        for r in drafted:
            info = r.extras["domino"]
            assert len(info["backbone"]) == len(r.draft) == len(info["corrected"])
            assert info["backbone"][0] == r.draft[0]      # the first word is the backbone's
        table = domino_table(tr, tr.rounds.index(drafted[0]))
        assert list(table["slot"]) == list(range(1, len(drafted[0].draft) + 1))
        assert list(table["corrected"]) == ["yes" if c else "no"
                                            for c in drafted[0].extras["domino"]["corrected"]]


def test_domino_sampling_is_lossless():
    """Each word sampled from its corrected row."""
    g = torch.Generator().manual_seed(3)
    assert_sampled_drafts_keep_the_law(
        "domino", lambda name, v: torch.randn(v.shape, generator=g), projector_type="domino",
        gru_hidden_dim=8, emb_dim=4)


def test_offline_paths_refuse_domino(tmp_path):
    from specviz.drafters.dflash.offline import forward_blocks
    from specviz.errors import SettingsError

    cfg = domino_config()
    m = load_dflash_checkpoint(write_checkpoint(tmp_path / "dom", cfg, domino_weights(cfg)))
    with pytest.raises(SettingsError, match="Domino"):
        forward_blocks(m, torch.zeros(1, 4, 64), torch.tensor([0]), [])


def test_trace_page_shows_how_the_chain_was_chosen(tmp_path, qwen3_target):
    """A saved DFlash2 run and a saved Domino run opened on the Trace page: the round's
    candidate-selector / correction table is shown under it."""
    from streamlit.testing.v1 import AppTest

    from tests.test_app import APP, TIMEOUT
    from tests.test_dflash_layouts import dflash2_config, dflash2_weights

    d2 = dflash2_config()
    runs = {"DFlash2 candidate selector": (d2, dflash2_weights(d2)),
            "Domino correction": (domino_config(), domino_weights(domino_config()))}
    for title, (cfg, w) in runs.items():
        folder = write_checkpoint(tmp_path / title.split()[0], cfg, w)
        tr = greedy_traces(qwen3_target, folder, seed=7, runs=1)[0]
        last = max(i for i, r in enumerate(tr.rounds) if r.draft)
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        at.run()
        at.switch_page("pages/trace.py").run()
        at.session_state["uploaded_trace"] = tr
        at.session_state["uploaded_name"] = "saved.json"
        at.run()
        if len(tr.rounds) > 1:
            at.slider(key="up_scrub").set_value(last + 1).run()
        assert not at.exception and not at.error
        shown = [e for e in at.expander if e.label.startswith(title)]
        assert len(shown) == 1, [e.label for e in at.expander]
        assert len(shown[0].dataframe[0].value) == len(tr.rounds[last].draft)
