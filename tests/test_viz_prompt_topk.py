"""The teaching views on hand-made traces (no model, milliseconds): the prompt as
the model saw it (template vs user text, what a lookup copied), the per-round top-k table, the
queue wait named apart from compute, and the speedup estimate saying it is one."""
from __future__ import annotations

import pytest

from specviz.errors import TraceError
from specviz.trace import Round, Trace
from specviz.viz.prompt import (copied_from_prompt, copy_sources, prompt_html, prompt_tokens,
                                user_span)
from specviz.viz.rounds import round_summary_html, round_time_text
from specviz.viz.stats import live_metrics, speedup_estimate
from specviz.viz.tables import rounds_table, topk_table, topk_text
from tests.test_viz import make_trace

SYSTEM = ["<|im_start|>", "system", "\n", "You", " are", " a", " helpful", " AI", " assistant",
          "<|im_end|>", "\n"]
USER = ["<|im_start|>", "user", "\n", "Hello", " helpful", " AI", "<|im_end|>", "\n",
        "<|im_start|>", "assistant", "\n"]


def chat_trace(pieces=None, prompt: str | None = "Hello helpful AI") -> Trace:
    """A trace whose prompt tokens spell a chat template around ``prompt`` (ids 100, 101, …)."""
    pieces = pieces or SYSTEM + USER
    ids = list(range(100, 100 + len(pieces)))
    t = make_trace()
    t.prompt_ids = ids
    t.token_texts.update(dict(zip(ids, pieces)))
    t.meta.update(prompt=prompt, prompt_len=len(ids))
    return t


# ---------------------------------------------------------------- the prompt as the model saw it
def test_user_text_is_found_inside_the_template():
    t = chat_trace()
    a = len(SYSTEM) + 3
    assert user_span(t.prompt_ids, t.token_texts, "Hello helpful AI") == (a, a + 3)
    parts = [p.part for p in prompt_tokens(t)]
    assert parts == ["template"] * a + ["user"] * 3 + ["template"] * 5
    h = prompt_html(t)
    assert h.count('class="ptok template"') == a + 5 and h.count('class="ptok user"') == 3
    assert "added by the chat template" in h and "&lt;|im_start|&gt;" in h
    assert "<|im_start|>" not in h.split("</style>")[1]   # escaped
    assert "↵</span><br>" in h                              # newlines visible


def test_user_text_matching_survives_decoding_quirks():
    # " helpful AI" also occurs in the system prompt: the user's copy is the last one
    t = chat_trace(prompt=" helpful AI ")
    assert user_span(t.prompt_ids, t.token_texts, " helpful AI ") == (15, 17)
    # a tokenizer that drops a word's leading space, and "é" split into two byte tokens
    pieces = ["<s>", "[INST]", "Caf", "\ufffd", "\ufffd", "au", "lait", "[/INST]"]
    t = chat_trace(pieces, prompt="Café au lait")
    assert user_span(t.prompt_ids, t.token_texts, "Café au lait") == (2, 7)
    # not found / no text: nothing is marked as template
    assert user_span(t.prompt_ids, t.token_texts, "something else") is None
    t = chat_trace(prompt=None)
    assert {p.part for p in prompt_tokens(t)} == {"unknown"}
    assert "exact tokens the model read" in prompt_html(t)


def test_lookup_match_points_into_the_prompt():
    t = chat_trace()
    # round 1 (PLD) matched positions 4-5 and copied 6-9, but drafted only 3 tokens
    t.rounds[0].extras = {"match": {"kind": "lexical", "ngram": 2, "span": [4, 6],
                                    "copy_from": [6, 10]}}
    assert copy_sources(t.rounds[0]) == [((4, 6), (6, 9))]
    toks = prompt_tokens(t, selected_round=0)
    assert [p.position for p in toks if p.source == "match"] == [4, 5]
    assert [p.position for p in toks if p.source == "copied"] == [6, 7, 8]
    assert copied_from_prompt(t, 0) and not copied_from_prompt(t, 1)
    h = prompt_html(t, 0)
    assert 'class="ptok template copied"' in h and "round 1's lookup matched" in h
    assert "lookup matched" not in prompt_html(t)        # no round selected
    # AdaPLD: only matches that became a branch count; garbage is skipped, not raised
    r = t.rounds[2]
    r.extras = {"retrieval": "lexical", "matches": [
        {"span": [0, 2], "copy_from": [2, 4], "branch": 0},
        {"span": [5, 6], "copy_from": [6, 8], "branch": None},
        {"span": "x", "copy_from": [1, 2], "branch": 1}]}
    assert copy_sources(r) == [((0, 2), (2, 4))]
    assert copy_sources(t.rounds[1]) == []               # no draft


