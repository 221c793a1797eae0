"""Rejected-suffix alignment on hand-made traces: offsets, top-k hits, partners, tree rounds."""
from __future__ import annotations

import json

from specviz.analysis.alignment import by_category, by_slot, rejected_tokens, summarize
from specviz.trace import Round, Trace


def make_trace() -> Trace:
    """Prompt [1, 2]; final output 10 11 12 13 14 15 16.

    Round 0 drafts 10 99 11 12 at positions 2..5: accepts 10, the target says 11 at 3, so 99
    (slot 1, never matches) and 11, 12 are rejected -- 11 and 12 were right one position
    earlier (the drafter inserted a token). Round 1 drafts for positions 4.. (partners of the
    tokens drafted for 4 and 5)."""
    r0 = Round(index=0, start=2, drafter="dflash", draft=[10, 99, 11, 12], accepted=1,
               committed=[10, 11],
               extras={"topk": [[10, 5], [99, 11], [11, 7], [8, 9]]})
    r1 = Round(index=1, start=4, drafter="dflash", draft=[12, 13, 14], accepted=3,
               committed=[12, 13, 14, 15])
    tree = Round(index=2, start=8, drafter="x", draft=[16, 3], accepted=1, committed=[16],
                 parents=[-1, -1], accepted_path=[0])
    return Trace(meta={}, prompt_ids=[1, 2], rounds=[r0, r1, tree])


def test_rejected_tokens_are_aligned_with_the_final_text():
    toks = rejected_tokens(make_trace())
    assert [(t.slot, t.position, t.token) for t in toks] == [(1, 3, 99), (2, 4, 11), (3, 5, 12)]
    assert [t.exact for t in toks] == [False, False, False]
    assert [t.best_offset for t in toks] == [None, -1, -1]
    # the final text holds 11 at position 3 and 12 at 4: one position EARLIER than drafted
    assert toks[1].matches[-1] and toks[2].matches[-1] and not toks[1].matches[1]
    assert [t.topk_hit for t in toks] == [True, False, False]  # final 11 at 3 in [99, 11]
    assert [t.partner for t in toks] == [False, True, True]


def test_summaries_by_slot_and_category():
    toks = rejected_tokens(make_trace())
    s = summarize(toks)
    assert s.rejected == 3 and s.exact == 0.0 and abs(s.best_offset - 2 / 3) < 1e-9
    assert abs(s.topk - 1 / 3) < 1e-9 and abs(s.partner - 2 / 3) < 1e-9
    assert abs(s.by_offset[-1] - 2 / 3) < 1e-9 and s.by_offset[0] == 0.0
    slots = by_slot(toks)
    assert list(slots) == [1, 2, 3] and slots[1].best_offset == 0.0 and slots[2].exact == 0.0
    cats = by_category({"code": [make_trace()], "empty": []})
    assert cats["all"].rejected == 3 and cats["empty"].rejected == 0
    assert cats["empty"].exact is None


def test_alignment_table_and_align_cli(tmp_path, capsys):
    from specviz.analysis.alignment import table_rows
    from specviz.cli import main

    from test_retrace_page import make_retrace_trace

    tr = make_retrace_trace()
    rows = table_rows({"dflash": {"qa": [tr]}})
    by = {r["slot"]: r for r in rows}
    assert by[1]["exact"] == 0.0 and by[2]["exact"] == 1.0 and by["all"]["rejected"] == 5
    assert by["all (qa)"]["rejected"] == 5
    folder = tmp_path / "traces" / "dflash" / "qa"
    folder.mkdir(parents=True)
    tr.save(folder / "p1.json")
    assert main(["align", str(tmp_path / "traces"), "--out", str(tmp_path / "a.csv")]) == 0
    out = capsys.readouterr().out
    assert "dflash" in out and "all (qa)" in out
    assert (tmp_path / "a.csv").read_text().startswith("method,slot,rejected")
    prov = json.loads((tmp_path / "a.provenance.json").read_text())   # beside the CSV
    assert prov["command"] and prov["commit"]
    assert main(["align", str(tmp_path / "nope")]) == 2
