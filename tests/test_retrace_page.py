"""The ReTrace page: its views (specviz.viz.retrace) on a hand-made trace, and the page in
AppTest -- a ReTrace trace, a trace without ReTrace extras (a clear note, no stack trace), and a
real run of ReTrace beside its backbone on the embedded model (integration)."""
from __future__ import annotations

from pathlib import Path

import pytest

from specviz.analysis.suffix_bound import suffix_bound
from specviz.trace import Round, Trace
from specviz.viz import retrace as vr

from test_adapld_page import assert_clean, new_app

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def make_retrace_trace(with_extras: bool = True) -> Trace:
    """Prompt 0..9. Round 1 drafts 20..24 at positions 10..14: 20 accepted, 21 rejected (the
    target said 30), 22 23 24 never judged. Round 2 (anchor 30 at 11) drafts 22 23 40 at 12..14
    with the memory of 22 23 24 on slots 1..3; 22 23 accepted, target said 41 at 14."""
    ext = {"retrace": {"slots": [1, 2, 3], "from_positions": [12, 13, 14], "from_slots": [3, 4, 5],
                       "agree": [True, False, False], "gate": [0.7, 0.4, 0.1]}}
    rounds = [
        Round(index=0, start=10, drafter="retrace", draft=[20, 21, 22, 23, 24], accepted=1,
              committed=[20, 30], target_argmax=[20, 30, 22, 9, 9, 9],
              extras={"topk": [[20], [21, 30], [22], [23], [24]]}),
        Round(index=1, start=12, drafter="retrace", draft=[22, 23, 40], accepted=2,
              committed=[22, 23, 41], target_argmax=[22, 23, 41, 5],
              extras=ext if with_extras else {}),
        Round(index=2, start=15, drafter="retrace", draft=[], accepted=0, committed=[42]),
    ]
    texts = {i: f" w{i}" for i in range(60)}
    return Trace(meta={"method": "retrace", "model": "toy"}, prompt_ids=list(range(10)),
                 rounds=rounds, token_texts=texts)


def test_pair_rows_and_grid():
    tr = make_retrace_trace()
    rows = vr.pair_rows(tr, 1)
    assert rows["rejected"] == {11: 21, 12: 22, 13: 23, 14: 24}
    assert rows["first_rejected"] == 11
    assert rows["kinds"] == {11: "unmatched", 12: "matched", 13: "matched", 14: "unmatched"}
    assert rows["gates"] == {12: 0.7, 13: 0.4, 14: 0.1}
    h = vr.alignment_grid_html(tr, 1)
    assert "rt-first" in h and h.count("rt-fused") >= 3 and "gate 0.70" in h
    assert vr.pair_rows(tr, 0) is None and vr.pair_rows(tr, 2) is None
    assert "no memory" in vr.alignment_grid_html(tr, 2)


