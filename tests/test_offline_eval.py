"""Offline drafter comparison (specviz.analysis.offline_eval, `python -m specviz eval`): batched
DFlash drafts equal the live drafter's, expected rounds equal real greedy runs, the paired
bootstrap behaves, bad rollouts and drafters are named."""
from __future__ import annotations

import json

import pytest
import torch

from specviz.analysis.edr import state_drafts
from specviz.analysis.offline_eval import bootstrap_ci, offline_compare, parse_drafters, real_rounds
from specviz.bench import PromptItem
from specviz.drafters.dflash.checkpoint import new_dflash_for_target, save_dflash_checkpoint
from specviz.drafters.dflash.drafter import DFlashDrafter
from specviz.drafters.dflash.offline import dflash_state_drafts
from specviz.errors import SettingsError, SpecvizError
from specviz.train.rollout_store import RolloutSet
from specviz.train.rollouts import make_rollouts

from conftest import make_tiny_rollouts


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_target):
    d = tmp_path_factory.mktemp("offline")
    make_tiny_rollouts(tiny_target, d / "ro")
    model = new_dflash_for_target(tiny_target, num_layers=1, block_size=5, seed=3,
                                  target_layer_ids=[0, 1])
    save_dflash_checkpoint(model, d / "dd")
    return d, model


def test_batched_dflash_drafts_equal_the_live_drafter(setup, tiny_target):
    d, model = setup
    rs = RolloutSet(d / "ro")
    for i in range(len(rs)):
        t, h, p = rs.load(i)
        live = state_drafts(DFlashDrafter(tiny_target, model=model, cut="off", tree=0), rs.rollout(i),
                            tiny_target)
        assert dflash_state_drafts(model, tiny_target, t, h, p, chunk=7) == live


def test_offline_equals_real_runs_and_cli(setup, tiny_target, tmp_path):
    d, _ = setup
    rs = RolloutSet(d / "ro", split="eval")
    specs = parse_drafters(f"pld,dflash:{d / 'dd'}")
    res = offline_compare(tiny_target, rs, specs)
    real = real_rounds(tiny_target, rs, specs, len(rs))
    for s in specs:
        off = [r[f"edr:{s.label}"] for r in res["rows"]]
        assert real[s.label]["rounds"] == off          # exact, every rollout
        assert real[s.label]["same_text"] == len(rs)
    summ = res["summary"]
    assert set(summ) == {"a", "b", "all"} and summ["all"]["rollouts"] == len(rs)
    tau = summ["all"]["drafters"]["pld"]["tau"]
    assert tau == summ["all"]["tokens"] / sum(real["pld"]["rounds"])


@pytest.mark.integration
def test_eval_cli_on_the_embedded_model(embedded_target, tmp_path, capsys):
    from specviz.cli import main

    items = [PromptItem(f"q{i}", "gsm8k" if i % 2 else "qa", t, "x") for i, t in enumerate(
        ["What is 12 times 7? Explain.", "Name three primary colors.",
         "A box has 3 red and 5 blue balls. How many balls?", "What is the capital of Italy?"])]
    make_rollouts(embedded_target, items, tmp_path / "ro", max_new_tokens=24, holdout=0.9999)
    rc = main(["eval", "--drafters", "pld,dflash", "--rollouts", str(tmp_path / "ro"),
               "--real", "2", "--out", str(tmp_path / "e")])
    assert rc == 0
    res = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert res["summary"]["all"]["rollouts"] == 4
    assert res["provenance"]["commit"] and res["provenance"]["cpu_model"]   # where it was made
    for lab in ("pld", "dflash"):
        assert res["real"][lab]["equals_offline"] == 2 == res["real"][lab]["same_text"]
    assert (tmp_path / "e" / "eval.csv").read_text().count("\n") == 5
    out = capsys.readouterr().out
    assert "dflash vs pld: expected rounds" in out and "offline:" in out


def test_bootstrap_ci():
    a = [10.0, 12.0, 8.0, 9.0, 11.0] * 4
    b = [x * 0.9 for x in a]
    toks = [20] * len(a)
    r = bootstrap_ci(a, b, toks, n_boot=500)
    assert abs(r["rounds_change"] + 0.1) < 1e-12
    assert r["rounds_change_ci"][0] <= -0.1 <= r["rounds_change_ci"][1] + 1e-12
    assert abs(r["tau_ratio"] - 1 / 0.9) < 1e-12
    same = bootstrap_ci(a, a, toks, n_boot=200)
    assert same["rounds_change_ci"] == [0.0, 0.0]


def test_bad_input_is_named(setup, tiny_target, tmp_path):
    d, _ = setup
    with pytest.raises(SettingsError, match="Markov"):
        parse_drafters("pld,adapld")
    with pytest.raises(SettingsError, match="twice"):
        parse_drafters("pld,pld")
    other = new_dflash_for_target(tiny_target, num_layers=1, block_size=5, seed=3,
                                  target_layer_ids=[1])
    save_dflash_checkpoint(other, tmp_path / "other")
    rs = RolloutSet(d / "ro")
    with pytest.raises(SpecvizError, match="reads target layers \\[1\\]"):
        offline_compare(tiny_target, rs, parse_drafters(f"dflash:{tmp_path / 'other'}"))
    # rollouts of another target
    import shutil

    bad = tmp_path / "ro2"
    shutil.copytree(d / "ro", bad)
    meta = json.loads((bad / "meta.json").read_text())
    meta["hidden_size"] = 999
    (bad / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SpecvizError, match="another target"):
        offline_compare(tiny_target, RolloutSet(bad), parse_drafters("pld"))
    # a truncated shard
    shard = sorted(bad.glob("shard-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:200])
    meta["hidden_size"] = 32
    (bad / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SpecvizError, match="truncated"):
        offline_compare(tiny_target, RolloutSet(bad), parse_drafters("pld"))
    with pytest.raises(SpecvizError, match="no rollouts"):
        offline_compare(tiny_target, RolloutSet(d / "ro", split="nope"), parse_drafters("pld"))
