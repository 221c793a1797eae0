"""Unit tests of specviz.viz on hand-made traces (no model, milliseconds)."""
from __future__ import annotations

import re

import pytest

from specviz.trace import Round, Trace
from specviz.viz.charts import (confidence_calibration, fig_accepted_hist, fig_compare,
                                fig_confidence_calibration, fig_position_acceptance,
                                fig_round_lengths, fig_slot_confidence, has_confidence,
                                slot_confidences)
from specviz.viz.extras import describe_extras
from specviz.viz.stats import (accepted_lengths, live_metrics, position_acceptance,
                               speedup_estimate, trace_prefix)
from specviz.viz.tables import (CompareRun, compare_runs_table, compare_summary_table,
                                position_table, rounds_table, to_csv_bytes)
from specviz.viz.tokens import legend_html, token_views, tokens_html, visible_text

TEXTS = {i: f" w{i}" for i in range(100)}
TEXTS.update({7: "<b>&", 8: "\n", 9: "", 99: "<|im_end|>"})


def make_trace() -> Trace:
    """Prompt of 5 tokens, then four rounds: correction, no draft, bonus, and a tree round."""
    rounds = [
        # draft 3, first accepted, then mismatch: target says 20 instead of 11
        Round(index=0, start=5, drafter="pld", draft=[10, 11, 12], accepted=1, committed=[10, 20],
              target_argmax=[10, 20, 13, 14], target_argmax_prob=[0.9, 0.6, 0.5, 0.4],
              p_draft=[0.9, 0.1, 0.2], q_draft=[None, None, None], t_draft=0.001,
              t_verify=0.020, extras={"match": {"kind": "lexical", "ngram": 2, "span": [1, 3],
                                                "copy_from": [3, 6]}}),
        # no draft: a plain decoding step
        Round(index=1, start=7, drafter="pld", draft=[], accepted=0, committed=[21],
              target_argmax=[21], target_argmax_prob=[0.8], p_draft=[], q_draft=[],
              t_draft=0.001, t_verify=0.010, extras={"match": None}),
        # everything accepted: the target's token is a bonus
        Round(index=2, start=8, drafter="pld", draft=[30, 31], accepted=2, committed=[30, 31, 32],
              target_argmax=[30, 31, 32], target_argmax_prob=[0.7, 0.95, 0.5],
              p_draft=[0.7, 0.95], q_draft=[0.6, 0.8], t_draft=0.001, t_verify=0.019),
        # a tree: nodes 0 and 1 are children of the root, node 2 a child of node 0;
        # path 0 -> 2 is accepted, node 1 (a sibling at depth 1) is rejected
        Round(index=3, start=11, drafter="tree", draft=[40, 41, 42], accepted=2,
              committed=[40, 42, 43], parents=[-1, -1, 0], accepted_path=[0, 2],
              target_argmax=[40, 43, 42, 43], target_argmax_prob=[0.6, 0.5, 0.7, 0.55],
              p_draft=[0.6, 0.2, 0.7], q_draft=[None, None, None], t_draft=0.002,
              t_verify=0.021),
    ]
    meta = {"model": "hand-made", "method": "pld", "prompt": "a b c d e", "prompt_len": 5,
            "settings": {"temperature": 0.0}, "prefill_time": 0.05, "stop_reason": "eos"}
    return Trace(meta=meta, prompt_ids=[1, 2, 3, 4, 5], rounds=rounds, token_texts=dict(TEXTS))


@pytest.fixture
def trace() -> Trace:
    return make_trace()


# ---------------------------------------------------------------- stats
def test_round_kinds_and_lengths(trace):
    assert [r.kind for r in trace.rounds] == ["correction", "nodraft", "bonus", "bonus"]
    assert accepted_lengths(trace) == [1, 0, 2, 2]
    assert [r.draft_depth for r in trace.rounds] == [3, 0, 2, 2]


def test_position_acceptance_is_conditional_on_reaching(trace):
    stats = position_acceptance(trace)
    assert [(s.position, s.reached, s.accepted) for s in stats] == [(1, 3, 3), (2, 3, 2), (3, 0, 0)]
    assert stats[0].rate == 1.0
    assert stats[1].rate == pytest.approx(2 / 3)
    assert stats[2].rate is None  # never reached: no rate rather than 0


