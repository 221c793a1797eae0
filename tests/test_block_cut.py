"""A block drafter verifies only the prefix of its block that pays for the
longer verify (measured cost model, confidence calibrated online); output never changes."""
from __future__ import annotations

import random

from specviz.analysis.lossless import compare_outputs
from specviz.costs import CostModel
from specviz.drafters.dflash.block_cut import BlockCut, ForwardGate
from specviz.drafters.dflash.checkpoint import new_dflash_for_target
from specviz.drafters.dflash.drafter import DFlashDrafter
from specviz.drafters.probes import PROBE_GAPS
from specviz.engine import DecodeSettings, Session
from specviz.run import generate

from conftest import counted_lossless_run, repetitive_prompt

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
        drafter = DFlashDrafter(tiny_target, model=model, cut="auto", tree=0)   # chains
        tr = Session(tiny_target, drafter, ids, s).run()
        ar = generate(tiny_target, "ar", ids, s)
        assert compare_outputs(tiny_target, ids, ar.output_ids, tr.output_ids).ok
        for r in tr.rounds:
            cut = r.extras.get("cut")
            if cut is None:                       # the last round may have no room to draft
                continue
            if cut.get("paused"):                 # the forward gate paused the drafter
                # paused on a rate below one token per step (recorded rounded to 3 places)
                assert r.draft == [] and cut["kept"] == 0 and cut["rate"] <= 1.0
                continue
            assert len(r.draft) == cut["kept"] <= cut["block"] <= 7
            assert len(cut["value"]) == cut["block"] + 1
            assert cut["value"][cut["kept"]] >= max(cut["value"]) - 1e-3  # (values rounded)


def test_slot_chart_shows_where_the_block_was_cut():
    from specviz.trace import Round, Trace
    from specviz.viz.charts import fig_slot_confidence

    r = Round(index=0, start=3, drafter="dflash", draft=[5, 6], accepted=1, committed=[5, 9],
              p_draft=[0.9, 0.2],
              extras={"block_size": 5, "confidence": [0.9, 0.6],
                      "cut": {"kept": 2, "block": 4, "block_confidence": [0.9, 0.6, 0.3, 0.2],
                              "value": [1.0, 1.2, 1.3, 1.25, 1.1]}})
    fig = fig_slot_confidence(Trace(meta={}, prompt_ids=[1, 2, 3], rounds=[r]), 0)
    cut = next(d for d in fig.data if d.name == "cut (not verified)")
    assert list(cut.x) == [3, 4] and list(cut.y) == [0.3, 0.2]
    assert any("cut after 2" in (a.text or "") for a in fig.layout.annotations)


def test_the_forward_gate_pauses_a_drafter_that_does_not_pay_and_probes_it():
    gate = ForwardGate()
    rnd = 0
    while not gate.off:                      # every drafted round: 1 token for 1.6 steps
        assert gate.wants(rnd) and rnd < 10
        gate.observe(rnd, 1, 1.6)
        rnd += 1
    assert gate.rate < 1.0 and 2 <= rnd <= 6
    waits = []
    for _ in range(4):                       # failed probes: 4, 8, 16, 32 rounds apart
        first = next(i for i in range(rnd, rnd + 100) if gate.wants(i))
        waits.append(first - rnd)
        gate.observe(first, 1, 1.6)
        rnd = first + 1
    assert waits == [4, 8, 16, 32]          # plain steps before each probe
    assert gate.gap == PROBE_GAPS[1]
    first = next(i for i in range(rnd, rnd + 100) if gate.wants(i))
    gate.observe(first, 4, 1.6)              # a probe that pays switches it back on
    assert not gate.off and gate.wants(first + 1) and gate.gap == PROBE_GAPS[0]


def test_the_forward_gate_keeps_a_drafter_that_pays():
    gate = ForwardGate()
    for rnd in range(200):
        assert gate.wants(rnd)
        gate.observe(rnd, 2 if rnd % 2 else 1, 1.4)   # 1.5 tokens per 1.4 steps
    assert not gate.off and gate.rate > 1.0


