"""Offline replay (specviz.analysis.replay): a drafter along a fixed greedy rollout gives the
same rounds as a real greedy Session, with no target forward -- on tiny random models (chains,
trees, hidden-state drafters) and on the embedded model (PLD and the bundled DFlash)."""
from __future__ import annotations

import copy
import random

import pytest
import torch

from specviz.analysis.replay import Rollout, greedy_against, replay
from specviz.drafters import make_drafter
from specviz.drafters.dflash.checkpoint import new_dflash_for_target
from specviz.drafters.dflash.drafter import DFlashDrafter
from specviz.engine import DecodeSettings, Session
from specviz.errors import SpecvizError
from specviz.run import generate
from specviz.tree import TokenTree

from conftest import ar_reply, example_prompts, repetitive_prompt


def rollout_of(target, prompt, max_new_tokens: int, layers=None) -> Rollout:
    """The target's greedy reply to ``prompt`` (ids or text) and, when ``layers`` are given,
    the tapped hidden states of one forward over prompt + reply."""
    if isinstance(prompt, str):   # the embedded model's prompts: AR replies shared across tests
        prompt_ids, reply = ar_reply(target, prompt, max_new_tokens)
    else:
        ar = generate(target, "ar", prompt, DecodeSettings(max_new_tokens=max_new_tokens))
        prompt_ids, reply = list(ar.prompt_ids), ar.output_ids
    tokens = prompt_ids + reply
    feats = None
    if layers:
        with torch.inference_mode():
            out = target.model(torch.tensor([tokens]), output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i] for i in layers], -1)[0]
    return Rollout(tokens, len(prompt_ids), feats, list(layers) if layers else None)


def drafted(r) -> tuple:
    """A round's draft as a comparable record: a chain as drafted; a tree as the set of its
    token paths and the accepted token path (the order in which best-first drafting found two
    nodes of near-equal probability is float rounding, not a different tree)."""
    if not r.is_tree:
        return (r.draft, r.parents, r.accepted_path)
    tree = r.tree
    return (sorted(tuple(tree.tokens[j] for j in tree.path_to(i)) for i in range(len(tree))),
            tuple(tree.tokens[j] for j in r.path))


def same_rounds(live, offline) -> None:
    assert offline.num_rounds == live.num_rounds
    for a, b in zip(live.rounds, offline.rounds):
        assert (a.start, a.accepted, a.committed, drafted(a)) == \
            (b.start, b.accepted, b.committed, drafted(b)), a.index
    assert offline.output_ids == live.output_ids and offline.tau == live.tau


def near_tie(r, gap: float = 0.002) -> bool:
    """Whether a hidden-state drafter's round had two words within ``gap`` of each other at
    the top of some slot (its recorded top-k probabilities)."""
    return any(len(p) > 1 and p[0] - p[1] <= gap for p in r.extras.get("topk_p", []))


def same_rounds_up_to_a_near_tie(live, offline) -> bool:
    """True when the replay equals the live run round for round. A hidden-state drafter reads
    the live run's features from the prefill and verify forwards and the rollout's from one
    forward over the whole text: equal up to float rounding, which may flip a draft only where
    two words tie at the top of a slot. Then the first differing round must show that tie
    (returns False); any other difference fails."""
    for a, b in zip(live.rounds, offline.rounds):
        if (a.start, a.accepted, a.committed, drafted(a)) != \
                (b.start, b.accepted, b.committed, drafted(b)):
            assert a.start == b.start and (near_tie(a) or near_tie(b)), a.index
            return False
    same_rounds(live, offline)
    return True


def live_run(target, method_or_drafter, rollout: Rollout, **params):
    drafter = make_drafter(method_or_drafter, target, **params) \
        if isinstance(method_or_drafter, str) else method_or_drafter
    s = DecodeSettings(max_new_tokens=len(rollout.tokens) - rollout.prompt_len)
    return Session(target, drafter, rollout.tokens[:rollout.prompt_len], s).run()


def dflash_cases(target, seed: int, n: int, max_new_tokens: int):
    """``n`` (random tiny DFlash model, rollout with its tapped features) pairs."""
    rng = random.Random(seed)
    for i in range(n):
        model = new_dflash_for_target(target, num_layers=1, block_size=4, seed=i)
        layers = [j + 1 for j in model.target_layer_ids]
        yield model, rollout_of(target, repetitive_prompt(rng, 64, 30), max_new_tokens, layers)


def test_greedy_against_a_known_reply():
    tree = TokenTree([5, 6, 7, 9], [-1, 0, 1, 0])
    v = greedy_against(tree, [5, 9, 4])
    assert v.path == [0, 3] and v.token == 4
    assert greedy_against(tree, [8, 1]).path == [] and greedy_against(tree, [8, 1]).token == 8
    assert greedy_against(TokenTree.chain([5, 6]), [5, 6]).path == [0]  # budget: room for one


@pytest.mark.parametrize("method", ["pld", "adapld", "adapld_lex"])
def test_replay_equals_session_for_lookup_drafters(tiny_target, method):
    rng = random.Random(3)
    for _ in range(6):
        ro = rollout_of(tiny_target, repetitive_prompt(rng, 64, rng.randint(20, 60)), 24)
        params = {} if method == "pld" else {"cost": "cpu"}  # a fixed curve: the measured
        live = live_run(tiny_target, method, ro, **params)  # one learns from live rounds
        same_rounds(live, replay(make_drafter(method, tiny_target, **params), ro, tiny_target))


