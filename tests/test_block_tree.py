"""A DFlash block verified as a token tree (specviz.drafters.dflash.block_tree) -- the
best-first tree is the best tree of its size, the cut sizes it by the cost curve, and output
never changes (greedy on tiny models and on real prompts, sampling by chi-square), with one
target forward per round."""
from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from conftest import assert_sampling_lossless, count_forwards, sampling_pair, real_prompt_sets
from test_dflash import qwen3_target  # noqa: F401  (fixture)
from specviz.analysis.lossless import compare_outputs
from specviz.costs import CostModel
from specviz.drafters.dflash.block_cut import BlockCut
from specviz.drafters.dflash.block_tree import best_first, path_confidence, tree_tokens
from specviz.drafters.dflash.checkpoint import new_dflash_for_target
from specviz.drafters.dflash.drafter import DFlashDrafter
from specviz.engine import DecodeSettings, Session
from specviz.errors import SettingsError
from specviz.run import generate
from specviz.tree import TokenTree

STEEP = CostModel.from_points([(1, 1.0), (2, 1.9), (4, 3.5), (8, 7.0)])


def _all_paths(p):
    """Every path (ranks) of every depth with its probability (brute force)."""
    out = []
    for d in range(1, len(p) + 1):
        for ranks in itertools.product(*[range(len(row)) for row in p[:d]]):
            out.append(math.prod(p[j][r] for j, r in enumerate(ranks)))
    return sorted(out, reverse=True)


# ----------------------------------------------------------------------------- pure helpers
def test_best_first_is_the_most_probable_tree_of_every_size():
    rng = random.Random(0)
    for _ in range(20):
        k, R = rng.randint(1, 5), rng.randint(1, 4)
        p = [sorted((rng.random() for _ in range(R)), reverse=True) for _ in range(k)]
        best = _all_paths(p)
        for n in (1, 3, 7, 12, 40):
            nodes = best_first(p, n)
            assert len(nodes) == min(n, len(best))
            # every prefix is a tree: a node's parent comes first and sits one slot above it
            for i, node in enumerate(nodes):
                assert -1 <= node.parent < i
                assert node.slot == (1 if node.parent < 0 else nodes[node.parent].slot + 1)
                parent_p = 1.0 if node.parent < 0 else nodes[node.parent].prob
                assert node.prob == pytest.approx(parent_p * p[node.slot - 1][node.rank])
            probs = [x.prob for x in nodes]
            assert probs == sorted(probs, reverse=True)
            assert probs == pytest.approx(best[:len(nodes)])     # the N most probable paths
            assert len({(x.parent, x.rank) for x in nodes}) == len(nodes)   # no duplicates
    assert best_first([], 5) == [] and best_first([[0.5]], 0) == []


def test_expected_tokens_words_and_what_calibration_learns():
    p = [[0.6, 0.35], [0.5, 0.4]]
    nodes = best_first(p, 4)
    # 0.6 (slot 1 rank 0), 0.35 (s1 r1), 0.6*0.5, 0.6*0.4
    assert [(n.slot, n.rank) for n in nodes] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert [n.prob for n in nodes] == pytest.approx([0.6, 0.35, 0.3, 0.24])
    tokens, parents = tree_tokens(nodes, [[10, 11], [20, 21]])
    assert tokens == [10, 11, 20, 21] and parents == [-1, -1, 0, 0]
    # path [] (slot 1 rejected): depth 1 judged, the drafted mass there 0.95;
    # path [0] (slot 1 accepted): depth 2 judged too, mass under node 0 = 0.9
    assert path_confidence(nodes, p, []) == pytest.approx([0.95])
    assert path_confidence(nodes, p, [0]) == pytest.approx([0.95, 0.9])
    assert path_confidence(nodes, p, [1]) == pytest.approx([0.95])   # node 1 has no children
    chain = best_first([[0.9, 0.05], [0.9, 0.05]], 2)
    assert [n.parent for n in chain] == [-1, 0]


def test_the_cut_sizes_the_tree_by_the_cost_curve():
    p = [[0.5, 0.3, 0.1, 0.05], [0.5, 0.3, 0.1, 0.05], [0.5, 0.2, 0.1, 0.05]]
    flat_nodes, v_flat = BlockCut(CostModel.flat()).choose_tree(p, 16)
    steep_nodes, _ = BlockCut(STEEP).choose_tree(p, 16)
    assert len(flat_nodes) == 16 and len(v_flat) == 17 and v_flat[0] == 1.0
    assert len(steep_nodes) < len(flat_nodes)
    assert BlockCut(STEEP).choose_tree([[0.1, 0.05]] * 3, 16)[0] == []   # nothing pays
    # what the calibration learnt applies to every word of a slot
    cut = BlockCut(CostModel.flat())
    for _ in range(30):
        cut.observe([0.8], kept=1, accepted=0)       # depth 1 always judged and rejected
    assert cut.factor(0) < 0.1
    assert sum(n.prob for n in cut.choose_tree(p, 16)[0]) < 0.5
    # the gate is charged the tree's width, not its depth
    seen = []
    cut.gate = type("G", (), {"observe": lambda self, i, done, cost: seen.append(cost)})()
    cut.observe([0.9], kept=1, accepted=1, nodes=10)
    assert seen == [pytest.approx(cut.cost.relative(11) + cut.draft_cost)]


