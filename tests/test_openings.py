"""Reply openings (specviz.drafters.lookup.openings): the similar-prompt index and its consensus,
the copy that continues an opening into text the prompt quotes, the store round trip, and AdaPLD's
first round drafting the opening losslessly (tiny target; embedded model on editing prompts)."""
import random
from pathlib import Path

import numpy as np
import pytest

from specviz.drafters.lookup.history_store import BUNDLED, BUNDLED_DIR, HistoryStore, build
from specviz.drafters.lookup.index import NgramIndex
from specviz.drafters.lookup.openings import build_openings, with_copy
from specviz.engine import DecodeSettings
from specviz.run import generate

from conftest import make_tiny_target

MBPP = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mbpp.jsonl"


def _pairs():
    """Two kinds of prompt (tokens 10-19 vs 30-39, plus noise) answered in two ways."""
    rng = random.Random(0)
    pairs = []
    for i in range(12):
        kind = i % 2
        words = list(range(10, 20)) if kind == 0 else list(range(30, 40))
        prompt = rng.sample(words, 6) + [rng.randrange(50, 60) for _ in range(3)] + [1, 2]
        reply = [100, 101, 102, 103 + i] if kind == 0 else [200, 201, 202 + i % 4]
        pairs.append((prompt, reply))
    return pairs


def test_similar_prompts_vote_an_opening_and_the_chain_stops_where_they_disagree():
    index = build_openings(_pairs())
    assert len(index) == 12
    chain, share = index.opening([12, 15, 17, 11, 55, 1, 2], length=8)
    assert chain == [100, 101, 102] and share > 0.8   # 103 + i: no majority
    chain, _ = index.opening([31, 33, 38, 52, 1, 2], length=8)
    assert chain == [200, 201]
    assert index.opening([31, 33, 38, 52, 1, 2], length=1)[0] == [200]        # length cap
    assert index.opening([31, 33, 38, 52, 1, 2], length=8, eos={201})[0] == [200]
    assert index.opening([70, 71, 72], length=8) == ([], 0.0)    # nothing similar
    rows = [r for r, _ in index.similar([12, 15, 17, 1, 2], k=4)]
    assert len(rows) == 4 and all(r % 2 == 0 for r in rows)


def test_with_copy_continues_the_opening_into_the_text_the_prompt_quotes():
    ctx = NgramIndex(1, 4)
    ctx.sync([7, 8, 5, 6, 7, 10, 11, 12, 13, 9, 9])
    # the whole chain occurs in the prompt: copy on from there; the draft is a copy from 2
    assert with_copy(ctx, [5, 6, 7], 6) == ([5, 6, 7, 10, 11, 12], 2)
    # the chain's last token is wrong (the quoted text starts with 10): back off to [5, 6, 7]
    assert with_copy(ctx, [5, 6, 7, 99], 6) == ([5, 6, 7, 10, 11, 12], 2)
    # an opening the prompt never quotes is kept as it is; EOS ends the copy
    assert with_copy(ctx, [40, 41], 6) == ([40, 41], None)
    assert with_copy(ctx, [5, 6, 7], 8, eos={12}) == ([5, 6, 7, 10, 11], 2)
    # only the opening's last tokens occur (a different prefix): a copy, but not from one span
    assert with_copy(ctx, [42, 5, 6, 7], 5) == ([42, 5, 6, 7, 10], None)


def test_openings_survive_a_store_round_trip_and_old_stores_load_without_them(tmp_path):
    pairs = _pairs()
    store = build([p[-2:] + r for p, r in pairs], {"vocab_size": 300},
                  openings=build_openings(pairs))
    back = HistoryStore.load(store.save(tmp_path / "s.npz"))
    q = [12, 15, 17, 11, 55, 1, 2]
    (chain, share), (chain0, share0) = back.openings.opening(q), store.openings.opening(q)
    assert chain == chain0 == [100, 101, 102] and share == pytest.approx(share0, abs=1e-3)
    assert back.openings.n_prompts == 12
    old = HistoryStore.load(build([[1, 2, 3]]).save(tmp_path / "old.npz"))
    assert old.openings is None


def test_the_bundled_store_knows_how_replies_open():
    (_, file), = BUNDLED.items()
    store = HistoryStore.load(BUNDLED_DIR / file)
    assert store.openings is not None and len(store.openings) > 1000
    assert np.all(np.linalg.norm(store.openings.weights, axis=1) > 0.99)


def test_adapld_drafts_the_opening_in_the_first_round_and_stays_lossless(tmp_path):
    """A store (with openings) counted from the tiny target's greedy replies: on new prompts of
    the same two kinds the first round drafts the neighbours' opening, and every output equals
    plain decoding's."""
    target = make_tiny_target(seed=11)
    rng = random.Random(3)
    s = DecodeSettings(max_new_tokens=16)

    def prompt(kind):
        words = list(range(3, 20)) if kind == 0 else list(range(30, 50))
        return rng.sample(words, 8) + [2]
    pairs = []
    for i in range(24):
        p = prompt(i % 2)
        pairs.append((p, generate(target, "ar", p, s).output_ids))
    path = build([p[-2:] + r for p, r in pairs], {"vocab_size": 64},
                 openings=build_openings(pairs)).save(tmp_path / "tiny.npz")
    opened = 0
    for i in range(6):
        p = prompt(i % 2)
        truth = generate(target, "ar", p, s).output_ids
        tr = generate(target, "adapld", p, s, history=str(path), cost="flat")
        assert tr.output_ids == truth
        first = tr.rounds[0]
        if first.extras.get("source") == "open":
            opened += 1
            opened_trace = tr
            assert first.extras["opening"] >= 1 and len(first.draft) >= first.extras["opening"]
        assert all(r.extras.get("source") != "open" for r in tr.rounds[1:])
    assert opened >= 3
    from specviz.viz.adapld import retrieval_table   # the AdaPLD page names the source
    table = retrieval_table(opened_trace).set_index("source")
    assert table.loc["open", "rounds"] == 1 and "opening" in table.loc["open", "what"]


@pytest.mark.skipif(not MBPP.exists(), reason="../shared/data/mbpp.jsonl not present")
def test_editing_replies_open_with_the_fence_and_the_quoted_code_on_the_embedded_model(
        embedded_target):
    from specviz.editset import load_edit_prompts

    s = DecodeSettings(max_new_tokens=24)
    accepted = []
    for it in load_edit_prompts(MBPP, 4, 0, 960):
        truth = generate(embedded_target, "ar", it.text, s).output_ids
        tr = generate(embedded_target, "adapld", it.text, s)
        assert tr.output_ids == truth, it.id
        first = tr.rounds[0]
        if first.extras["source"] == "open":   # no consensus -> the usual search
            assert embedded_target.tokenizer.decode(first.draft).startswith("```")
            accepted.append(first.accepted)
    # most replies open with the fence and the code the prompt quoted (the target sometimes
    # starts with the code itself: then the opening is rejected, and the output is still AR's)
    assert len(accepted) >= 2 and sum(accepted) >= 8