def test_position_acceptance_empty_trace(trace):
    assert position_acceptance(trace_prefix(trace, 0)) == []


def test_trace_prefix(trace):
    p = trace_prefix(trace, 2)
    assert p.num_rounds == 2 and trace.num_rounds == 4
    assert p.output_ids == [10, 20, 21]
    assert trace_prefix(trace, None) is trace
    assert trace_prefix(trace, 99) is trace


def test_live_metrics(trace):
    m = live_metrics(trace)
    assert m["rounds"] == m["target_forwards"] == 4
    assert m["new_tokens"] == 9
    assert m["tau"] == pytest.approx(9 / 4)
    assert m["drafted"] == 8 and m["accepted"] == 5
    assert m["tokens_per_s"] == pytest.approx(9 / trace.decode_time)


def test_speedup_estimate_uses_plain_rounds(trace):
    est = speedup_estimate(trace)
    # plain step: the no-draft round, 11 ms; median round time of [21, 11, 20, 23] ms = 20.5 ms
    assert est.step_time == pytest.approx(0.011)
    assert est.round_time == pytest.approx(0.0205)
    assert est.value == pytest.approx(9 / 4 * 0.011 / 0.0205)
    assert "plain decoding step" in est.explain() and "Compare page" in est.explain()


def test_speedup_estimate_without_plain_rounds(trace):
    t = trace_prefix(trace, 1)
    est = speedup_estimate(t)
    # 2 tokens per round; step time = verify time (20 ms), round time 21 ms
    assert est.value == pytest.approx(2 * 0.020 / 0.021)
    assert speedup_estimate(trace_prefix(trace, 0)).value is None


# ---------------------------------------------------------------- tokens
def test_token_views_order_kinds_positions(trace):
    v = token_views(trace)
    kinds = [x.kind for x in v]
    assert kinds == ["accepted", "rejected", "rejected", "correction",   # round 1
                     "nodraft",                                          # round 2
                     "accepted", "accepted", "bonus",                    # round 3
                     "accepted", "accepted", "rejected", "bonus"]        # round 4 (tree)
    r0 = [x for x in v if x.round == 0]
    assert [x.position for x in r0] == [5, 6, 7, 6]  # rejected 11 at 6, 12 at 7; correction at 6
    assert r0[1].token_id == 11 and r0[1].p == 0.1 and r0[1].target_argmax == 20
    assert r0[3].token_id == 20 and r0[3].p == 0.6  # correction prob = target argmax prob
    assert r0[0].output_index == 0
    # the committed tokens, read in order, are exactly the trace's output
    assert [x.token_id for x in v if x.kind != "rejected"] == trace.output_ids
    # tree round: accepted path 0 -> 2, rejected node 1 at depth 1 (position 11)
    r3 = [x for x in v if x.round == 3]
    assert [x.token_id for x in r3] == [40, 42, 41, 43]
    assert r3[1].p == 0.7 and r3[2].position == 11
    assert r3[3].p == 0.55  # target token row = last path node + 1


def test_token_views_rejected_modes(trace):
    assert sum(x.kind == "rejected" for x in token_views(trace, "none")) == 0
    sel = token_views(trace, "selected", selected_round=0)
    assert [x.token_id for x in sel if x.kind == "rejected"] == [11, 12]
    assert all(x.selected for x in sel if x.round == 0)
    assert not any(x.selected for x in sel if x.round != 0)
    with pytest.raises(ValueError):
        token_views(trace, "sometimes")


def test_tokens_html_classes_and_titles(trace):
    h = tokens_html(trace)
    assert h.count('class="tok accepted') == 5
    assert h.count('class="tok rejected') == 3
    assert h.count('class="tok bonus') == 4
    assert h.count('class="tok bonus t-correction') == 1
    assert h.count('class="tok bonus t-bonus') == 2
    assert h.count('class="tok bonus t-nodraft') == 1
    assert h.count('class="rsep"') == 3  # boundaries between the 4 rounds
    assert "<style>" in h and ".tok.rejected" in h and "line-through" in h
    titles = re.findall(r'title="([^"]*)"', h)
    assert any("Round 1 · position 6" in t and "rejected draft token" in t
               and "target prob p: 0.100" in t for t in titles)
    assert any("drafter prob q: 0.600" in t for t in titles)  # round 3 has drafter probs
    assert tokens_html(trace, include_css=False).startswith('<div class="specviz-tokens">')