# ----------------------------------------------------------------------------- the drafter
def _tree_drafter(target, seed, block_size=6, **kw):
    model = new_dflash_for_target(target, num_layers=1, block_size=block_size, seed=seed)
    return DFlashDrafter(target, model=model, **kw)


def test_bad_tree_settings_and_where_trees_are_not_drafted(tiny_target, monkeypatch):
    for bad in (-1, 65, "x"):
        with pytest.raises(SettingsError):
            _tree_drafter(tiny_target, 0, tree=bad)
    ids = [5, 6, 7, 8, 9]
    s = DecodeSettings(max_new_tokens=6)
    # sampled drafts (q of a chain) and padded targets (first branch only) draft chains
    tr = Session(tiny_target, _tree_drafter(tiny_target, 1, tree=8, cut="off",
                                            draft_temperature=1.0), ids,
                 DecodeSettings(max_new_tokens=6, temperature=1.0)).run()
    assert not any(r.is_tree for r in tr.rounds)
    monkeypatch.setattr(tiny_target, "min_width", 4, raising=False)
    tr = Session(tiny_target, _tree_drafter(tiny_target, 1, tree=8, cut="off"), ids, s).run()
    assert not any(r.is_tree for r in tr.rounds)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_greedy_lossless_with_trees_and_one_forward_per_round(kind, tiny_target, qwen3_target,
                                                               monkeypatch):
    """Random drafters, trees of 2-24 nodes (cut off: exactly that many where the block has
    room; cut auto: what pays on a sloped curve): output is plain greedy, every round one target
    forward, the drafter's context follows the accepted path."""
    target = tiny_target if kind == "llama" else qwen3_target
    vocab = target.model.config.vocab_size
    calls = count_forwards(monkeypatch, target)
    rng = random.Random(12)
    trees = 0
    for i in range(8):
        ids = [rng.randrange(2, vocab) for _ in range(rng.randint(2, 25))]
        s = DecodeSettings(max_new_tokens=rng.randint(8, 24))
        n = rng.choice([2, 5, 9, 24])
        drafter = _tree_drafter(target, i, block_size=rng.choice([3, 6, 8]), tree=n,
                                cut="off" if i % 2 else "block")
        ar = generate(target, "ar", ids, s).output_ids
        calls["n"] = 0
        sess = Session(target, drafter, ids, s)
        prefill = calls["n"]
        while sess.step() is not None:
            assert drafter.context_len == len(sess.tokens) - 1
        tr = sess.trace()
        assert calls["n"] - prefill == tr.num_rounds
        rep = compare_outputs(target, ids, ar, tr.output_ids)
        assert rep.ok and tr.output_ids == ar, f"{kind} prompt {i}: diverged at {rep.first_divergence}"
        done = 0
        for r in tr.rounds:
            # cut off: exactly the node budget, or every path the round's slots allow
            k = min(drafter.block_size - 1, s.max_new_tokens - done - 1)
            if i % 2:
                assert len(r.draft) == min(n, sum(4 ** d for d in range(1, k + 1)))
            done += len(r.committed)
            if r.is_tree:
                trees += 1
                tree = r.tree
                assert len(r.extras["tree_slots"]) == len(r.draft)
                assert tree.depths == r.extras["tree_slots"]
    assert trees > 10


def test_trees_are_accepted_along_second_choices(tiny_target, monkeypatch):
    """A drafter whose SECOND word per slot is the target's (the first is wrong): a chain gets
    nothing, the tree gets long accepts through rank-1 nodes -- same output, far fewer rounds."""
    target = tiny_target
    rng = random.Random(5)
    for i in range(4):
        ids = [rng.randrange(2, 64) for _ in range(rng.randint(3, 20))]
        s = DecodeSettings(max_new_tokens=24)
        ar = generate(target, "ar", ids, s).output_ids
        truth = ids + ar + [0] * 16

        def run(tree):
            drafter = _tree_drafter(target, i, block_size=5, tree=tree, cut="off")

            def second_best(tokens, k, _d=drafter):
                nxt = truth[len(tokens):len(tokens) + _d.block_size - 1]
                logits = torch.full((_d.block_size - 1, 64), -10.0)
                logits[torch.arange(len(nxt)), torch.tensor(nxt)] = 4.0
                logits[torch.arange(len(nxt)), (torch.tensor(nxt) + 1) % 64] = 5.0
                return logits[:k], None

            monkeypatch.setattr(drafter, "greedy_scores", second_best)
            return Session(target, drafter, ids, s).run()

        chain, tree = run(0), run(30)
        assert chain.output_ids == ar and tree.output_ids == ar
        assert chain.tau == 1.0
        assert tree.tau > 2.0, tree.tau
        ranks = {r.extras["tree_ranks"][n] for r in tree.rounds if r.is_tree for n in r.path}
        assert 1 in ranks


