"""AdaPLD's history store (specviz.drafters.lookup.history_store): counting, lookup and chains,
(de)serialisation with clear errors, the bundled store of the embedded model, and AdaPLD
drafting from it losslessly when prompt lookup has nothing to copy."""
import random

import numpy as np
import pytest

from specviz.drafters.lookup.history_store import (BUNDLED, BUNDLED_DIR, HistoryStore, build,
                                                   resolve_store)
from specviz.engine import DecodeSettings
from specviz.errors import SettingsError
from specviz.run import generate

from conftest import make_tiny_target


def test_build_counts_the_most_frequent_next_token_and_prefers_two_tokens_of_context():
    store = build([[5, 6, 7], [5, 6, 8], [9, 6, 8], [4, 6, 7]])
    # after 6: 7 twice, 8 twice -> the tie goes to the smaller id; share = 2 / 4
    assert store.bigram[6] == (7, 0.5) and store.bigram[5] == (6, 1.0)
    assert store.trigram[(9, 6)] == (8, 1.0)
    assert store.next_token(9, 6) == (8, 1.0, 2)           # the trigram wins ...
    assert store.next_token(3, 6) == (7, 0.5, 1)           # ... else the bigram
    assert store.next_token(None, 42) is None
    assert store.meta["tokens"] == 12


def test_three_tokens_of_context_win_once_seen_often_enough_and_survive_a_round_trip(tmp_path):
    # after (1, 6): 7 twice; after 6 alone (and after (2, 6)): 8 three times
    seqs = [[0, 1, 6, 7], [0, 1, 6, 7], [3, 2, 6, 8], [3, 2, 6, 8], [5, 2, 6, 8], [9, 4, 6, 9]]
    store = build(seqs)
    assert store.fourgram[(0, 1, 6)] == (7, 1.0) and (9, 4, 6) not in store.fourgram  # seen once
    assert store.next_token(1, 6, 0) == (7, 1.0, 3)        # the three-token context wins ...
    assert store.next_token(2, 6, 9) == (8, 1.0, 2)        # ... else the trigram
    assert store.chain([0, 1, 6], 1) == ([7], 3)
    assert build(seqs, min_count4=1).fourgram[(9, 4, 6)] == (9, 1.0)
    assert build(seqs, min_count4=0).fourgram == {}
    back = HistoryStore.load(store.save(tmp_path / "s.npz"))
    assert back.fourgram.keys() == store.fourgram.keys() and back.next_token(1, 6, 0)[0] == 7
    # a store saved before three-token contexts existed still loads (no fourgram arrays)
    with np.load(tmp_path / "s.npz") as z:
        old = {k: z[k] for k in z.files if not k.startswith("fourgram")}
    np.savez(tmp_path / "old.npz", **old)
    assert HistoryStore.load(tmp_path / "old.npz").fourgram == {}


def test_a_chain_continues_on_its_own_predictions_and_stops_at_eos_or_the_unknown():
    store = build([[1, 2, 3, 4, 99, 5]])
    assert store.chain([7, 1], 10) == ([2, 3, 4, 99, 5], 1)
    assert store.chain([1, 2], 2) == ([3, 4], 2)
    assert store.chain([7, 1], 10, eos={99}) == ([2, 3, 4], 1)
    assert store.chain([7, 8], 10) == ([], 0)
    assert store.chain([], 3) == ([], 0) and store.chain([1], 0) == ([], 0)


def test_save_load_round_trip_and_clear_errors(tmp_path):
    store = build([[1, 2, 3, 2, 3, 4]], {"model": "m", "vocab_size": 64})
    back = HistoryStore.load(store.save(tmp_path / "s.npz"))
    assert {k: v[0] for k, v in back.bigram.items()} == {k: v[0] for k, v in store.bigram.items()}
    assert all(abs(back.bigram[k][1] - v[1]) < 1e-3 for k, v in store.bigram.items())
    assert back.trigram.keys() == store.trigram.keys()
    assert back.meta["model"] == "m" and len(back) == len(store)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(SettingsError, match="cannot be read"):
        HistoryStore.load(bad)
    with pytest.raises(SettingsError, match="does not exist"):
        HistoryStore.load(tmp_path / "missing.npz")
    np.savez(tmp_path / "foreign.npz", x=np.zeros(3))
    with pytest.raises(SettingsError, match="train store"):
        HistoryStore.load(tmp_path / "foreign.npz")