def test_replay_equals_session_for_a_hidden_state_drafter(tiny_target):
    for model, ro in dflash_cases(tiny_target, 8, 6, 20):
        live = live_run(tiny_target, DFlashDrafter(tiny_target, model=model, cut="off"), ro)
        same_rounds(live, replay(DFlashDrafter(tiny_target, model=model, cut="off"), ro,
                                 tiny_target))


def test_replay_runs_no_target_forward_and_checks_layers(tiny_target, monkeypatch):
    rng = random.Random(1)
    ro = rollout_of(tiny_target, repetitive_prompt(rng, 64, 30), 16)

    def boom(*a, **k):
        raise AssertionError("replay ran a target forward")

    monkeypatch.setattr(tiny_target.model, "forward", boom)
    tr = replay(make_drafter("pld"), ro, tiny_target)
    assert tr.meta["replay"] and tr.new_tokens == len(ro.tokens) - ro.prompt_len
    model = new_dflash_for_target(tiny_target, num_layers=1, block_size=4, seed=0)
    with pytest.raises(SpecvizError, match="hidden states"):
        replay(DFlashDrafter(tiny_target, model=model), ro, tiny_target)


@pytest.mark.integration
@pytest.mark.slow   # ~5 min; replay = session is checked on tiny models in the default run
@pytest.mark.parametrize("method", ["pld", "dflash"])
def test_replay_and_edr_equal_real_greedy_sessions_on_embedded_prompts(embedded_target, method):
    """20 real prompts: the replayed rounds are the live rounds, one for one, and EDR's expected
    rounds (specviz.analysis.edr, from the drafter's draft at every state) equal their number.
    (DFlash reads the rollout's features from one forward over the whole text; the live run's
    come from the prefill and the verify passes -- equal up to float rounding, which can flip a
    draft where two words tie at the top of a slot: at most one such flip is allowed, and it
    must show the tie.)"""
    from specviz.analysis.edr import evaluate, greedy_acceptance, state_drafts

    layers = None
    # the cut plans with timed forwards; EDR's acceptance is a chain's (offline_eval.MARKOV)
    params = {"cut": "off", "tree": 0} if method == "dflash" else {}
    if method == "dflash":
        layers = make_drafter("dflash", embedded_target).hidden_state_layers
    ties, tree_rounds = 0, 0
    for row in example_prompts(4):
        ro = rollout_of(embedded_target, row["prompt"], 32, layers)
        live = live_run(embedded_target, method, ro, **params)
        offline = replay(make_drafter(method, embedded_target, **params), ro, embedded_target)
        # PLD records no top-k: with no tie to show, any difference of its rounds fails
        ties += not same_rounds_up_to_a_near_tie(live, offline)
        drafts = state_drafts(make_drafter(method, embedded_target, **params), ro,
                              embedded_target)
        res = evaluate(greedy_acceptance(drafts, ro.tokens[ro.prompt_len:], K=16))
        assert res.edr == offline.num_rounds, row["id"]   # both read the rollout's features
        if method == "dflash":   # the default draft trees (16 nodes): replayed == live too
            trees = live_run(embedded_target, method, ro, cut="off")
            tree_rounds += sum(r.is_tree for r in trees.rounds)
            ties += not same_rounds_up_to_a_near_tie(
                trees, replay(make_drafter(method, embedded_target, cut="off"), ro,
                              embedded_target))
    assert ties <= 1, ties   # at most one of the 20 (DFlash: 40) comparisons flips at a tie
    assert method == "pld" or tree_rounds > 0


def test_replay_keeps_the_first_branch_rule_of_padded_numerics(tiny_target):
    """Under width-invariant numerics (min_width > 1) the engine commits only what a tree's first
    branch would (numerics.first_branch_only); replay does the same, round for round."""
    from test_engine import FixedTreeDrafter

    target = copy.copy(tiny_target)
    rng = random.Random(9)
    for _ in range(3):
        ro = rollout_of(target, repetitive_prompt(rng, 64, 24), 16)
        truth = ro.tokens[ro.prompt_len:]

        def branches(toks, P=ro.prompt_len, truth=truth):  # wrong first branch, right second
            done = len(toks) - P
            return [[3, 3, 3], truth[done:done + 4]] if done < len(truth) else [[3]]
        target.min_width = 4
        live = live_run(target, FixedTreeDrafter(branches), ro)
        off = replay(FixedTreeDrafter(branches), ro, target)
        same_rounds(live, off)
        assert all(r.accepted == 0 for r in off.rounds)     # the second branch never counts
        target.min_width = 1
        full = replay(FixedTreeDrafter(branches), ro, target)
        assert full.num_rounds < off.num_rounds


def test_adapld_drafts_chains_where_only_a_first_branch_can_count(tiny_target):
    target = copy.copy(tiny_target)
    rng = random.Random(11)
    trees = chains = 0
    for _ in range(8):
        ro = rollout_of(target, repetitive_prompt(rng, 64, rng.randint(4, 60)), 32)
        target.min_width = 1                                # unpadded: real trees
        trees += sum(r.parents is not None for r in replay(
            make_drafter("adapld", target, cost="flat"), ro, target).rounds)
        target.min_width = 2
        d = make_drafter("adapld", target, cost="flat")
        tr = replay(d, ro, target)
        assert d.first_branch_only and all(r.parents is None for r in tr.rounds)
        chains += sum(bool(r.draft) for r in tr.rounds)
    assert trees > 5 and chains > 20, (trees, chains)
