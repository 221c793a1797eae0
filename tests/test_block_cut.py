"""Issue 10 item 3: a block drafter verifies only the prefix of its block that pays for the
longer verify (measured cost model, confidence calibrated online); output never changes."""
from __future__ import annotations

import random

from specviz.analysis.lossless import compare_outputs
from specviz.costs import CostModel
from specviz.drafters.block_cut import BlockCut
from specviz.drafters.dflash import DFlashDrafter, new_dflash_for_target
from specviz.engine import DecodeSettings, Session, generate

from conftest import repetitive_prompt

STEEP = CostModel.from_points([(1, 1.0), (2, 1.9), (4, 3.5), (8, 7.0)])


def test_a_steeper_curve_keeps_fewer_slots_and_doubt_keeps_none():
    conf = [0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5]
    k_flat, v_flat = BlockCut(CostModel.flat()).choose(conf)
    k_steep, _ = BlockCut(STEEP).choose(conf)
    assert k_flat == 7 and 0 < k_steep < k_flat
    assert v_flat[0] == 1.0                       # k = 0: a plain step, one token per step
    assert BlockCut(STEEP).choose([0.2, 0.1, 0.1])[0] == 0


def test_calibration_learns_that_confident_slots_get_rejected():
    cut = BlockCut(CostModel.flat())
    conf = [0.9, 0.9, 0.9]
    before = cut.expected(conf)[-1]
    for _ in range(30):
        cut.observe(conf, kept=3, accepted=0)   # slot 1 always reached and always rejected
    assert cut.factor(0) < 0.1 and cut.expected(conf)[-1] < before / 5
    assert cut.factor(2) == 1.0                   # never reached: nothing learnt there


def test_dflash_with_the_cut_is_lossless_and_records_why(tiny_target):
    rng = random.Random(4)
    for i in range(6):
        model = new_dflash_for_target(tiny_target, num_layers=1, block_size=8, seed=i)
        ids = repetitive_prompt(rng, 64, 30)
        s = DecodeSettings(max_new_tokens=24)
        drafter = DFlashDrafter(tiny_target, model=model, cut="auto")
        tr = Session(tiny_target, drafter, ids, s).run()
        ar = generate(tiny_target, "ar", ids, s)
        assert compare_outputs(tiny_target, ids, ar.output_ids, tr.output_ids).ok
        for r in tr.rounds:
            cut = r.extras.get("cut")
            if cut is None:                       # the last round may have no room to draft
                continue
            assert len(r.draft) == cut["kept"] <= cut["block"] <= 7
            assert len(cut["value"]) == cut["block"] + 1
            assert cut["value"][cut["kept"]] >= max(cut["value"]) - 1e-3  # (values rounded)


def test_slot_chart_shows_where_the_block_was_cut():
    from specviz import viz
    from specviz.trace import Round, Trace

    r = Round(index=0, start=3, drafter="dflash", draft=[5, 6], accepted=1, committed=[5, 9],
              p_draft=[0.9, 0.2],
              extras={"block_size": 5, "confidence": [0.9, 0.6],
                      "cut": {"kept": 2, "block": 4, "block_confidence": [0.9, 0.6, 0.3, 0.2],
                              "value": [1.0, 1.2, 1.3, 1.25, 1.1]}})
    fig = viz.fig_slot_confidence(Trace(meta={}, prompt_ids=[1, 2, 3], rounds=[r]), 0)
    cut = next(d for d in fig.data if d.name == "cut (not verified)")
    assert list(cut.x) == [3, 4] and list(cut.y) == [0.3, 0.2]
    assert any("cut after 2" in (a.text or "") for a in fig.layout.annotations)
