"""The one definition of each metric (specviz.metrics): tau, target forwards, speedup,
tokens/s and the lossless verdict, and that the bench table, the Compare tables, the CLI summary
and Trace agree on them (hand-made rounds, no model, milliseconds)."""
from __future__ import annotations

import pytest

from specviz import metrics
from specviz.analysis.lossless import LosslessReport, compare_outputs, lossless_verdict
from specviz.bench import BenchResult, PromptItem, bench_row
from specviz.trace import Round, Trace
from specviz.viz.tables import (CompareRun, compare_runs_table, compare_summary_table,
                                compare_verdict)


def _trace(method: str, rounds: list[Round], temperature: float = 0.0) -> Trace:
    return Trace(meta={"method": method, "settings": {"temperature": temperature}},
                 prompt_ids=[1, 2, 3], rounds=rounds, token_texts={})


def ar_trace(tokens: list[int], temperature: float = 0.0) -> Trace:
    """Plain decoding: one token per round, no draft."""
    return _trace("ar", [Round(index=i, start=3 + i, drafter="ar", draft=[], accepted=0,
                               committed=[t], t_verify=0.01) for i, t in enumerate(tokens)],
                  temperature)


def cut_trace() -> Trace:
    """Two PLD rounds, 7 tokens, max_new_tokens = 7: round 1 accepts its whole draft of 3 and
    adds the bonus token (4 committed); round 2 accepts its whole draft of 3 too, but the budget
    leaves room for those 3 only, so no bonus token is committed."""
    return _trace("pld", [
        Round(index=0, start=3, drafter="pld", draft=[5, 6, 7], accepted=3,
              committed=[5, 6, 7, 8], t_verify=0.02),
        Round(index=1, start=7, drafter="pld", draft=[9, 10, 11], accepted=3,
              committed=[9, 10, 11], t_verify=0.02),
    ])


OUT = [5, 6, 7, 8, 9, 10, 11]


# ---------------------------------------------------------------- tau and forwards
def test_tau_counts_committed_tokens_when_the_budget_cuts_the_last_round():
    tr = cut_trace()
    assert tr.new_tokens == 7 and tr.target_forwards == 2
    assert tr.tau == metrics.tau(7, 2) == metrics.rounds_tau(tr.rounds) == 3.5
    # the per-round mean of (accepted + 1) would say 4.0: the cut round's bonus was never made
    assert sum(r.accepted + 1 for r in tr.rounds) / len(tr.rounds) == 4.0
    assert tr.tau * tr.target_forwards == tr.new_tokens
    assert tr.summary()["tau"] == 3.5 and tr.summary()["target_forwards"] == 2


def test_tau_forwards_edge_cases():
    assert metrics.tau(0, 0) == 0.0 and _trace("pld", []).tau == 0.0
    assert metrics.target_forwards([]) == 0
    ar = ar_trace(OUT)
    assert ar.tau == 1.0 and ar.target_forwards == len(OUT)   # prefill not counted


def test_speedup_and_tokens_per_s():
    assert metrics.speedup(2.0, 1.0) == 2.0
    assert metrics.speedup(None, 1.0) is None and metrics.speedup(2.0, 0.0) is None
    assert metrics.speedup(0.0, 1.0) is None
    assert metrics.tokens_per_s(10, 2.0) == 5.0 and metrics.tokens_per_s(10, 0) is None
    assert _trace("pld", []).tokens_per_s == 0.0
    assert cut_trace().tokens_per_s == pytest.approx(7 / 0.04)


# ---------------------------------------------------------------- every view agrees
def test_bench_compare_and_trace_agree_on_the_same_runs():
    ar, pld = ar_trace(OUT), cut_trace()
    item = PromptItem("p1", "cat", "text")
    res = BenchResult(rows=[bench_row(item, "ar", ar.rounds, ar.output_ids, 2.0),
                            bench_row(item, "pld", pld.rounds, pld.output_ids, 1.6)],
                      meta={"settings": {"temperature": 0.0}})
    res.rows[1].identical_to_ar = True
    bench = {(r["method"], r["category"]): r for r in res.table()}["pld", "all"]
    runs = [CompareRun("p1", "P1", "ar", ar, 2.0), CompareRun("p1", "P1", "pld", pld, 1.6)]
    per = compare_runs_table(runs).set_index("method").loc["pld"]
    summ = compare_summary_table(runs).set_index("method").loc["pld"]
    for view in (bench, per, summ):
        assert view["tau"] == pytest.approx(pld.tau) == 3.5
        assert view["target_forwards"] == pld.target_forwards == 2
        assert view["speedup_vs_ar"] == pytest.approx(metrics.speedup(2.0, 1.6)) == 1.25
    assert res.rows[1].tau == 3.5 and res.rows[1].rounds == 2
    assert bench["identical_to_ar"] == "1/1" and bool(per["identical_to_ar"])


def test_cli_summary_uses_the_trace_metrics(capsys):
    from specviz.cli import print_summary

    print_summary(cut_trace())
    out = capsys.readouterr().out
    assert "tau=3.50" in out and "target forwards=2" in out and "new tokens=7" in out


# ---------------------------------------------------------------- lossless verdict
def test_verdict_identical():
    v = lossless_verdict([True, LosslessReport(True), None])
    assert (v.compared, v.identical, v.near_ties, v.ok, v.level) == (2, 2, 0, True, "success")
    assert v.count == "2/2" and "lossless" in v.message


def test_verdict_different_counts_near_ties():
    v = lossless_verdict([True, LosslessReport(False, 4, 2e-4, near_tie=True),
                                  LosslessReport(False, 2, 0.5), False])
    assert (v.compared, v.identical, v.near_ties, v.different) == (4, 1, 1, 3)
    assert not v.ok and v.level == "warning" and v.count == "1/4"
    assert "3 of 4 run(s) differ" in v.message and "1 of them" in v.message
    assert lossless_verdict([LosslessReport(False, 1, 1e-4, near_tie=True)]).ok


def test_verdict_sampling_is_not_compared():
    v = lossless_verdict([False, True], greedy=False)
    assert v.compared == 0 and v.ok is None and v.level == "info" and v.count == ""
    assert "not compared" in v.message
    empty = lossless_verdict([])
    assert empty.ok is None and empty.level == "info"


def test_compare_and_bench_verdicts():
    ar, pld = ar_trace(OUT), cut_trace()
    other = ar_trace([5, 6, 99, 8, 9, 10, 11])
    runs = [CompareRun("p1", "P1", "ar", ar, 1.0), CompareRun("p1", "P1", "pld", pld, 1.0),
            CompareRun("p1", "P1", "x", other, 1.0)]
    v = compare_verdict(runs)          # no target: divergences are not tie-checked
    assert (v.compared, v.identical, v.near_ties) == (2, 1, 0) and v.level == "warning"
    samp = [CompareRun("p1", "P1", m, t, 1.0) for m, t in
            (("ar", ar_trace(OUT, 0.8)), ("pld", ar_trace([1], 0.8)))]
    assert compare_verdict(samp).level == "info"
    rep = compare_outputs(None, [1, 2, 3], ar.output_ids, other.output_ids)
    assert rep.first_divergence == 2 and not rep.identical and not rep.near_tie
    item = PromptItem("p1", "cat", "text")
    res = BenchResult(rows=[bench_row(item, "pld", pld.rounds, pld.output_ids, 1.0)],
                      meta={"settings": {"temperature": 0.0}})
    res.rows[0].identical_to_ar, res.rows[0].near_tie = False, True
    assert res.verdict().near_ties == 1 and res.verdict().ok