# ---------------------------------------------------------------- top-k at each judged slot
def test_topk_table_judged_slots_drafter_and_target():
    t = make_trace()
    r = t.rounds[0]   # draft 10 11 12: 10 accepted, 11 rejected (target wanted 20), 12 unjudged
    r.target_topk = [[10, 5], [20, 11], [13, 1], [14, 2]]
    r.target_topk_prob = [[0.9, 0.05], [0.6, 0.1], [0.5, 0.2], [0.4, 0.3]]
    r.extras = {"block_size": 4, "confidence": [0.8, 0.7, 0.6], "topk": [[10, 3], [11, 4],
                                                                         [12, 6]],
                "topk_p": [[0.8, 0.1], [0.7, 0.2], [0.6, 0.004]]}
    df = topk_table(t, 0)
    assert list(df["slot"]) == [1, 2]                        # slot 3 was never judged
    assert list(df["drafted"]) == [" w10", " w11"]
    assert df.loc[1, "verdict"] == "rejected: the target disagreed"
    assert df.loc[1, "p_target"] == "10%"
    assert df.loc[0, "drafter_topk"] == "“ w10” 80% · “ w3” 10%"
    assert df.loc[1, "target_topk"] == "“ w20” 60% · “ w11” 10%"
    assert topk_text([12, 6], [0.6, 0.004], t.token_texts) == "“ w12” 60% · “ w6” <1%"
    # a lookup draft has no drafter top-k; an old trace without target_topk falls back to top-1
    r.extras, r.target_topk, r.target_topk_prob = {"match": None}, [], []
    df = topk_table(t, 0)
    assert set(df["drafter_topk"]) == {"—"} and df.loc[1, "target_topk"] == "“ w20” 60%"


def test_topk_table_bonus_nodraft_tree_and_bounds():
    t = make_trace()
    nd = topk_table(t, 1)
    assert list(nd["verdict"]) == ["no draft: the target's own token"]
    assert nd.loc[0, "target_topk"] == "“ w21” 80%"
    bonus = topk_table(t, 2)
    assert list(bonus["slot"]) == [1, 2, 3] and bonus.loc[2, "drafted"] == "—"
    assert bonus.loc[2, "verdict"].startswith("bonus")
    tree = topk_table(t, 3)   # nodes 0 (depth 1), 1 (depth 1, rejected sibling), 2 (depth 2)
    assert list(tree["slot"]) == [1, 1, 2, 3]
    assert tree.loc[1, "verdict"] == "rejected (another branch was accepted)"
    assert tree.loc[1, "target_topk"] == "“ w40” 60%"        # row 0: the root's prediction
    for i in range(4):
        shown = topk_table(t, i).astype(str).to_string()
        assert "None" not in shown and "nan" not in shown
    assert topk_table(t, 9).empty and list(topk_table(t, -1).columns)[0] == "slot"


def test_new_round_fields_roundtrip_and_old_traces_load():
    t = make_trace()
    t.rounds[0].target_topk, t.rounds[0].target_topk_prob = [[10, 5]], [[0.9, 0.05]]
    t.rounds[0].t_wait = 0.5
    back = Trace.from_json(t.to_json())
    assert back.rounds[0].target_topk == [[10, 5]] and back.rounds[0].t_wait == 0.5
    d = t.to_dict()
    for r in d["rounds"]:   # a trace written before these fields existed
        for k in ("target_topk", "target_topk_prob", "t_wait"):
            r.pop(k)
    old = Trace.from_dict(d)
    assert old.rounds[0].target_topk == [] and old.rounds[0].t_wait == 0.0
    assert not topk_table(old, 0).empty
    d["rounds"][0]["target_topk"] = [["a"]]
    with pytest.raises(TraceError, match="target_topk"):
        Trace.from_dict(d)


# ---------------------------------------------------------------- timings say what they measure
def test_queue_wait_is_named_apart_from_compute():
    t = make_trace()
    assert round_time_text(t.rounds[0]) == "21 ms"
    t.rounds[0].t_wait = 0.002                               # noise: not worth a word
    assert round_time_text(t.rounds[0]) == "21 ms"
    t.rounds[0].t_verify, t.rounds[0].t_wait = 1.718, 1.7
    s = round_summary_html(t, 0)
    assert "19 ms compute + 1,700 ms waiting for another tab&#x27;s turn" in s
    df = rounds_table(t)
    assert list(df["t_wait_ms"]) == [1700.0, 0.0, 0.0, 0.0]
    assert live_metrics(t)["wait_time"] == pytest.approx(1.7)


def test_speedup_estimate_excludes_waits_and_says_it_is_an_estimate():
    t = make_trace()
    before = speedup_estimate(t).value
    for r in t.rounds:          # every round also waited 100 ms for another tab
        r.t_verify += 0.1
        r.t_wait = 0.1
    est = speedup_estimate(t)
    assert est.value == pytest.approx(before)
    text = est.explain()
    assert "estimate, not a measurement" in text and "Compare page" in text
    assert "measured" in text and "differs" in text


# ---------------------------------------------------------------- the engine records them
def test_engine_records_target_topk_and_queue_wait(tiny_target):
    from specviz.drafters import make_drafter
    from specviz.engine import TARGET_TOPK, DecodeSettings, Session

    prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    tr = Session(tiny_target, make_drafter("pld"), prompt, DecodeSettings(max_new_tokens=8)).run()
    assert tr.rounds
    for r in tr.rounds:
        assert len(r.target_topk) == len(r.target_topk_prob) == len(r.target_argmax)
        assert all(len(row) == TARGET_TOPK for row in r.target_topk)
        assert [row[0] for row in r.target_topk] == r.target_argmax     # best first
        assert all(a >= b for row in r.target_topk_prob for a, b in zip(row, row[1:]))
        assert 0.0 <= r.t_wait <= r.t_verify
    assert {t for r in tr.rounds for row in r.target_topk for t in row} <= set(tr.token_texts)
    assert not topk_table(tr, 0).empty