def test_resolve_store_auto_off_path_and_vocabulary_check(tmp_path):
    tiny = make_tiny_target(seed=3)
    assert resolve_store("off", tiny) is None
    assert resolve_store("auto", tiny) is None             # nothing bundled for a toy model
    ok = build([[3, 4, 5]], {"vocab_size": 64}).save(tmp_path / "ok.npz")
    assert resolve_store(str(ok), tiny).bigram[3] == (4, 1.0)
    wrong = build([[3, 4, 5]], {"vocab_size": 1000}).save(tmp_path / "wrong.npz")
    with pytest.raises(SettingsError, match="vocabulary of 1000"):
        resolve_store(str(wrong), tiny)


def test_the_bundled_store_belongs_to_the_embedded_model():
    (name, file), = BUNDLED.items()
    store = HistoryStore.load(BUNDLED_DIR / file)
    assert store.meta["model"] == name and int(store.meta["vocab_size"]) == 49152
    assert store.meta["tokens"] > 100_000 and len(store.trigram) > 10_000
    assert (BUNDLED_DIR / file).stat().st_size < 2_000_000


def test_adapld_drafts_from_the_store_where_lookup_finds_nothing_and_stays_lossless(tmp_path):
    """The store is counted from the tiny target's own greedy replies to *other* prompts; on new
    prompts of fresh tokens (nothing to copy) AdaPLD drafts from it and stays lossless."""
    target = make_tiny_target(seed=11)
    rng = random.Random(2)
    s = DecodeSettings(max_new_tokens=24)

    def fresh_prompt():
        return [rng.randrange(3, 64) for _ in range(12)]
    history = [generate(target, "ar", fresh_prompt(), s) for _ in range(30)]
    path = build([h.prompt_ids[-1:] + h.output_ids for h in history],
                 {"vocab_size": 64}).save(tmp_path / "tiny.npz")
    hist_rounds = hits = 0
    for _ in range(8):
        p = fresh_prompt()
        truth = generate(target, "ar", p, s).output_ids
        for method, params in (("adapld", {"history": str(path), "cost": "flat"}),
                               ("adapld_nohist", {"cost": "flat"})):
            tr = generate(target, method, p, s, **params)
            assert tr.output_ids == truth, method
            rounds = [r for r in tr.rounds if r.extras.get("source") == "hist"]
            if method == "adapld_nohist":
                assert not rounds
                continue
            assert all(r.extras["retrieval"] == "history" for r in rounds)
            assert all(m["copy_from"] is None for r in rounds for m in r.extras["matches"]
                       if m["kind"] == "history")
            hist_rounds += len(rounds)
            hits += sum(1 for r in rounds if r.accepted >= 1)
    assert hist_rounds > 10 and hits > 0


def test_semantic_and_history_matches_compete_on_their_record_in_the_run(monkeypatch):
    """Both propose: the source with the better first-token acceptance so far goes first, the
    other becomes an alternative branch (semantic first on a tie: both start from the same
    sceptical prior)."""
    from specviz.drafters.adapld.control import SourceStats
    from specviz.drafters.adapld.drafter import AdaPLDDrafter
    from specviz.drafters.lookup import semantic as mod
    from specviz.drafters.lookup.index import Candidate

    sem = [Candidate("semantic", [40, 41], (0, 8), 0.95, similarity=0.95)]
    monkeypatch.setattr(mod, "semantic_candidates", lambda *a, **k: list(sem))
    d = AdaPLDDrafter(semantic="off", cost="flat")
    d.windex = object()            # semantic retrieval "on" (its lookup is stubbed above)
    d.store = build([[7, 9, 50, 51]])
    tokens = [5, 9, 4, 6, 7, 8, 3, 9]        # the last token (9) occurred: a 1-gram match
    source, kind, cands, _ = d.retrieve(tokens, 4)
    assert (source, kind) == ("sem", "semantic")
    assert [c.kind for c in cands] == ["semantic", "history", "lexical"]   # the 1-gram copy last
    assert cands[1].tokens == [50, 51]
    d.stats["hist"] = SourceStats(9.0, 1.0, 5.0, 5.0)          # history has been right
    source, kind, cands, _ = d.retrieve(tokens, 4)
    assert (source, kind) == ("hist", "history") and cands[0].tokens == [50, 51]
    assert cands[1].kind == "semantic"
    d.store = None                                              # no store: semantic as before
    assert d.retrieve(tokens, 4)[0] == "sem"


