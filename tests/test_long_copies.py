"""AdaPLD plans with a measured verify-cost model, and long copies grow while a copy
keeps being accepted and fall back at the first rejection."""
from __future__ import annotations

import random

from specviz.costs import CostModel
from specviz.costs import cost_curve
from specviz.drafters.adapld.control import SourceStats
from specviz.drafters.adapld.drafter import AdaPLDDrafter
from specviz.engine import DecodeSettings
from specviz.run import generate

from test_adapld import synthetic_run


def _document(n: int = 240, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return rng.sample(range(100, 5000), n)   # no repeated token: only the copy predicts it


def _editor(prompt_len: int, doc: list[int], edits: dict[int, int]):
    """A target that rewrites ``doc`` with a few tokens changed (an edit task)."""
    want = [edits.get(i, t) for i, t in enumerate(doc)]

    def truth(tokens, draft):
        k = len(tokens) - prompt_len
        return want[k:k + 70] or [1]
    return truth


def test_long_copies_grow_past_ten_and_fall_back_at_a_rejection():
    doc = _document()
    prompt = doc + [7, 7]                           # "... rewrite it:" then the copy starts
    prompt += doc[:3]                               # the reply has begun copying
    truth = _editor(len(prompt) - 3, doc, {100: 4})  # one changed token at position 100
    drafter = AdaPLDDrafter(semantic="off")
    rounds, tokens = synthetic_run(drafter, prompt, 24, truth)
    lens = [len(r.draft) for r in rounds]
    assert max(lens) >= 32, lens                     # 8 -> 16 -> 32 (-> 64) while accepted
    grown = next(i for i, n in enumerate(lens) if n > 10)
    assert all(r.accepted == len(r.draft) for r in rounds[:grown])
    broke = next(i for i, r in enumerate(rounds) if r.accepted < len(r.draft))
    assert rounds[broke].extras["source"] == "copy" and lens[broke] > 10
    assert lens[broke + 1] <= drafter.max_draft      # fell back fast ...
    assert max(lens[broke + 1:]) > 10                # ... and grew again after the edit
    # right after the edit the copy is re-found next to where it broke (no new search)
    assert any(r.extras["source"] == "copy" for r in rounds[broke + 1:broke + 3])
    assert max(r.extras.get("streak") or 0 for r in rounds) >= 2
    out = [t for r in rounds for t in r.committed]
    want = [4 if i == 100 else t for i, t in enumerate(doc)][3:]
    assert out[:len(want)] == want                   # the whole edited document, in 24 rounds


def test_long_copies_off_when_the_longest_copy_is_the_draft_length():
    doc = _document()
    prompt = doc + [7, 7] + doc[:3]
    rounds, _ = synthetic_run(AdaPLDDrafter(semantic="off", max_draft=8, max_copy=8), prompt, 12,
                               _editor(len(prompt) - 3, doc, {}))
    assert max(len(r.draft) for r in rounds) <= 8


def test_a_steeper_cost_curve_gives_shorter_drafts():
    st = SourceStats(s1=8, f1=2, s2=7, f2=3)          # a1 = 0.8, a2 = 0.7
    flat, cpu = cost_curve("flat"), cost_curve("cpu")
    steep = CostModel.from_points([(1, 1.0), (2, 1.9), (4, 3.5), (8, 7.0), (64, 60.0)])
    d_flat, d_cpu, d_steep = (st.best_length(32, c)[0] for c in (flat, cpu, steep))
    assert d_flat > d_cpu > d_steep >= 1, (d_flat, d_cpu, d_steep)
    # and through the drafter: same text and target, only the curve differs
    pattern = [5, 6, 7, 8, 9, 10, 11, 12]

    def noisy(tokens, d, rng=random.Random(0)):      # follows the cycle, slips now and then
        k = pattern.index(tokens[-1]) + 1 if tokens[-1] in pattern else 0
        return [pattern[(k + j) % 8] if rng.random() > 0.15 else 3 for j in range(40)]

    mean_len = {}
    for name, curve in (("flat", flat), ("steep", steep)):
        drafter = AdaPLDDrafter(semantic="off", max_copy=8, max_draft=16)
        drafter.begin(None, pattern * 3)
        drafter.cost_model = curve
        rounds, _ = synthetic_run(drafter, pattern * 3, 60, noisy, begin=False)
        lens = [r.extras["draft_len"] for r in rounds if r.draft]
        mean_len[name] = sum(lens) / max(1, len(lens))
    assert mean_len["steep"] < mean_len["flat"], mean_len


def test_auto_cost_measures_the_loaded_target_and_rounds_refine_it(tiny_target):
    from specviz.costs import cached_model, clear_cache

    clear_cache()
    ids = [5, 6, 7, 8, 9] * 6
    tr = generate(tiny_target, "adapld", ids, DecodeSettings(max_new_tokens=24))
    model = cached_model(tiny_target)
    assert model is not None and model.kind == "measured"
    assert model.observations >= tr.num_rounds       # every verify forward was observed
    assert all(r.t_forward > 0 for r in tr.rounds)
    assert tr.meta["drafter_config"]["cost"] == "auto"


def test_cost_curve_chart_and_speedup_estimate_read_the_trace():
    from specviz.trace import Round, Trace
    from specviz.viz.charts import fig_cost_curve
    from specviz.viz.stats import speedup_estimate

    cm = CostModel.from_points([(1, 1.0), (2, 1.7), (16, 2.5)], step_time=0.05).to_dict()
    rounds = [Round(index=i, start=10 + 3 * i, drafter="adapld", draft=[1, 2], accepted=2,
                    committed=[1, 2, 3], t_draft=0.001, t_verify=0.09, t_forward=0.085)
              for i in range(4)]
    tr = Trace(meta={"cost_model": cm}, prompt_ids=list(range(10)), rounds=rounds)
    fig = fig_cost_curve(tr)
    assert [d.name for d in fig.data] == ["cost model c(k)", "this run's forwards"]
    assert list(fig.data[1].x) == [3] * 4 and abs(fig.data[1].y[0] - 1.7) < 1e-9
    est = speedup_estimate(tr)  # no plain round: the model's one-token time is the step
    assert est.step_time == 0.05 and abs(est.value - 3 * 0.05 / 0.091) < 1e-9
    assert "verify-cost model" in est.explain()
    empty = fig_cost_curve(Trace(meta={}, prompt_ids=[1], rounds=rounds))
    assert "No verify-cost model" in empty.layout.annotations[0].text


def test_overlapping_copy_drafts_a_loop_past_the_end_of_the_context():
    from specviz.drafters.lookup.index import copy_tokens
    loop = [5, 6, 7]
    tokens = [9, 8] + loop * 3
    # a copy from the last period runs into the drafted tokens themselves (LZ77 overlap)
    assert copy_tokens(tokens, len(tokens) - 3, 10, set()) == (loop * 4)[:10]
    assert copy_tokens(tokens, len(tokens) - 3, 10, {7}) == [5, 6]      # stops before an EOS
    assert copy_tokens(tokens, len(tokens), 4, set()) == []              # nothing to copy


def test_a_text_caught_in_a_loop_is_drafted_at_full_length():
    """A target repeating a short phrase (small models do): once the copy is in step, the
    drafts grow past the loop's period instead of stopping at the end of the context."""
    prompt = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 5, 6, 7]
    loop = [5, 6, 7]

    def truth(tokens, draft):
        k = len(tokens) - len(prompt)
        return [loop[(k + i) % 3] for i in range(70)]
    drafter = AdaPLDDrafter(semantic="off")
    rounds, tokens = synthetic_run(drafter, prompt, 12, truth)
    lens = [len(r.draft) for r in rounds]
    assert max(lens) > 10, lens
    assert all(r.accepted == len(r.draft) for r in rounds), lens
