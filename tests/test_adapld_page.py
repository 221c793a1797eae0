"""The AdaPLD page: the views behind it (specviz.viz.adapld) on hand-made traces (milliseconds),
the sidebar settings of the AdaPLD methods, and the page driven through AppTest on the embedded
model (integration)."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from specviz import appstate
from specviz.drafters import make_drafter
from specviz.errors import SettingsError
from specviz.trace import Round, Trace
from specviz.viz import adapld as va
from specviz.viz import tree as vt
from specviz.viz.adapld_context import context_spans_html, context_tokens, round_context
from specviz.viz.tables import CompareRun

APP = str(Path(__file__).resolve().parent.parent / "app.py")
TEXTS = {i: f" w{i}" for i in range(100)}
TEXTS.update({7: "<b>&", 8: "\n"})


def lex(span, copy_from, tokens, score, branch, ngram=3):
    return {"kind": "lexical", "span": list(span), "copy_from": list(copy_from), "score": score,
            "ngram": ngram, "similarity": None, "votes": 1, "tokens": list(tokens),
            "branch": branch}


def sem(span, copy_from, tokens, sim, branch):
    return {"kind": "semantic", "span": list(span), "copy_from": list(copy_from), "score": sim,
            "ngram": None, "similarity": sim, "votes": 1, "tokens": list(tokens),
            "branch": branch}


def make_adapld_trace() -> Trace:
    """Prompt of 10 tokens, then: a tree (lexical, 3 branches + a semantic alternative), a
    semantic chain, a round without a match, a round with retrieval off, a fully accepted chain.

    Tree of round 0 (node: token, parent)::

        root ─ 0:20 ─ 1:21 ─ 2:22 ─ 3:23      branch 0 (best)
           │            └── 6:26              branch 2
           └── 4:24 ─ 5:25                    branch 1

    accepted path 0 -> 1, so 2 and 6 (children of the last accepted node) and 4 (a root child)
    were rejected; 3 and 5 (below rejected nodes) were never reached.
    """
    rounds = [
        Round(index=0, start=10, drafter="adapld", draft=[20, 21, 22, 23, 24, 25, 26],
              accepted=2, committed=[20, 21, 30], parents=[-1, 0, 1, 2, -1, 4, 1],
              accepted_path=[0, 1], target_argmax=[20, 21, 30, 31, 32, 33, 34, 35],
              target_argmax_prob=[0.9] * 8, p_draft=[0.9, 0.8, 0.1, 0.2, 0.05, 0.3, 0.02],
              q_draft=[None] * 7,
              extras={"retrieval": "lexical", "source": "lex3", "suffix": [7, 10],
                      "matches": [lex((2, 5), (5, 9), [20, 21, 22, 23], 0.8, 0),
                                  lex((1, 2), (2, 4), [24, 25], 0.5, 1, ngram=1),
                                  lex((3, 4), (4, 7), [20, 21, 26], 0.4, 2, ngram=1),
                                  sem((0, 4), (4, 8), [11, 12, 13, 14], 0.91, None)],
                      "branches": 3, "draft_len": 4, "nodes": 7, "probe": False,
                      "alpha": [0.6, 0.7]}),
        Round(index=1, start=13, drafter="adapld", draft=[40, 41, 42, 43], accepted=1,
              committed=[40, 50], target_argmax=[40, 50, 44, 45, 46], p_draft=[0.7, 0.1, 0.1, 0.1],
              q_draft=[None] * 4,
              extras={"retrieval": "semantic", "source": "sem", "suffix": [5, 13],
                      "matches": [sem((2, 10), (10, 14), [40, 41, 42, 43], 0.93, 0)],
                      "branches": 1, "draft_len": 4, "nodes": 4, "probe": False}),
        Round(index=2, start=15, drafter="adapld", draft=[], accepted=0, committed=[51],
              extras={"retrieval": "none", "source": None, "matches": [], "suffix": None}),
        Round(index=3, start=16, drafter="adapld", draft=[], accepted=0, committed=[52],
              extras={"retrieval": "off", "source": "lex1", "suffix": [15, 16],
                      "matches": [lex((9, 10), (10, 12), [20, 21], 0.3, None, ngram=1)]}),
        Round(index=4, start=17, drafter="adapld", draft=[60, 61], accepted=2,
              committed=[60, 61, 62], target_argmax=[60, 61, 62], p_draft=[0.9, 0.9],
              q_draft=[None, None],
              extras={"retrieval": "lexical", "source": "lex2", "suffix": [15, 17],
                      "matches": [lex((11, 13), (13, 15), [60, 61], 0.7, 0, ngram=2)]}),
    ]
    meta = {"model": "hand-made", "method": "adapld", "prompt": "w1 .. w10", "prompt_len": 10,
            "settings": {"temperature": 0.0}, "stop_reason": "max_new_tokens"}
    return Trace(meta=meta, prompt_ids=list(range(1, 11)), rounds=rounds,
                 token_texts=dict(TEXTS))


@pytest.fixture
def trace() -> Trace:
    return make_adapld_trace()


# ---------------------------------------------------------------- node statuses and the tree
def test_node_status_of_a_tree_with_a_known_accepted_path(trace):
    r = trace.rounds[0]
    # 2 and 6 are children of the last accepted node (where the round ended); 4 is a sibling of
    # an accepted node (judged and rejected while the round went on); 3 and 5 were never judged
    assert r.node_status() == ["accepted", "accepted", "first_rejected", "not_reached",
                               "rejected", "not_reached", "first_rejected"]
    # sampling (SpecInfer): children are tried in order, so the root's child after the accepted
    # one (node 4) was never tried
    assert r.node_status(sampling=True) == ["accepted", "accepted", "first_rejected",
                                            "not_reached", "not_reached", "not_reached",
                                            "first_rejected"]
    assert va.node_branches(r) == [0, 0, 0, 0, 1, 1, 2]
    depth, y = vt.tree_layout(r)
    assert depth == [1, 2, 3, 4, 1, 2, 3]
    assert y == [0, 0, 0, 0, 2, 2, 1]  # best branch on the top row, a parent level with child 1


def test_node_status_of_chains_and_empty_drafts(trace):
    assert trace.rounds[1].node_status() == ["accepted", "first_rejected", "not_reached",
                                             "not_reached"]
    assert trace.rounds[4].node_status() == ["accepted", "accepted"]
    assert trace.rounds[2].node_status() == []
    nothing = Round(index=0, start=3, drafter="adapld", draft=[5, 6, 7], accepted=0,
                    committed=[9])
    assert nothing.node_status() == ["first_rejected", "not_reached", "not_reached"]
    assert vt.tree_layout(trace.rounds[1]) == ([1, 2, 3, 4], [0, 0, 0, 0])  # one branch


def _annotations(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations]


def test_branch_tree_figure_tree(trace):
    fig = va.branch_tree_figure(trace, 0)
    texts = _annotations(fig)
    # root (the last committed token = the last prompt token) + 7 nodes + the target's token
    assert len(texts) == 9 and texts[0] == " w10"
    assert "<b> w20</b>" in texts and "<b> w21</b>" in texts   # accepted nodes in bold
    assert " w30" in texts                                     # the correction token
    names = {t.name for t in fig.data if t.name}
    assert {"accepted (2)", "first rejected (2)", "rejected (1)", "not reached (2)",
            "accepted path"} <= names
    path = next(t for t in fig.data if t.name == "accepted path")
    assert path.line.width >= 4 and [x for x in path.x if x is not None]
    assert "tree" in fig.layout.title.text and "2 accepted" in fig.layout.title.text
    fig.to_json()  # serialisable


def test_tree_labels_show_quotes_as_quotes(trace):
    """Plotly decodes &amp; &lt; &gt; and numeric entities but shows &quot; literally: a token
    with a quote reads as a quote in its box and hover (a node once read '&quot;')."""
    trace.token_texts[21] = ' "x" & <y>'
    fig = va.branch_tree_figure(trace, 0)
    assert any(t in (' "x" &amp; &lt;y&gt;', '<b> "x" &amp; &lt;y&gt;</b>')
               for t in _annotations(fig))
    hovers = " ".join(str(h) for tr in fig.data for h in (tr.hovertext or ()) if h)
    assert """token 21: ' "x" &amp; &lt;y&gt;'""" in hovers and "&quot;" not in hovers


def test_branch_tree_figure_chain_empty_and_out_of_range(trace):
    chain = va.branch_tree_figure(trace, 1)
    assert "chain" in chain.layout.title.text and len(_annotations(chain)) == 1 + 4 + 1
    ys = {y for t in chain.data if t.mode == "markers" for y in t.y if y is not None}
    assert ys <= {0.0, 1.0}  # one row for the chain, the correction below it
    empty = va.branch_tree_figure(trace, 2)
    assert any("No draft" in a for a in _annotations(empty))
    assert "0 nodes" in empty.layout.title.text
    bonus = va.branch_tree_figure(trace, 4)
    assert any(t.name == "target's bonus token" for t in bonus.data)
    va.branch_tree_figure(trace, 99)  # no exception


# ---------------------------------------------------------------- the context with matches
def test_context_spans_mark_matches_suffix_and_copy(trace):
    toks = context_tokens(trace, 0)
    assert [t.position for t in toks] == list(range(10))
    by = {t.position: t for t in toks}
    # lexical span 2-5 (drafted) wins over the semantic alternative 0-4 where they overlap
    assert by[2].kind == "lexical" and by[2].used and by[4].kind == "lexical"
    assert by[0].kind == "semantic" and not by[0].used
    assert all(by[p].copy == 0 and by[p].copy_used for p in (5, 6))
    assert [p for p, t in by.items() if t.suffix] == [7, 8, 9]
    h = context_spans_html(trace, 0)
    assert 'class="ctx-tok m-lex' in h and "m-sem m-alt" in h
    assert "m-copy" in h and "m-suffix" in h
    assert 'class="badge b-lex"' in h and 'class="badge b-alt"' in h and "b-copy" in h
    assert re.search(r"L1 0\.80", h) and re.search(r"S4 0\.91", h)
    assert "&lt;b&gt;&amp;" in h and "<b>&" not in h  # token 7 is escaped
    assert "draft ▸" in h
    assert h.startswith("\n<style>") and not context_spans_html(
        trace, 0, include_css=False).startswith("\n<style>")


def test_context_spans_semantic_output_and_empty_matches(trace):
    h = context_spans_html(trace, 1)
    assert 'class="ctx-tok m-sem' in h and "S1 0.93" in h
    assert "ctx-out" in h and "output ▸" in h   # generated tokens follow the prompt
    none = context_spans_html(trace, 2, include_css=False)
    assert "m-lex" not in none and "m-sem" not in none and "m-copy" not in none
    assert "no draft (no match)" in none
    off = context_spans_html(trace, 3, include_css=False)
    assert "retrieval paused" in off and "m-suffix" in off and "b-alt" in off
    assert "No such round" in context_spans_html(trace, 17)


def test_context_collapse_hides_unmarked_stretches():
    long = make_adapld_trace()
    long.prompt_ids = list(range(1, 11)) + [3] * 60
    for r in long.rounds:
        r.start += 60
        r.extras = {**r.extras, "suffix": None, "matches": [
            lex((2, 5), (5, 9), [20], 0.8, 0)]}
    full = context_spans_html(long, 0)
    short = context_spans_html(long, 0, collapse=3, include_css=False)
    assert full.count('class="ctx-tok') == 70
    assert 'class="ctx-gap"' in short and short.count('class="ctx-tok') < 30
    assert "m-lex" in short and "m-copy" in short


def test_matches_table_and_round_summary(trace):
    t = va.matches_table(trace, 0)
    assert list(t["rank"]) == [1, 2, 3, 4]
    assert list(t["drafted"]) == ["branch 0", "branch 1", "branch 2", "no"]
    assert t.loc[0, "copied_text"] == " w20 w21 w22 w23"
    assert va.matches_table(trace, 2).empty and va.matches_table(trace, 50).empty
    s = va.round_summary_html(trace, 0)
    assert "lexical" in s and "lex3" in s and "tree: 3 branches, 7 nodes" in s
    assert "accepted <b>2</b>" in s and "correction" in s
    assert "paused" in va.round_summary_html(trace, 3)
    assert "bonus" in va.round_summary_html(trace, 4)


# ---------------------------------------------------------------- retrieval over the run
def test_retrieval_counts_table_and_figure(trace):
    assert va.retrieval_counts(trace) == {"lexical": 2, "semantic": 1, "history": 0, "none": 1,
                                         "off": 1}
    t = va.retrieval_table(trace).set_index("source")
    assert list(t.index) == ["lex3", "lex2", "sem", "none", "off"]
    assert t.loc["lex3", "tree_rounds"] == 1 and t.loc["lex3", "accepted"] == 2
    assert t.loc["sem", "first_token_hit"] == 1.0 and t.loc["none", "drafted"] == 0
    assert pd.isna(t.loc["off", "first_token_hit"])          # nothing drafted
    fig = va.fig_retrieval(trace, selected_round=1)
    assert [b.name for b in fig.data] == ["lexical (2)", "semantic (1)", "history (0)", "none (1)",
                                          "off (1)"]
    assert list(fig.data[0].x) == [1, 5] and list(fig.data[0].y) == [3, 3]
    fig.to_json()
    empty = Trace(meta={"method": "adapld"}, prompt_ids=[1])
    assert va.retrieval_counts(empty) == {"lexical": 0, "semantic": 0, "history": 0, "none": 0,
                                          "off": 0}
    va.fig_retrieval(empty).to_json()


def test_non_adapld_traces_are_recognised():
    from tests.test_viz import make_trace

    pld = make_trace()
    assert not va.is_adapld_trace(pld)
    assert va.is_adapld_trace(make_adapld_trace())
    assert va.retrieval_counts(pld)["other"] == 4
    va.branch_tree_figure(pld, 3)  # a tree round of another drafter still draws
    context_spans_html(pld, 0)


def test_round_context_and_json_roundtrip(trace):
    assert round_context(trace, 0) == list(range(1, 11))
    assert round_context(trace, 2) == list(range(1, 11)) + [20, 21, 30, 40, 50]
    back = Trace.from_json(trace.to_json())
    for i in range(trace.num_rounds):
        assert context_spans_html(back, i) == context_spans_html(trace, i)
        assert va.branch_tree_figure(back, i).to_json() == va.branch_tree_figure(trace, i).to_json()


def test_ablation_table_orders_the_ladder(trace):
    def run(method, wall, out):
        t = Trace(meta={"method": method, "settings": {"temperature": 0.0}}, prompt_ids=[1],
                  rounds=[Round(index=0, start=1, drafter=method, draft=[], accepted=0,
                                committed=out)])
        return CompareRun("p", "p", method, t, wall)

    runs = [run("ar", 2.0, [5, 6]), run("adapld", 1.0, [5, 6]), run("adapld_lex", 1.6, [5, 6]),
            run("pld", 2.5, [5, 7])]
    t = va.ablation_table(runs)
    assert list(t["method"]) == ["ar", "pld", "adapld_lex", "adapld"]
    assert t.columns[0] == "variant" and t.loc[3, "variant"].startswith("AdaPLD: + history")
    assert t.loc[3, "speedup_vs_ar"] == 2.0 and t.loc[0, "speedup_vs_ar"] == 1.0
    assert list(t["identical_to_ar"]) == [True, False, True, True]


# ---------------------------------------------------------------- sidebar settings
def test_method_params_for_the_adapld_variants():
    def sidebar(m):
        return {s.name: s.default for s in appstate.method_param_specs(m)}

    for m in va.ADAPLD_METHODS:
        specs = {s.name: s for s in appstate.method_param_specs(m)}
        assert specs, m
        cfg = make_drafter(m).config()
        assert all(cfg[k] == s.default for k, s in specs.items()), m
    assert set(va.ADAPLD_METHODS) == {"adapld", "adapld_nohist", "adapld_lex", "adapld_sem"}
    assert "semantic" not in sidebar("adapld_lex")      # the preset turns it off
    assert "node_budget" in sidebar("adapld") and "node_budget" not in sidebar("adapld_sem")
    assert make_drafter("adapld_lex", **sidebar("adapld_lex")).config()["semantic"] == "off"
    assert not make_drafter("adapld_sem", **sidebar("adapld_sem")).config()["branches"]
    for bad, label in (({"node_budget": 0}, "Tree node budget"),
                       ({"node_budget": 999}, "Tree node budget"),
                       ({"max_branches": 0}, "Most branches"),
                       ({"max_branches": 17}, "Most branches")):
        with pytest.raises(SettingsError, match=label):
            make_drafter("adapld", **bad)
    assert appstate.method_param_specs("pld")


# ---------------------------------------------------------------- the page (AppTest)
def new_app():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    assert not at.exception, at.exception
    return at


def assert_clean(at):
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def page_html(at) -> str:
    return "".join(h.value for h in at.html)


@pytest.mark.integration
def test_adapld_page_on_a_decode_run():
    at = new_app()
    at.selectbox(key="method").set_value("adapld").run()
    at.number_input(key="max_new_tokens").set_value(32).run()
    assert at.number_input(key="param_adapld_node_budget").value == 24
    for _ in range(3):
        at.button(key="next").click().run()
    assert_clean(at)
    dec = at.session_state["dec_trace"]
    assert dec.num_rounds == 3 and dec.meta["method"] == "adapld"

    at.switch_page("pages/adapld.py").run()
    assert_clean(at)
    assert at.session_state["ada_source"] == "decode"
    opened = va.default_round(dec)                  # the last round that drafted
    assert at.slider(key="ada_round").value == opened
    h = page_html(at)
    assert 'class="adapld-ctx"' in h and "m-suffix" in h
    assert "m-lex" in h or "m-sem" in h
    assert "adapld-summary" in h and f"Round {opened}" in h
    assert len(at.get("plotly_chart")) == 2          # the tree and the retrieval chart
    metrics = {m.label: m.value for m in at.metric}
    counts = va.retrieval_counts(dec)
    assert metrics["Lexical rounds"] == str(counts["lexical"])
    assert metrics["Semantic rounds"] == str(counts["semantic"])
    at.slider(key="ada_round").set_value(1).run()
    assert_clean(at)
    assert "Round 1" in page_html(at)

    # the widgets carry the registry's ranges, so an out-of-range budget cannot be entered ...
    for key, lo, hi in [("param_adapld_node_budget", 1, 256), ("param_adapld_max_branches", 1, 16)]:
        assert (at.number_input(key=key).min, at.number_input(key=key).max) == (lo, hi)
    # ... and settings that conflict (shortest n-gram > longest) get a visible error from the
    # drafter's own check, naming the setting by its label; no traceback
    at.number_input(key="param_adapld_max_ngram").set_value(2).run()
    at.number_input(key="param_adapld_min_ngram").set_value(3).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Shortest n-gram" in e.value for e in at.error), [e.value for e in at.error]
    assert at.button(key="ada_run").disabled
    at.number_input(key="param_adapld_min_ngram").set_value(1).run()
    at.number_input(key="param_adapld_max_ngram").set_value(4).run()
    assert_clean(at)

    # the ablation: lexical only vs plain decoding, timed in the same run
    at.number_input(key="max_new_tokens").set_value(16).run()
    for m in ("adapld_sem", "adapld_nohist", "adapld", "pld"):
        at.checkbox(key=f"ada_abl_{m}").uncheck().run()
    at.button(key="ada_abl_run").click().run()
    assert_clean(at)
    runs = at.session_state["ada_abl_runs"]
    assert [r.method for r in runs] == ["ar", "adapld_lex"]
    table = at.dataframe[-1].value.set_index("method")
    assert table.loc["ar", "speedup_vs_ar"] == 1.0
    assert bool(table.loc["adapld_lex", "identical_to_ar"])   # lossless (greedy)
    assert table.loc["adapld_lex", "target_forwards"] <= table.loc["ar", "target_forwards"]


@pytest.mark.integration
def test_adapld_page_for_another_method_offers_an_adapld_run():
    from tests.test_viz import make_trace

    at = new_app()  # the sidebar's method is PLD
    at.number_input(key="max_new_tokens").set_value(16).run()
    at.switch_page("pages/adapld.py").run()
    assert_clean(at)
    assert at.button(key="ada_run").label == "Run AdaPLD on the current prompt"
    # the sidebar of an ablation variant shows only its own settings
    at.selectbox(key="method").set_value("adapld_lex").run()
    assert_clean(at)
    keys = {w.key for w in at.number_input} | {w.key for w in at.text_input}
    assert "param_adapld_lex_max_draft" in keys and "param_adapld_lex_semantic" not in keys
    assert at.button(key="ada_run").label == "Run ADAPLD_LEX on the sidebar prompt"
    at.selectbox(key="method").set_value("pld").run()
    # a PLD run from the Decode page: the page says so and offers an AdaPLD run
    at.session_state["dec_trace"] = make_trace()
    at.run()
    assert not at.exception
    assert any("not an AdaPLD method" in w.value for w in at.warning)
    at.button(key="ada_run_switch").click().run()
    assert_clean(at)
    own = at.session_state["ada_trace"]
    assert own.meta["method"] == "adapld" and own.num_rounds >= 1
    assert at.session_state["ada_source"] == "page"
    assert 'class="adapld-ctx"' in page_html(at)
    # both runs are listed; switching back to the PLD run shows the warning again
    at.radio(key="ada_source").set_value("decode").run()
    assert not at.exception and at.warning


def test_page_opens_on_the_last_round_that_drafted(trace):
    assert va.default_round(trace) == 5                 # round 5 drafted (lex2)
    trace.rounds = trace.rounds[:4]                     # rounds 3-4: nothing drafted
    assert va.default_round(trace) == 2
    trace.rounds = [r for r in trace.rounds if not r.draft]
    assert va.default_round(trace) == len(trace.rounds)
    trace.rounds = []
    assert va.default_round(trace) == 1


def test_a_padded_run_says_why_it_has_no_trees(trace):
    assert va.chains_only(trace) == ""                        # no padding recorded
    padded_run = Trace(meta=dict(trace.meta, min_width=2), prompt_ids=trace.prompt_ids,
                   rounds=trace.rounds)
    assert "first branch" in va.chains_only(padded_run) and "float32" in va.chains_only(padded_run)
    assert va.chains_only(None) == ""