def test_tokens_html_escapes_and_shows_whitespace():
    t = make_trace()
    t.rounds[1].committed = [7]
    t.rounds[2].committed = [30, 31, 8]
    h = tokens_html(t, include_css=False)
    assert "<b>&" not in h and "&lt;b&gt;&amp;" in h
    assert "↵</span><br>" in h
    assert visible_text("") == "∅"
    assert visible_text("a\tb") == "a⇥b"


def test_tokens_html_empty_trace(trace):
    h = tokens_html(trace_prefix(trace, 0))
    assert "Next round" in h and 'class="tok' not in h.split("</style>")[1]


def test_legend_explains_every_kind():
    h = legend_html()
    for cls in ("tok accepted", "tok bonus t-correction", "tok bonus t-bonus",
                "tok bonus t-nodraft", "tok rejected first", "tok rejected unjudged"):
        assert f'class="{cls}"' in h
    assert "rejected" in h and "bonus" in h and "correction" in h


def test_uploaded_trace_renders_like_the_live_one(trace):
    back = Trace.from_json(trace.to_json())
    assert tokens_html(back) == tokens_html(trace)
    assert rounds_table(back).equals(rounds_table(trace))
    assert live_metrics(back) == live_metrics(trace)


# ---------------------------------------------------------------- tables
def test_rounds_table(trace):
    df = rounds_table(trace)
    assert list(df["round"]) == [1, 2, 3, 4]
    assert list(df["accepted"]) == [1, 0, 2, 2]
    assert list(df["drafted"]) == [3, 0, 2, 3]
    assert list(df["target_token_kind"]) == ["correction", "no draft", "bonus", "bonus"]
    assert df.loc[0, "rejected_text"] == " w11 w12"
    assert df.loc[0, "accepted_text"] == " w10" and df.loc[0, "target_token"] == " w20"
    # round 1 rejected its 2nd token (p 0.1); the tree round rejected node 1 (a sibling of the
    # accepted path, no first_rejected below its last node), rounds 2-3 rejected nothing
    assert list(df["p_first_rejected"]) == ["0.100", "—", "—", "—"]
    assert "None" not in df.astype(str).to_string() and "nan" not in df.astype(str).to_string()
    assert df.loc[0, "drafter_info"] == "2-token match at positions 1–3, copied 3–6"
    assert df.loc[1, "drafter_info"] == "no n-gram match"
    assert df.loc[0, "output_pos"] == 1 and df.loc[1, "output_pos"] == 3
    csv = to_csv_bytes(df).decode()
    assert csv.splitlines()[0].startswith("round,output_pos,drafted,accepted")
    assert len(csv.strip().splitlines()) == 5


def test_position_table(trace):
    df = position_table(trace)
    assert list(df["reached"]) == [3, 3, 0]


def test_describe_extras_generic():
    r = Round(index=0, start=0, drafter="x", draft=[], accepted=0, committed=[1],
              extras={"gate": [0.1, 0.2]})
    assert describe_extras(r) == "gate: [0.1, 0.2]"


def _run(prompt, method, out_ids, wall, temperature=0.0):
    rounds = [Round(index=i, start=3 + i, drafter=method, draft=[], accepted=0, committed=[t])
              for i, t in enumerate(out_ids)]
    if method != "ar":  # pretend the method committed everything in one round
        rounds = [Round(index=0, start=3, drafter=method, draft=out_ids[:-1],
                        accepted=len(out_ids) - 1, committed=list(out_ids))]
    tr = Trace(meta={"method": method, "settings": {"temperature": temperature}},
               prompt_ids=[1, 2, 3], rounds=rounds, token_texts=dict(TEXTS))
    return CompareRun(prompt, prompt.upper(), method, tr, wall)


