"""The one round sentence (specviz.viz.rounds): used by the trace explorer as is and by the
AdaPLD page with its retrieval details (hand-made traces, no model)."""
from __future__ import annotations

from specviz.viz import adapld as va
from specviz.viz.rounds import RoundNotes, round_summary_html
from tests.test_viz import make_trace


def test_round_sentence_generic():
    tr = make_trace()
    s = round_summary_html(tr, 0)
    assert s.startswith('<div class="round-summary"') and "<b>Round 1</b> · pld" in s
    assert "drafted 3 token(s) (2-token match" in s and "accepted <b>1</b>: <code> w10" in s
    assert "rejected 2: <s> w11 w12</s>" in s and "target's correction token" in s
    assert "no draft (no n-gram match) → the target generated one token itself" in \
        round_summary_html(tr, 1)
    assert "target's bonus token: <code> w32</code>" in round_summary_html(tr, 2)
    assert round_summary_html(tr, 4) == "" and round_summary_html(tr, -1) == ""


def test_round_sentence_with_notes():
    tr = make_trace()
    notes = RoundNotes(label="<i>lab</i>", draft=["from X"], tail=["extra"],
                           css_class="adapld-summary")
    s = round_summary_html(tr, 0, notes)
    assert 'class="round-summary adapld-summary"' in s and "<i>lab</i>" in s
    assert "from X" in s and "drafted 3" not in s and "extra" in s
    assert "accepted <b>1</b>" in s and "correction" in s
    nd = round_summary_html(tr, 1, RoundNotes(no_draft=""))
    assert "no draft → the target" in nd


def test_adapld_summary_is_the_round_sentence_plus_retrieval():
    tr = make_trace()
    tr.rounds[0].extras = {"retrieval": "lexical", "source": "lex2", "suffix": [3, 5],
                           "matches": [], "alpha": [0.5, 0.25]}
    tr.rounds[1].extras = {"retrieval": "off", "source": "lex1", "matches": []}
    s, generic = va.round_summary_html(tr, 0), round_summary_html(tr, 0)
    assert 'class="round-summary adapld-summary"' in s and "lex2" in s and "lexical" in s
    assert "looked up the suffix <code> w4 w5</code>" in s and "chain of 3" in s
    assert "estimates a1=0.50, a2=0.25" in s
    for part in ("accepted <b>1</b>: <code> w10</code>", "rejected 2: <s> w11 w12</s>",
                 "target's correction token: <code> w20</code>", "21 ms"):
        assert part in s and part in generic      # the common sentence, once
    assert "no draft (the source is paused" in va.round_summary_html(tr, 1)
    assert va.round_summary_html(tr, 99) == ""