def test_tables_and_figures():
    tr = make_retrace_trace()
    t = vr.slot_table([tr])
    assert list(t["rejected slot"]) == [1, 2, 3, 4]
    assert t.loc[t["rejected slot"] == 2, "exact"].item() == 1.0     # 22 is at 12 in the end
    m = vr.match_matrix([tr])
    assert m.loc[1, 0] == 0.0 and m.loc[2, 0] == 1.0
    g = vr.gate_table(tr)
    assert list(g["slot's fate"]) == ["accepted", "accepted", "rejected"]
    assert vr.fig_gates(tr).data and vr.fig_match_heatmap([tr]).data
    assert vr.has_retrace(tr) and not vr.has_retrace(make_retrace_trace(False))
    assert not vr.fusion_inert(tr)          # recorded before the residual was kept
    tr.rounds[1].extras["retrace"]["residual"] = [0.0, 0.0, 0.0]
    assert vr.fusion_inert(tr)
    tr.rounds[1].extras["retrace"]["residual"] = [0.0, 0.02, 0.0]
    assert not vr.fusion_inert(tr) and not vr.fusion_inert(make_retrace_trace(False))
    tr.rounds[1].extras["retrace"].update(residual=[0.0, 0.0, 0.0], gate_off=True)
    assert vr.gate_forced_off(tr) and not vr.fusion_inert(tr)   # gate off: not "untrained"
    assert not vr.gate_forced_off(make_retrace_trace())
    other = make_retrace_trace()
    other.rounds[1] = Round(index=1, start=12, drafter="dflash", draft=[22, 50], accepted=1,
                            committed=[22, 23])
    assert vr.first_divergence(tr, other) == 1 and vr.first_divergence(tr, tr) is None
    assert len(vr.side_by_side(tr, other)) == 3 and len(vr.fig_progress(tr, other).data) == 2
    b = suffix_bound([tr])   # rounds 1 and 2 carry a suffix; 41 and 42 are nowhere in them
    assert (b.carried, b.best, b.tau, b.tau_bound) == (2, 0, 2.0, 2.0)
    assert list(vr.fig_suffix_bound(b).data[0].x) == ["-1", "+0", "+1", "+2", "best per round"]
    # offsets and slots are categories (left to plotly, "+0" / "1" read as numbers: a one-slot
    # heatmap showed slot "0.6 .. 1.4" and the "best per round" bar was dropped)
    assert vr.fig_suffix_bound(b).layout.xaxis.type == "category"
    heat = vr.fig_match_heatmap([tr])
    assert heat.layout.xaxis.type == heat.layout.yaxis.type == "category"


def test_no_memory_note_says_why():
    tr = make_retrace_trace()
    assert vr.no_memory_note(tr) is None
    bare = make_retrace_trace(with_extras=False)
    note = vr.no_memory_note(bare)
    assert "ReTrace carried no memory" in note and "drafted in 2 of 3 rounds" in note
    for r in bare.rounds:
        r.drafter = "dflash"
    bare.meta["method"] = "dflash"
    note = vr.no_memory_note(bare)
    assert "it was made with **DFLASH**" in note and "carried no memory" not in note
    assert "rejected two or more" in vr.no_pairs_note(bare)    # chain rounds
    bare.rounds[1].parents = [-1, 0]                            # a token tree
    assert "token trees" in vr.no_pairs_note(bare)


@pytest.mark.parametrize("extras", [True, False])
def test_page_shows_a_saved_trace(extras):
    at = new_app()
    at.session_state["uploaded_trace"] = make_retrace_trace(extras)
    at.switch_page("pages/retrace.py").run()
    assert_clean(at)
    h = "".join(x.value for x in at.html)
    assert "rt-grid" in h and "rt-first" in h
    if extras:
        assert "gate 0.70" in h and len(at.get("plotly_chart")) == 3
        assert not at.info
    else:
        assert any("ReTrace carried no memory in this run" in i.value for i in at.info)
        assert len(at.get("plotly_chart")) == 2
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["tau at most"] == "2.00" and metrics["Rounds carrying a suffix"] == "2"


def test_page_says_when_the_fusion_added_nothing():
    tr = make_retrace_trace()
    tr.rounds[1].extras["retrace"]["residual"] = [0.0, 0.0, 0.0]
    at = new_app()
    at.session_state["uploaded_trace"] = tr
    at.switch_page("pages/retrace.py").run()
    assert_clean(at)
    assert any("added nothing" in i.value for i in at.info)
    tr.rounds[1].extras["retrace"]["gate_off"] = True      # the gate forced off: said so instead
    at = new_app()
    at.session_state["uploaded_trace"] = tr
    at.switch_page("pages/retrace.py").run()
    assert_clean(at)
    infos = [i.value for i in at.info]
    assert any("forced off" in v for v in infos) and not any("added nothing" in v for v in infos)


def test_page_without_a_run():
    at = new_app()
    at.switch_page("pages/retrace.py").run()
    assert_clean(at)
    assert any("No run yet" in m.value for m in at.markdown)
