"""The EDR page: one prompt's MRP (specviz.analysis.offline_eval.prompt_mrp) equals real runs,
the views (specviz.viz.edr) on it, and the page in AppTest on the embedded model."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specviz.analysis.edr import evaluate
from specviz.analysis.offline_eval import MARKOV, DrafterSpec, prompt_mrp
from specviz.drafters import make_drafter
from specviz.drafters.dflash.checkpoint import new_dflash_for_target, save_dflash_checkpoint
from specviz.engine import DecodeSettings, Session
from specviz.viz import edr as ve

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def test_prompt_mrp_equals_real_runs(tiny_target, tmp_path):
    from specviz.drafters.dflash.dspark import add_markov_head

    model = new_dflash_for_target(tiny_target, num_layers=1, block_size=5, seed=2,
                                  target_layer_ids=[0, 1])
    save_dflash_checkpoint(model, tmp_path / "d")
    add_markov_head(model, 4, seed=2)
    with torch.no_grad():   # a head that really changes the drafts
        model.markov_out.weight.normal_(0.0, 2.0, generator=torch.Generator().manual_seed(1))
    save_dflash_checkpoint(model, tmp_path / "ds")
    specs = [DrafterSpec("pld", "pld", {}),
             DrafterSpec("dflash", "dflash", {**MARKOV["dflash"], "checkpoint": str(tmp_path / "d")}),
             DrafterSpec("dspark", "dspark", {"cut": "off", "checkpoint": str(tmp_path / "ds")})]
    for ids in ([5, 9, 5, 9, 5, 9, 7], [3, 4, 5, 6, 3, 4, 5]):
        res = prompt_mrp(tiny_target, ids, specs, 20)
        assert res.rollout.tokens[:len(ids)] == ids
        for s in specs:
            tr = Session(tiny_target, make_drafter(s.method, tiny_target, **s.params), ids,
                         DecodeSettings(max_new_tokens=20)).run()
            assert tr.output_ids == res.rollout.tokens[len(ids):]
            assert res.results[s.label].edr == tr.num_rounds


def test_prompt_mrp_on_a_sampled_reply(tiny_target, tmp_path):
    from specviz.drafters.dflash.offline import sampled_state_acceptance

    model = new_dflash_for_target(tiny_target, num_layers=1, block_size=5, seed=2,
                                  target_layer_ids=[0, 1])
    save_dflash_checkpoint(model, tmp_path / "d")
    specs = [DrafterSpec("pld", "pld", {}),
             DrafterSpec("dflash", "dflash", {"cut": "off", "checkpoint": str(tmp_path / "d"),
                                              "draft_temperature": 1.0})]
    ids = [5, 9, 5, 9, 5, 9, 7]
    res = prompt_mrp(tiny_target, ids, specs, 16, temperature=1.0, seed=4)
    again = prompt_mrp(tiny_target, ids, specs, 16, temperature=1.0, seed=4)
    assert res.rollout.tokens == again.rollout.tokens            # seeded
    pld, dfl = res.acceptance["pld"], res.acceptance["dflash"]
    assert set(pld.unique().tolist()) <= {0.0, 1.0}               # deterministic drafts: 0/1
    frac = dfl[(dfl > 0) & (dfl < 1)]
    assert frac.numel() > 0                                       # sampled acceptance: fractions
    occ = res.results["dflash"].occupancy
    assert abs(float(occ.sum()) - res.results["dflash"].edr) < 1e-9
    assert ((occ > 0.01) & (occ < 0.99)).any()                    # fractional round starts
    y = res.rollout.tokens[len(ids):]
    with torch.no_grad():
        out = tiny_target.model(torch.tensor([res.rollout.tokens]))
    p_y = torch.softmax(out.logits[0, len(ids) - 1:-1].double(), -1).gather(
        -1, torch.tensor(y).view(-1, 1)).squeeze(-1)
    want = sampled_state_acceptance(model, tiny_target, torch.tensor(res.rollout.tokens),
                                    res.rollout.features,
                                    len(ids), p_y, 1.0)
    assert torch.allclose(dfl, want, atol=1e-4)


def test_views():
    a = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 0, 0], [0, 0, 0]],
                     dtype=torch.float64)
    b = torch.zeros_like(a)
    results = {"A": evaluate(a), "B": evaluate(b)}
    assert results["A"].edr == 2 and results["B"].edr == 6   # A: rounds at 0 and 3
    h = ve.occupancy_tokens_html([10, 11, 12, 13, 14, 15], {10: "<x>"}, results["A"].occupancy)
    assert "&lt;x&gt;" in h and h.count("border-left") == 2
    assert len(ve.fig_occupancy(results).data) == 2 and ve.fig_values(results).data
    diff = ve.fig_difference(results).data[0].y
    assert list(diff) == [0, 1, 1, 0, 1, 1]
    rows = ve.summary_rows(results, {"A": 2, "B": 6})
    assert rows[0]["expected rounds (EDR)"] == 2 and rows[1]["rounds of a real run"] == 6
    # the paper's AR_k, under a name that is not plain decoding's "AR", each column explained
    assert rows[0]["slot 1 accepted"] == 1.0 and not any(k.startswith("AR") for k in rows[0])
    assert set(rows[0]) - {"drafter", "tokens"} <= set(ve.SUMMARY_HELP)
    assert ve.fig_acceptance(a, "A").data


@pytest.mark.integration
def test_edr_page_on_the_embedded_model():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    at.number_input(key="max_new_tokens").set_value(24).run()
    at.switch_page("pages/edr.py").run()
    assert not at.exception and not at.error
    assert any("Press **Compute**" in i.value for i in at.info)
    at.button(key="edr_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    table = at.dataframe[0].value
    assert list(table["drafter"]) == ["pld", "dflash"]
    assert (table["expected rounds (EDR)"] == table["rounds of a real run"]).all()
    assert len(at.get("plotly_chart")) == 5
    # sampling: a sampled reply, the learned drafter's sampled acceptance (fractional d_n)
    at.radio(key="mode").set_value("Sampling").run()
    at.number_input(key="temperature").set_value(1.0).run()
    at.button(key="edr_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert any("Sampled reply (T = 1)" in c.value for c in at.caption)
    assert len(at.get("plotly_chart")) == 5