def test_a_longer_store_context_goes_before_a_two_token_match_it_disagrees_with():
    """Lexical match "10 11" -> 20 (one 2-gram occurrence); the store saw "5 10 11" -> 30 twice
    (share 1.0 > the 2-gram's prior a1): the store's chain goes first, the copy becomes an
    alternative. Not when the store's context is no longer than the match, when both agree,
    or with the arbitration off."""
    from specviz.drafters.adapld.drafter import AdaPLDDrafter

    tokens = [1, 2, 3, 4, 10, 11, 20, 5, 10, 11]
    d = AdaPLDDrafter(semantic="off", cost="flat")
    d.store = build([[5, 10, 11, 30, 31], [5, 10, 11, 30, 31]])
    source, kind, cands, suffix = d.retrieve(tokens, 4)
    assert (source, kind) == ("hist", "history") and cands[0].tokens == [30, 31]
    assert cands[1].kind == "lexical" and cands[1].tokens[0] == 20 and suffix == [7, 10]
    for store in (build([[10, 11, 30, 31]] * 2, min_count4=0),     # a trigram only: n = 2
                  build([[5, 10, 11, 20, 31]] * 2)):               # it agrees with the copy
        d = AdaPLDDrafter(semantic="off", cost="flat")
        d.store = store
        assert d.retrieve(tokens, 4)[0] == "lex2"
    d = AdaPLDDrafter(semantic="off", cost="flat")
    d.store, d.arbitrate = build([[5, 10, 11, 30, 31]] * 2), False
    assert d.retrieve(tokens, 4)[0] == "lex2"


def test_sources_not_drafted_are_scored_on_the_committed_tokens_and_compete_on_record(
        monkeypatch):
    """Only a 1-token lexical match: semantic, history and the 1-gram copy all propose; the
    best first-token record goes first. The others are scored on what the target wrote (a
    censored prefix counts no failure), so a source that would have been right wins later."""
    from specviz.drafters.adapld.drafter import AdaPLDDrafter
    from specviz.drafters.base import DraftContext, VerifyFeedback
    from specviz.drafters.lookup import semantic as mod
    from specviz.drafters.lookup.index import Candidate
    from specviz.trace import Round

    sem = [Candidate("semantic", [40, 41], (0, 8), 0.95, similarity=0.95)]
    monkeypatch.setattr(mod, "semantic_candidates", lambda *a, **k: list(sem))
    d = AdaPLDDrafter(semantic="off", cost="flat", adaptive=False)
    d.windex = object()
    d.store = build([[7, 9, 50, 51]])
    tokens = [5, 9, 4, 6, 7, 8, 3, 9]      # 9 occurred once: the 1-gram copy drafts 4 6 7 8 3
    for i in range(4):                     # the target keeps writing what the 1-gram copy says
        draft = d.propose(DraftContext(tokens=tokens, prompt_len=8, max_draft=4, round_index=i))
        if i == 0:
            assert draft.extras["source"] == "sem"          # ties: semantic first
            assert {k for k, _ in d._shadow} == {"hist", "lex1"}
        committed = [4] if draft.tokens[0] != 4 else [4, 6, 7]
        rnd = Round(index=i, start=8, drafter="adapld", draft=list(draft.tokens),
                    accepted=len(committed) - 1 if draft.tokens[0] == 4 else 0,
                    committed=committed)
        d.observe(VerifyFeedback(round=rnd, logits=None, hidden_states=None, kept_rows=None))
    assert draft.extras["source"] == "lex1" and draft.tokens[:2] == [4, 6]
    assert d.source_stats("lex1", 4).a1 > d.source_stats("sem", 4).a1
    assert d.source_stats("hist", 4).a1 < 0.25
    # censored: the 1-gram copy's first token was right and the target's text ends there, so
    # no failure of its copy is counted (f2 only decays)
    from specviz.drafters.adapld.control import EMA_DECAY
    lex1 = d.source_stats("lex1", 5)
    f2 = lex1.f2
    d._shadow = [("lex1", [4, 6, 7])]
    d.observe(VerifyFeedback(round=Round(index=5, start=8, drafter="adapld", draft=[],
                                         accepted=0, committed=[4]),
                             logits=None, hidden_states=None, kept_rows=None))
    assert lex1.f2 == pytest.approx(f2 * EMA_DECAY)
    d.shadow = False                       # off: the old order (no lex1 while others propose)
    d.stats.clear()
    assert d.retrieve(tokens, 4)[0] == "sem"
