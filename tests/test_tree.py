"""The tree as the one shared reading of a round: node status, depth, children, accepted path,
rejected nodes and the target token's kind, on chains (one-branch trees) and trees."""
from __future__ import annotations

import pytest
import torch

from specviz.tree import TokenTree
from specviz.trace import Round
from specviz.verify import Verdict, verify


def tree_round(**kw) -> Round:
    """root ─ 0 ─ 1 ─ 2 ─ 3 / 1 ─ 6 ; root ─ 4 ─ 5 ; accepted path 0 -> 1."""
    base = dict(index=0, start=10, drafter="x", draft=[20, 21, 22, 23, 24, 25, 26], accepted=2,
                committed=[20, 21, 30], parents=[-1, 0, 1, 2, -1, 4, 1], accepted_path=[0, 1])
    base.update(kw)
    return Round(**base)


def test_chain_node_status_marks_the_first_mismatch_apart():
    t = TokenTree.chain([5, 6, 7, 8])
    assert t.node_status([0]) == ["accepted", "first_rejected", "not_reached", "not_reached"]
    assert t.node_status([]) == ["first_rejected", "not_reached", "not_reached", "not_reached"]
    assert t.node_status([0, 1, 2, 3]) == ["accepted"] * 4
    assert TokenTree.chain([]).node_status([]) == []


def test_tree_node_status_children_depths_and_rows():
    t = tree_round().tree
    assert t.depths == [1, 2, 3, 4, 1, 2, 3] and t.depth == 4
    assert t.children_map() == {-1: [0, 4], 0: [1], 1: [2, 6], 2: [3], 4: [5]}
    assert t.node_status([0, 1]) == ["accepted", "accepted", "first_rejected", "not_reached",
                                     "rejected", "not_reached", "first_rejected"]
    assert t.node_status([0, 1], sampling=True)[4] == "not_reached"  # tried after the accepted
    assert [TokenTree.row_of(p) for p in t.parents] == [0, 1, 2, 3, 0, 5, 2]


def test_round_reads_its_tree_once():
    r = tree_round()
    assert r.is_tree and r.path == [0, 1] and r.rejected_nodes == [2, 3, 4, 5, 6]
    assert r.rejected_suffix == [22, 23, 24, 25, 26]
    assert r.draft_depth == 4 and r.kind == "correction" and r.target_token == 30
    assert r.target_row == 2 and r.node_row(6) == 2 and r.node_row(4) == 0
    chain = Round(index=1, start=13, drafter="x", draft=[40, 41, 42], accepted=3,
                  committed=[40, 41, 42, 43])
    assert chain.tree.is_chain and chain.path == [0, 1, 2] and chain.rejected_suffix == []
    assert chain.kind == "bonus" and chain.target_row == 3 and chain.node_row(2) == 2
    plain = Round(index=2, start=17, drafter="ar", draft=[], accepted=0, committed=[50])
    assert plain.kind == "nodraft" and plain.draft_depth == 0 and plain.target_row == 0
    # a budget-cut round: the whole draft was accepted but nothing else fits -> still "bonus"
    # by depth, and the missing target token reads as -1
    cut = Round(index=3, start=18, drafter="x", draft=[1, 2], accepted=2, committed=[1, 2])
    assert cut.target_token == -1 and cut.kind == "bonus"


@pytest.mark.parametrize("greedy", [True, False])
def test_verify_returns_one_verdict_for_chains_and_trees(greedy):
    torch.manual_seed(0)
    logits = torch.full((8, 30), -10.0)
    logits[0, 20] = 10.0  # row 0 -> node 0 (token 20)
    logits[1, 21] = 10.0  # after node 0 -> node 1 (token 21)
    logits[2, 29] = 10.0  # after node 1 -> 29: nodes 2 (22) and 6 (26) rejected
    probs = torch.softmax(logits, -1)
    t = tree_round().tree
    v = verify(t, logits, probs, greedy, generator=torch.Generator().manual_seed(0))
    assert v == Verdict([0, 1], 29) and v.rows == [0, 1, 2]
    chain = TokenTree.chain([20, 21, 5])
    assert verify(chain, logits[:4], probs[:4], greedy,
                  generator=torch.Generator().manual_seed(0)).path == [0, 1]