def test_dflash_paused_rounds_run_no_drafter_forward_and_stay_lossless(tiny_target, monkeypatch):
    """cut="auto" on a random drafter and a steep curve: the gate pauses it; a paused round is a
    plain step without the drafter's forward (counted), and the output is still AR's."""
    import specviz.drafters.dflash.drafter as dflash_mod
    timed = CostModel.from_points([(1, 1.0), (2, 1.9), (4, 3.5), (8, 7.0)], 1e-4)  # a 0.1 ms step
    monkeypatch.setattr(dflash_mod, "cost_curve", lambda *a, **k: timed)
    rng = random.Random(7)
    ids = repetitive_prompt(rng, 64, 30)
    s = DecodeSettings(max_new_tokens=40)
    model = new_dflash_for_target(tiny_target, num_layers=1, block_size=8, seed=3)
    drafter = DFlashDrafter(tiny_target, model=model, cut="auto")
    tr, forwards = counted_lossless_run(monkeypatch, tiny_target, drafter, ids, s)
    ar = generate(tiny_target, "ar", ids, s)
    paused = [r for r in tr.rounds if (r.extras.get("cut") or {}).get("paused")]
    drafted = [r for r in tr.rounds if r.extras.get("cut") and not r.extras["cut"].get("paused")]
    assert paused and all(r.draft == [] for r in paused)
    assert forwards == len(drafted)              # one drafter forward per non-paused round
    from specviz.viz.charts import gate_rounds
    g = gate_rounds(tr)                          # the decode page's gate chart reads the trace
    assert len(g) == len(paused) + len(drafted) and (g["kind"] == "paused").sum() == len(paused)
    probes = [r for r in drafted if r.extras["cut"]["probe"]]
    assert probes and (g["kind"] == "probe").sum() == len(probes)   # paused, then probed
    block = DFlashDrafter(tiny_target, model=model, cut="block")   # the cut without the pause
    tb = Session(tiny_target, block, ids, s).run()
    assert not any((r.extras.get("cut") or {}).get("paused") for r in tb.rounds)
    assert compare_outputs(tiny_target, ids, ar.output_ids, tb.output_ids).ok


def test_a_paused_round_says_so_on_the_decode_page():
    from specviz.trace import Round, Trace
    from specviz.viz.charts import fig_slot_confidence
    from specviz.viz.extras import describe_extras

    r = Round(index=0, start=5, drafter="dflash", draft=[], accepted=0, committed=[7],
              extras={"block_size": 8, "confidence": [],
                      "cut": {"kept": 0, "block": 7, "paused": True, "rate": 0.83}})
    tr = Trace(meta={"method": "dflash"}, prompt_ids=[1, 2, 3, 4, 5], rounds=[r])
    assert "paused" in describe_extras(r) and "0.83" in describe_extras(r)
    fig = fig_slot_confidence(tr, 0)
    assert "paused" in fig.layout.annotations[0].text


def test_the_gate_chart_tells_drafted_cut_probe_and_paused_rounds_apart():
    from specviz.trace import Round, Trace
    from specviz.viz.charts import fig_gate, gate_rounds

    def rnd(i, cut, committed=1):
        return Round(index=i, start=5 + i, drafter="dflash", draft=[], accepted=0,
                     committed=[7] * committed, extras={"block_size": 8, "cut": cut})

    rounds = [rnd(0, {"kept": 3, "block": 7, "rate": 1.25, "probe": False}, 3),
              rnd(1, {"kept": 0, "block": 7, "rate": 1.1, "probe": False}),
              rnd(2, {"kept": 0, "block": 7, "paused": True, "rate": 0.9, "probe": False}),
              rnd(3, {"kept": 2, "block": 7, "rate": 0.9, "probe": True}, 2)]
    tr = Trace(meta={"method": "dflash"}, prompt_ids=[1, 2, 3, 4, 5], rounds=rounds)
    g = gate_rounds(tr)
    assert list(g["kind"]) == ["drafted", "cut to nothing", "paused", "probe"]
    assert list(g["committed"]) == [3, 1, 1, 2] and list(g["round"]) == [1, 2, 3, 4]
    fig = fig_gate(tr)
    names = {d.name for d in fig.data}
    assert {"gate rate", "drafted", "cut to nothing", "paused", "probe"} <= names
    assert any("plain step" in (a.text or "") for a in fig.layout.annotations)
    bare = Trace(meta={"method": "dflash"}, prompt_ids=[1, 2], rounds=[rnd(0, {"kept": 1})])
    assert gate_rounds(bare).empty and "no forward gate" in fig_gate(bare).layout.annotations[0].text