def test_sampling_with_trees_keeps_target_distribution():
    target, model = sampling_pair()
    assert_sampling_lossless(target, [3, 7, 5], lambda seed: DFlashDrafter(
        target, model=model, tree=6, cut="off", seed=seed), min_trees=101)


def test_tree_rounds_record_and_describe_their_cut(tiny_target):
    from specviz.viz.extras import describe_extras

    drafter = _tree_drafter(tiny_target, 3, block_size=8, tree=12, cut="block")
    drafter.cut = None
    sess = Session(tiny_target, drafter, [4, 5, 6, 7], DecodeSettings(max_new_tokens=12))
    drafter.cut = BlockCut(CostModel.flat())       # a flat curve: the whole budget pays
    r = sess.step()
    c = r.extras["cut"]
    assert c["tree"] and c["kept"] == len(r.draft) == 12 and c["block"] == 7
    assert len(c["value"]) == 13 and len(c["block_confidence"]) == 7
    assert len(r.extras["confidence"]) == len(r.draft) and r.q_draft == r.extras["confidence"]
    assert "tree of 12" in describe_extras(r)
    assert isinstance(r.tree, TokenTree) and max(r.tree.depths) <= 7


# ----------------------------------------------------------------------------- real model
@pytest.mark.integration
@pytest.mark.parametrize("per_category", real_prompt_sets(4))
def test_bundled_drafter_with_trees_is_lossless_on_real_prompts(embedded_target, per_category):
    """The bundled drafter drafting trees under the default cut: greedy lossless on the example prompts,
    some rounds accepted through a second-choice word."""
    from conftest import lossless_on_examples

    runs = lossless_on_examples(embedded_target, "dflash", per_category, 1, start=2, tree=16)
    rounds = [r for _, df, _ in runs for r in df.rounds]
    trees = [r for r in rounds if r.is_tree]
    assert trees, "no round drafted a tree"
    assert any(r.extras["tree_ranks"][n] > 0 for r in trees for n in r.path)
    for r in trees:
        assert len(r.draft) <= r.extras["cut"]["kept"] <= 16


def test_views_of_a_tree_round(tiny_target):
    """The decode page's charts read tree rounds: per-slot bars from the block's top words,
    calibration over every judged node, the tree with each node's rank in its slot."""
    from specviz.viz.charts import confidence_calibration, fig_slot_confidence
    from specviz.viz.tree import block_tree_figure

    drafter = _tree_drafter(tiny_target, 3, block_size=6, tree=12, cut="off")
    tr = Session(tiny_target, drafter, [4, 5, 6, 7], DecodeSettings(max_new_tokens=16)).run()
    i = next(i for i, r in enumerate(tr.rounds) if r.is_tree)
    r = tr.rounds[i]
    r.extras["cut"] = {"kept": len(r.draft), "block": 5, "tree": True,
                       "block_confidence": [0.5] * 5, "value": [1.0] * (len(r.draft) + 1)}
    fig = fig_slot_confidence(tr, i)
    assert "tree of 12 nodes" in fig.layout.title.text
    bars = [t for t in fig.data if t.type == "bar"]
    assert sum(len(t.x) for t in bars) == 5
    judged = sum(s != "not_reached" for r in tr.rounds if r.is_tree for s in r.node_status())
    assert int(confidence_calibration(tr)["judged"].sum()) >= judged > 0
    tree = block_tree_figure(tr, i)
    hovers = " ".join(str(h) for t in tree.data for h in (t.hovertext or []))
    assert "the slot's top word" in hovers and "2nd word" in hovers


@pytest.mark.integration
def test_the_decode_page_draws_a_tree_round():
    """The app with the bundled drafter verifying whole trees (cut off): the round is a tree,
    the decode page draws it (AppTest)."""
    from test_app import assert_clean, new_app

    at = new_app()
    at.selectbox(key="method").set_value("dflash").run()
    at.selectbox(key="param_dflash_cut").set_value("off").run()
    assert_clean(at)
    at.button(key="next").click().run()
    assert_clean(at)
    trace = at.session_state["dec_trace"]
    assert trace.meta["drafter_config"]["tree"] == 16 and trace.rounds[-1].is_tree
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    assert any("most probable paths first" in s for s in specs)
    assert any("verified as a tree of" in s for s in specs)