def test_compare_tables():
    runs = [_run("p1", "ar", [5, 6, 7, 8], 2.0), _run("p1", "pld", [5, 6, 7, 8], 1.0),
            _run("p2", "ar", [5, 6], 1.0), _run("p2", "pld", [5, 9], 1.0)]
    per = compare_runs_table(runs)
    assert list(per["speedup_vs_ar"]) == [1.0, 2.0, 1.0, 1.0]
    assert list(per["identical_to_ar"]) == [True, True, True, False]
    assert list(per["target_forwards"]) == [4, 1, 2, 1]
    s = compare_summary_table(runs).set_index("method")
    assert s.loc["pld", "speedup_vs_ar"] == pytest.approx(1.5)
    assert s.loc["pld", "tau"] == pytest.approx(3.0)  # (4 + 2) tokens over 2 rounds
    assert s.loc["ar", "tau"] == 1.0
    assert not s.loc["pld", "identical_to_ar"] and s.loc["ar", "identical_to_ar"]
    fig = fig_compare(s.reset_index())
    assert len(fig.data) == 2


def test_compare_tables_sampling_skips_identity():
    runs = [_run("p1", "ar", [5, 6], 1.0, 0.8), _run("p1", "pld", [5, 7], 0.5, 0.8)]
    per = compare_runs_table(runs)
    assert per["identical_to_ar"].isna().all()
    assert compare_summary_table(runs)["identical_to_ar"].isna().all()
    assert compare_summary_table([]).empty


# ---------------------------------------------------------------- figures
def test_figures(trace):
    f = fig_round_lengths(trace, selected_round=1)
    assert [d.name for d in f.data] == ["accepted", "target: correction", "target: bonus",
                                        "target: no draft", "rejected"]
    assert list(f.data[0].y) == [1, 0, 2, 2]
    assert list(f.data[1].y) == [1, 0, 0, 0]
    assert list(f.data[2].y) == [0, 0, 1, 1]
    assert list(f.data[3].y) == [0, 1, 0, 0]
    assert list(f.data[4].y) == [2, 0, 0, 1]
    p = fig_position_acceptance(trace)
    assert list(p.data[0].x) == [1, 2, 3]
    assert list(p.data[0].y)[:2] == [1.0, pytest.approx(2 / 3)]
    h = fig_accepted_hist(trace)
    assert list(h.data[0].x) == [0, 1, 2] and list(h.data[0].y) == [1, 1, 2]
    empty = trace_prefix(trace, 0)
    for fn in (fig_round_lengths, fig_position_acceptance, fig_accepted_hist):
        fn(empty).to_json()  # empty traces still give a (blank) figure


def _dflash_trace() -> Trace:
    """Two block-drafter rounds with per-slot confidence (as DFlash stores it)."""
    rounds = [
        Round(index=0, start=5, drafter="dflash", draft=[10, 11, 12, 13], accepted=2,
              committed=[10, 11, 20], p_draft=[0.9, 0.8, 0.05, 0.3],
              q_draft=[0.95, 0.7, 0.85, 0.2], extras={"block_size": 5,
                                                       "confidence": [0.95, 0.7, 0.85, 0.2]}),
        Round(index=1, start=8, drafter="dflash", draft=[30, 31], accepted=2,
              committed=[30, 31, 32], p_draft=[0.6, 0.9], q_draft=[0.15, 0.9],
              extras={"block_size": 5, "confidence": [0.15, 0.9]}),
        Round(index=2, start=11, drafter="dflash", draft=[], accepted=0, committed=[40],
              extras={"block_size": 5, "confidence": []}),
    ]
    return Trace(meta={"model": "hand-made", "method": "dflash"}, prompt_ids=[1, 2, 3, 4, 5],
                 rounds=rounds, token_texts=dict(TEXTS))


