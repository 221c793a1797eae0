"""DFlash + AdaPLD (specviz.drafters.hybrid): the merged tree, each drafter's own view of a
round, losslessness (greedy and sampled), one target forward per round, the forward gate told
what the block added, and the bundled drafter on real prompts."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from conftest import (assert_sampling_lossless, count_forwards, real_prompt_sets,
                      repetitive_prompt, sampling_pair)
from specviz.analysis.lossless import compare_outputs
from specviz.drafters import make_drafter
from specviz.drafters.base import Draft
from specviz.drafters.dflash.checkpoint import new_dflash_for_target
from specviz.drafters.hybrid import HybridDrafter, branches, matched_path, merge, own_round
from specviz.engine import DecodeSettings, Session
from specviz.run import generate
from specviz.trace import Round
from specviz.tree import TokenTree


# ----------------------------------------------------------------------------- pure helpers
def test_merge_puts_the_block_first_and_labels_every_node():
    block = Draft(tokens=[5, 6, 7], q_token=[0.9, 0.8, 0.7])
    lookup = Draft(tokens=[5, 9, 4, 8], parents=[-1, 0, 1, 0])   # 5 -> 9 -> 4, 5 -> 8
    merged, source = merge(block, lookup)
    tree = TokenTree(merged.tokens, merged.parents)
    assert merged.tokens[:3] == [5, 6, 7] and merged.parents[:3] == [-1, 0, 1]
    assert sorted(tuple(tree.tokens[i] for i in tree.path_to(leaf)) for leaf in tree.leaves()) \
        == [(5, 6, 7), (5, 8), (5, 9, 4)]
    assert source[0] == "both" and source[1:3] == ["block", "block"]
    assert source[3:] == ["lookup"] * (len(merged.tokens) - 3)
    assert merged.q_token[:3] == [0.9, 0.8, 0.7] and merged.q_token[3:] == [None] * 3
    # one side empty: the other unchanged (a chain stays a chain)
    assert merge(block, Draft())[0] is block and merge(Draft(), lookup)[0] is lookup
    # a lookup chain that is a prefix of the block: still one chain
    chain, src = merge(block, Draft(tokens=[5, 6]))
    assert chain.parents is None and chain.tokens == [5, 6, 7] and src == ["both", "both", "block"]


def test_merge_keeps_a_block_tree_first():
    """A block verified as a tree (the DFlash default): its nodes keep their numbers, so its
    per-node extras index the merged draft; lookup branches reuse what the tree spells."""
    block = Draft(tokens=[5, 9, 6, 7], parents=[-1, -1, 0, 2], q_token=[0.6, 0.3, 0.5, 0.4])
    lookup = Draft(tokens=[5, 6, 8])                 # 5 -> 6 exists in the tree, 8 is new
    merged, source = merge(block, lookup)
    assert merged.tokens[:4] == block.tokens and merged.parents[:4] == block.parents
    assert merged.tokens[4:] == [8] and merged.parents[4:] == [2]
    assert source == ["both", "block", "both", "block", "lookup"]
    assert merged.q_token == [0.6, 0.3, 0.5, 0.4, None]


def test_branches_and_matched_path():
    d = Draft(tokens=[1, 2, 3, 4], parents=[-1, 0, -1, 2])
    assert branches(d) == [[1, 2], [3, 4]]
    assert branches(Draft(tokens=[7, 8])) == [[7, 8]]
    tree = TokenTree(d.tokens, d.parents)
    assert matched_path(tree, [3, 4, 9]) == [2, 3]
    assert matched_path(tree, [1, 9]) == [0]
    assert matched_path(tree, [9]) == []


def _round(draft, parents, committed):
    return Round(index=3, start=10, drafter="dflash_adapld", draft=draft, accepted=0,
                 committed=committed, parents=parents)


def test_own_round_is_what_the_draft_alone_would_have_had_accepted():
    rnd = _round([5, 6, 7, 9], None, [5, 6, 2])   # the merged round: whatever it was
    own = own_round(rnd, Draft(tokens=[5, 6, 7]))
    assert own.accepted == 2 and own.draft == [5, 6, 7] and own.parents is None
    assert own.committed == [5, 6, 2] and own.index == 3
    # a tree: its own accepted path, in its own node numbering
    own = own_round(rnd, Draft(tokens=[4, 5, 6], parents=[-1, -1, 1]))
    assert own.accepted == 2 and own.accepted_path == [1, 2]
    # a draft that matched every committed token: clipped there, fully accepted (censored)
    own = own_round(_round([1], None, [5, 6]), Draft(tokens=[5, 6, 7, 8]))
    assert own.draft == [5, 6] and own.accepted == 2
    own = own_round(_round([1], None, [5, 6]), Draft(tokens=[5, 6, 7, 3], parents=[-1, 0, 1, -1]))
    assert own.draft == [5, 6, 3] and own.parents == [-1, 0, -1] and own.accepted_path == [0, 1]
    assert own_round(rnd, Draft()).accepted == 0


def test_the_cut_weighs_block_slots_by_what_the_lookup_would_miss():
    """A lookup draft that is surely right makes the block's slots worthless (k = 0); one that
    is surely wrong leaves the cut as without it, only shifted along the cost curve."""
    from specviz.costs import CostModel
    from specviz.drafters.dflash.block_cut import BlockCut, SharedDraft

    sloped = CostModel.from_points([(1, 1.0), (2, 1.1), (4, 1.2), (8, 1.4), (16, 1.8)])
    conf = [0.9, 0.8, 0.7, 0.6, 0.3, 0.2, 0.1]
    cut = BlockCut(sloped)
    alone, _ = cut.choose(conf)
    assert alone >= 3
    assert cut.choose(conf, SharedDraft(4, (1.0,) * 4))[0] == 0
    beside_wrong, value = cut.choose(conf, SharedDraft(4, (0.0,) * 4))
    assert 1 <= beside_wrong <= alone and len(value) == len(conf) + 1
    assert cut.choose(conf, None) == cut.choose(conf)
    # the same for a block verified as a tree
    p = [[c, (1 - c) / 2] for c in conf]
    tree_alone, _ = cut.choose_tree(p, 16)
    assert len(tree_alone) >= 3
    assert cut.choose_tree(p, 16, SharedDraft(4, (1.0,) * 4))[0] == []
    wrong, value = cut.choose_tree(p, 16, SharedDraft(4, (0.0,) * 4))
    assert 1 <= len(wrong) <= len(tree_alone) and len(value) == 17


# ----------------------------------------------------------------------------- losslessness
def _hybrid(target, seed, lookup="adapld", **kw):
    model = new_dflash_for_target(target, num_layers=1, block_size=5, seed=seed)
    return HybridDrafter(target, lookup=lookup, model=model, **kw)


@pytest.mark.parametrize("lookup", ["adapld", "pld"])
def test_greedy_lossless_with_trees_and_one_forward_per_round(lookup, tiny_target, monkeypatch):
    """A block that knows the answer on some rounds and a lookup that copies on others: the
    merged trees are accepted along either drafter's branch, output equals plain greedy, and
    every round is one target forward."""
    target = tiny_target
    rng = random.Random(3)
    calls = count_forwards(monkeypatch, target)
    sources, trees = set(), 0
    for i in range(6):
        ids = repetitive_prompt(rng, 64, rng.randint(12, 30))
        s = DecodeSettings(max_new_tokens=rng.randint(12, 30))
        ar = generate(target, "ar", ids, s).output_ids
        truth = ids + ar + [0] * 16
        drafter = _hybrid(target, i, lookup=lookup, cut="off")
        B = drafter.block.block_size

        def scores(tokens, k, _truth=truth, _i=i):   # right on every other round
            n = len(tokens)
            nxt = _truth[n:n + B - 1] if (n + _i) % 2 else [(t + 1) % 64 for t in _truth[n:n + B - 1]]
            logits = torch.full((B - 1, 64), -10.0)
            logits[torch.arange(len(nxt)), torch.tensor(nxt)] = 10.0
            return logits[:k], None

        monkeypatch.setattr(drafter.block, "greedy_scores", scores)
        calls["n"] = 0
        sess = Session(target, drafter, ids, s)
        prefill = calls["n"]
        while sess.step() is not None:
            assert drafter.block.context_len == len(sess.tokens) - 1
        tr = sess.trace()
        assert calls["n"] - prefill == tr.num_rounds
        rep = compare_outputs(target, ids, ar, tr.output_ids)
        assert rep.ok and tr.output_ids == ar, f"prompt {i} diverged at {rep.first_divergence}"
        for r in tr.rounds:
            src = r.extras["hybrid"]["source"]
            assert len(src) == len(r.draft)
            sources.update(src[n] for n in r.path)
            block_tree = r.extras.get("tree_slots")
            if block_tree:     # the block drafted a tree: its nodes come first
                trees += 1
                assert src[:len(block_tree)].count("lookup") == 0
    assert {"block", "lookup"} <= sources, sources
    assert trees > 0


def test_a_padded_target_verifies_one_drafters_draft_per_round(tiny_target, monkeypatch):
    """Width-invariant numerics (forwards padded to min_width): only a tree's first branch is
    exact, so each round drafts the lookup's draft or else the block's, never a merged tree;
    greedy output is still plain greedy."""
    monkeypatch.setattr(tiny_target, "min_width", 4, raising=False)
    rng = random.Random(8)
    for i in range(4):
        ids = repetitive_prompt(rng, 64, 20)
        s = DecodeSettings(max_new_tokens=20)
        ar = generate(tiny_target, "ar", ids, s).output_ids
        tr = Session(tiny_target, _hybrid(tiny_target, i, lookup="pld", cut="off"), ids, s).run()
        assert tr.output_ids == ar
        for r in tr.rounds:
            h = r.extras["hybrid"]
            assert not (h["block_nodes"] and h["lookup_nodes"]), h


def test_sampling_keeps_target_distribution():
    target, model = sampling_pair()
    assert_sampling_lossless(target, [3, 7, 5, 3, 7, 5, 3, 7], lambda seed: HybridDrafter(
        target, lookup="pld", model=model, cut="off"), min_trees=101)


# ----------------------------------------------------------------------------- the gate
def test_the_gate_is_told_what_the_block_added(tiny_target, monkeypatch):
    """Where lookup already drafts the committed text, the block added nothing: the gate hears
    one token at one step plus the block's own cost; alone, it hears the block's tokens."""
    target = tiny_target
    drafter = _hybrid(target, 0, lookup="pld")
    ids = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    Session(target, drafter, ids, DecodeSettings(max_new_tokens=8))   # begin(): prefill, cut
    heard = []
    monkeypatch.setattr(drafter.block.cut, "observe",
                        lambda conf, kept, acc, s, i, committed=None, gate_cost=None, **kw:
                        heard.append((kept, acc, committed, gate_cost)))
    block = Draft(tokens=[7, 8, 1])
    for lookup, expect_committed in ((Draft(tokens=[7, 8, 5]), 1), (Draft(), 3)):
        merged, _ = merge(block, lookup)
        rnd = Round(index=0, start=len(ids), drafter="x", draft=merged.tokens, accepted=2,
                    committed=[7, 8, 5], parents=merged.parents)
        drafter._drafts = (block, lookup, 0.001)
        drafter.block._last_cut = ([0.9, 0.8, 0.7], 3)
        monkeypatch.setattr(drafter.block, "observe_context", lambda fb: None)
        from specviz.drafters.base import VerifyFeedback
        drafter.observe(VerifyFeedback(round=rnd, logits=None))
        kept, acc, committed, gate_cost = heard[-1]
        assert (kept, acc, committed) == (3, 2, expect_committed)
        assert gate_cost >= 1.0 + drafter.block.cut.draft_cost - 1e-9


# ----------------------------------------------------------------------------- registry, bad input
def test_bad_settings_fail_clearly(tiny_target):
    from specviz.errors import SettingsError

    with pytest.raises(SettingsError, match="Lookup drafter"):
        make_drafter("dflash_adapld", tiny_target, lookup="medusa")
    with pytest.raises(SettingsError, match="trained drafter"):
        make_drafter("dflash_adapld", tiny_target)   # no bundled drafter for the tiny target


@pytest.mark.integration
@pytest.mark.parametrize("per_category", real_prompt_sets(4))
def test_bundled_hybrid_greedy_lossless_on_real_prompts(embedded_target, per_category):
    """The bundled DFlash drafter + AdaPLD on real prompts: greedy lossless, with rounds
    accepted along the block's nodes and along lookup-only nodes, and a higher tau than the
    block alone on the same prompts."""
    from conftest import lossless_on_examples

    runs = lossless_on_examples(embedded_target, "dflash_adapld", per_category, 1, start=4)
    won = {"block": 0, "lookup": 0, "both": 0}
    for _, tr, _ in runs:
        for r in tr.rounds:
            src = r.extras["hybrid"]["source"]
            if r.path:
                won[src[r.path[-1]]] += 1
    assert won["block"] > 0 and won["lookup"] > 0, won
    tokens = sum(len(tr.output_ids) for _, tr, _ in runs)
    rounds = sum(tr.num_rounds for _, tr, _ in runs)
    assert tokens / rounds > 1.5, f"tau {tokens / rounds:.2f}"


@pytest.mark.integration
def test_the_app_runs_the_hybrid_and_the_adapld_page_shows_its_tree():
    """Decode page: DFlash + AdaPLD round by round, no error; the AdaPLD page opens on that run
    (its lookup extras) and the tree's hover says which drafter proposed each node."""
    from streamlit.testing.v1 import AppTest

    from specviz.viz import adapld as va

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"),
                          default_timeout=180)
    at.run()
    at.selectbox(key="method").set_value("dflash_adapld").run()
    for _ in range(4):
        at.button(key="next").click().run()
    assert not at.exception and not at.error, [e.value for e in at.exception or at.error]
    dec = at.session_state["dec_trace"]
    assert dec.meta["method"] == "dflash_adapld" and dec.num_rounds == 4
    assert all("hybrid" in r.extras for r in dec.rounds)
    at.switch_page("pages/adapld.py").run()
    assert not at.exception and not at.error, [e.value for e in at.exception or at.error]
    assert at.session_state["ada_source"] == "decode"
    assert len(at.get("plotly_chart")) >= 1
    for i, r in enumerate(dec.rounds):
        src = r.extras["hybrid"]["source"]
        if "block" in src or "both" in src:
            assert "drafted by the DFlash block" in va.branch_tree_figure(dec, i).to_json()