def test_slot_confidence_chart_and_calibration(trace):
    t = _dflash_trace()
    assert has_confidence(t) and not has_confidence(trace)
    assert slot_confidences(t.rounds[0]) == [0.95, 0.7, 0.85, 0.2]
    f = fig_slot_confidence(t, 0)
    by = {d.name: d for d in f.data}
    assert list(by["accepted"].x) == [1, 2] and list(by["accepted"].y) == [0.95, 0.7]
    assert list(by["first rejected"].x) == [3] and list(by["first rejected"].y) == [0.85]
    assert list(by["not reached"].x) == [4]
    assert list(by["target p(draft token)"].y) == [0.9, 0.8, 0.05, 0.3]
    assert "Round 1" in f.layout.title.text
    # judged tokens: round 0 slots 1-3 (slot 3 the first rejected), round 1 both slots
    cal = confidence_calibration(t, bins=5).set_index("bin")
    assert cal["judged"].sum() == 5 and cal["accepted"].sum() == 4
    assert cal.loc["0.8–1.0", "judged"] == 3 and cal.loc["0.8–1.0", "accepted"] == 2
    assert cal.loc["0.0–0.2", "acceptance"] == 1.0
    g = fig_confidence_calibration(t)
    assert g.data[0].name == "observed" and len(g.data[0].x) == 3
    # rounds / traces without confidence still give a (blank) figure
    fig_slot_confidence(t, 2).to_json()
    fig_confidence_calibration(trace).to_json()
    fig_slot_confidence(trace, 0).to_json()


def test_the_first_mismatch_is_marked_apart_with_the_targets_choice(trace):
    rej = [v for v in token_views(trace) if v.kind == "rejected"]
    # round 1: 11 was judged and rejected (the target wanted 20), 12 was never judged;
    # round 4 (tree): node 1 is a root child beside the accepted node 0 -> judged, rejected
    assert [(v.token_id, v.status) for v in rej] == [(11, "first_rejected"), (12, "not_reached"),
                                                     (41, "rejected")]
    assert rej[0].target_argmax == 20 and rej[0].target_argmax_p == 0.6
    h = tokens_html(trace)
    # the target's choice sits under the first rejected token, in one box that reserves its
    # width (a label wider than its token never runs under the next one)
    first = re.search(r'<span class="rj"><span class="tok rejected first"[^>]*>([^<]*)</span>'
                      r'(.*?)</span></span>', h)
    assert first.group(1) == " w11" and first.group(2).endswith('>→ w20 60%')
    unjudged = re.search(r'<span class="tok rejected unjudged" title="([^"]*)"', h).group(1)
    assert "never judged" in unjudged and "target prob p" not in unjudged
    assert h.count('class="want"') == 1


def test_round_extras_read_as_words_with_nothing_raw():
    def rnd(ex, draft=(5, 6)):
        return Round(index=0, start=0, drafter="x", draft=list(draft), accepted=1,
                     committed=[5, 7], extras=ex)

    ada = describe_extras(rnd({"retrieval": "none", "source": None, "alt_gain": 0.227412,
                                   "alpha": None}))
    assert ada == "no match in the context"
    off = describe_extras(rnd({"retrieval": "off", "source": "lex2"}))
    assert "paused" in off
    cut = describe_extras(rnd({"block_size": 8, "confidence": [0.912345, 0.5],
                                   "cut": {"kept": 2, "block": 7}}))
    assert cut.startswith("block of 8 slots; verified 2 of 7")
    whole = describe_extras(rnd({"block_size": 8, "confidence": [0.9, 0.5]}))
    assert whole == "block of 8 slots; drafter confidence 70% on average"
    odd = describe_extras(rnd({"gate": [0.123456789, None], "flag": True}))
    assert odd == "gate: [0.123, —]; flag: yes"
    for text in (ada, off, cut, whole, odd):
        assert "null" not in text and "None" not in text and "{" not in text


@pytest.mark.parametrize("field,value,msg", [
    ("accepted", "2", "'accepted' must be a whole number of 0 or more, got '2'"),
    ("draft", [1, "x"], "'draft' must be a list of token ids; item 2 is 'x'"),
    ("parents", "tree", "'parents' must be null or a list of parent nodes"),
    ("t_verify", "fast", "'t_verify' must be a number of seconds from 0 to 86400, got 'fast'"),
])
def test_a_tampered_trace_names_the_field_not_python_internals(trace, field, value, msg):
    from specviz.errors import TraceError

    d = trace.to_dict()
    d["rounds"][1][field] = value
    with pytest.raises(TraceError) as err:
        Trace.from_dict(d)
    # rounds count from 1, as on the pages: the file's second round is "round 2"
    assert msg in str(err.value) and str(err.value).startswith("round 2:")
    assert "not supported between" not in str(err.value) and "instances" not in str(err.value)
