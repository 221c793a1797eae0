"""Engine on tiny random models: greedy losslessness, tree = separate branches, sampling keeps p,
traces round-trip, bad input fails with clear errors."""
import random

import pytest
import torch

from specviz.analysis.lossless import compare_outputs
from specviz.drafters import make_drafter
from specviz.drafters.base import Draft
from specviz.drafters.base import Drafter
from specviz.drafters.pld import PLDDrafter
from specviz.engine import DecodeSettings, Session
from specviz.errors import PromptError, SettingsError, SpecvizError, TraceError
from specviz.run import generate
from specviz.trace import Trace
from specviz.tree import TokenTree

from conftest import repetitive_prompt, assert_same_law, first_two_token_counts, make_tiny_target


def hf_greedy(target, ids, n):
    out = target.model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                                eos_token_id=list(target.eos_token_ids),
                                pad_token_id=list(target.eos_token_ids)[0])
    return out[0, len(ids):].tolist()


def test_ar_session_equals_hf_generate(tiny_target):
    rng = random.Random(0)
    for _ in range(5):
        ids = [rng.randrange(3, 64) for _ in range(rng.randint(1, 20))]
        tr = generate(tiny_target, "ar", ids, DecodeSettings(max_new_tokens=24))
        assert tr.output_ids == hf_greedy(tiny_target, ids, 24)
        assert tr.tau == 1.0 and tr.target_forwards == len(tr.output_ids)


def test_prefill_computes_only_the_last_rows_logits(tiny_target):
    """Nobody reads the prefill's logits: the LM head runs on its last row only (the hidden
    states a drafter needs are all there), and output is unchanged (the test above)."""
    seen = []
    hook = tiny_target.model.register_forward_hook(
        lambda mod, args, kwargs, out: seen.append((kwargs["input_ids"].shape[1],
                                                    kwargs.get("logits_to_keep"),
                                                    out.logits.shape[1])), with_kwargs=True)
    try:
        tr = generate(tiny_target, "ar", list(range(3, 20)), DecodeSettings(max_new_tokens=3))
    finally:
        hook.remove()
    assert seen[0] == (16, 1, 1)                          # prefill: 16 rows, one row of logits
    assert all(k is None and n == w for w, k, n in seen[1:]) and len(seen) == 4
    assert tr.output_ids == hf_greedy(tiny_target, list(range(3, 20)), 3)


def test_pld_greedy_lossless_on_many_random_prompts(tiny_target):
    rng = random.Random(1)
    accepted_total = 0
    for i in range(40):
        ids = repetitive_prompt(rng, 64, rng.randint(4, 60))
        s = DecodeSettings(max_new_tokens=32)
        ar = generate(tiny_target, "ar", ids, s)
        pld = generate(tiny_target, "pld", ids, s, num_output_tokens=rng.randint(1, 12))
        rep = compare_outputs(tiny_target, ids, ar.output_ids, pld.output_ids)
        assert rep.ok, f"prompt {i}: diverged at {rep.first_divergence} (gap {rep.top2_gap})"
        accepted_total += sum(r.accepted for r in pld.rounds)
        assert pld.target_forwards <= ar.target_forwards
    assert accepted_total > 50  # the drafts were actually used, not all rejected


class FixedTreeDrafter(Drafter):
    """Proposes a fixed set of branches (as a tree) every round: for tests."""

    name = "fixed-tree"

    def __init__(self, branches_fn):
        self.branches_fn = branches_fn

    def propose(self, ctx):
        tree = TokenTree.from_sequences(self.branches_fn(ctx.tokens), max_nodes=64)
        return Draft(tokens=tree.tokens, parents=tree.parents)


def test_tree_verification_equals_verifying_each_branch(tiny_target):
    """One tree forward accepts the same path as the best of the branches verified one by one."""
    rng = random.Random(2)
    for trial in range(10):
        ids = [rng.randrange(3, 64) for _ in range(rng.randint(2, 15))]
        truth = hf_greedy(tiny_target, ids, 12)
        k = rng.randint(0, 5)
        branches = [truth[:k] + [rng.randrange(3, 64) for _ in range(3)],
                    [rng.randrange(3, 64) for _ in range(4)],
                    truth[:max(0, k - 2)] + [rng.randrange(3, 64)]]
        sess = Session(tiny_target, FixedTreeDrafter(lambda toks: branches), ids,
                       DecodeSettings(max_new_tokens=12))
        rnd = sess.step()
        separate = []
        for b in branches:  # verify each branch on its own, as a chain
            r2 = Session(tiny_target, FixedTreeDrafter(lambda toks, b=b: [b]), ids,
                         DecodeSettings(max_new_tokens=12)).step()
            assert r2.parents is None  # a single branch is verified as a chain
            separate.append(r2)
        best = max(separate, key=lambda r: r.accepted)
        assert rnd.accepted == best.accepted
        assert rnd.committed == best.committed == truth[:len(rnd.committed)]
        tree = TokenTree(rnd.draft, rnd.parents) if rnd.parents else None
        if tree is not None and rnd.accepted_path:
            assert [tree.tokens[i] for i in rnd.accepted_path] == rnd.committed[:rnd.accepted]
        # the cache keeps only the committed path: continuing gives plain greedy output
        tr = sess.run()
        assert tr.output_ids == truth


def test_tree_session_lossless_over_many_rounds(tiny_target):
    rng = random.Random(3)
    for _ in range(5):
        ids = repetitive_prompt(rng, 64, 30)

        def branches(toks, rng=rng):
            # PLD-like candidates from several earlier matches of the last token
            last = toks[-1]
            starts = [i + 1 for i in range(len(toks) - 1) if toks[i] == last][-3:]
            return [toks[s:s + rng.randint(1, 6)] for s in starts] or [[rng.randrange(3, 64)]]

        tr = Session(tiny_target, FixedTreeDrafter(branches), ids, DecodeSettings(max_new_tokens=30)).run()
        ar = generate(tiny_target, "ar", ids, DecodeSettings(max_new_tokens=30))
        assert compare_outputs(tiny_target, ids, ar.output_ids, tr.output_ids).ok


class QDrafter(Drafter):
    """Samples a chain from a fixed random distribution q (a drafter with its own q)."""

    name = "q-random"

    def __init__(self, vocab, k, seed):
        self.vocab, self.k = vocab, k
        self.g = torch.Generator().manual_seed(seed)
        self.q = torch.softmax(torch.randn(k, vocab, generator=self.g) * 2, -1)

    def propose(self, ctx):
        toks = [int(torch.multinomial(self.q[i], 1, generator=self.g)) for i in range(self.k)]
        return Draft(tokens=toks, q=self.q.clone(), q_token=[float(self.q[i, t]) for i, t in enumerate(toks)])


class PointDrafter(Drafter):
    name = "point"

    def __init__(self, toks):
        self.toks = toks

    def propose(self, ctx):
        return Draft(tokens=list(self.toks))


@pytest.mark.parametrize("kind", ["deterministic", "with_q"])
def test_sampling_session_keeps_target_distribution(kind):
    """Joint distribution of the first two generated tokens under speculative sampling equals the
    target's p(x1) p(x2 | x1) (temperature 0.9, top-p 0.95). Chi-square at alpha=1e-3; TV < 0.09 (its sampling noise at n=6000 over 144 cells is ~0.06)."""
    vocab = 12
    target = make_tiny_target(vocab_size=vocab, seed=5, layers=1, eos=0)
    with torch.no_grad():
        target.model.lm_head.weight.mul_(0.15)  # soften: many tokens have mass
    if kind == "with_q":
        drafter_fn = lambda seed: QDrafter(vocab, 3, seed=1000 + seed)  # noqa: E731
    else:
        drafter_fn = lambda seed: PointDrafter([4, 9, 2])  # noqa: E731
    counts, exact = first_two_token_counts(target, [3, 7, 5], drafter_fn, 6000,
                                           dict(temperature=0.9, top_p=0.95))
    assert_same_law(counts, exact, tv_tol=0.09)


def test_pld_matches_transformers_prompt_lookup():
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng = random.Random(4)
    for _ in range(200):
        ids = [rng.randrange(0, 8) for _ in range(rng.randint(2, 40))]
        n_out = rng.randint(1, 10)
        ref = PromptLookupCandidateGenerator(eos_token_id=torch.tensor([99]), num_output_tokens=n_out,
                                             max_matching_ngram_size=2, max_length=10_000)
        cand, _ = ref.get_candidates(torch.tensor([ids]))
        ref_draft = cand[0, len(ids):].tolist()
        ours = PLDDrafter(2, n_out, eos_token_ids={99}).propose(
            type("C", (), {"tokens": ids})()).tokens
        assert ours == ref_draft, (ids, ours, ref_draft)


def test_trace_round_trip(tiny_target, tmp_path):
    tr = generate(tiny_target, "pld", [5, 6, 7, 5, 6, 7, 5, 6], DecodeSettings(max_new_tokens=20))
    path = tr.save(tmp_path / "t.json")
    back = Trace.load(path)
    assert back.to_dict() == tr.to_dict()
    assert back.output_ids == tr.output_ids and back.tau == tr.tau
    assert [r.rejected_suffix for r in back.rounds] == [r.rejected_suffix for r in tr.rounds]
    for r in tr.rounds:
        assert r.committed[:r.accepted] == r.draft[:r.accepted]
        assert len(r.target_argmax) == len(r.draft) + 1
        assert r.target_argmax[r.accepted] == r.committed[-1] or r.committed[-1] in tiny_target.eos_token_ids


@pytest.mark.parametrize("text,msg", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not a specviz trace"),
    ('{"schema_version": 99, "rounds": []}', "unsupported trace schema_version"),
    ('{"schema_version": 1, "rounds": [{"index": 0}]}', "round 1: 'start' is missing"),
    ('{"schema_version": 1, "prompt_ids": [7], "rounds": [{"index": 0, "start": 1, "drafter": '
     '"x", "draft": [1], "accepted": 5, "committed": [1]}]}',
     "round 1: 'accepted' is 5 but the draft has 1 token"),
])
def test_corrupt_trace_errors(text, msg):
    with pytest.raises(TraceError, match=msg):
        Trace.from_json(text)
    with pytest.raises(TraceError, match="not UTF-8"):
        Trace.from_json(b"\xff\xfe\x00garbage")


def test_bad_input_errors(tiny_target):
    with pytest.raises(PromptError, match="empty"):
        Session(tiny_target, make_drafter("ar"), "   ")
    with pytest.raises(PromptError, match="empty"):
        Session(tiny_target, make_drafter("ar"), [])
    with pytest.raises(PromptError, match="context"):
        Session(tiny_target, make_drafter("ar"), list(range(3, 60)) * 10)
    for bad in [dict(max_new_tokens=0), dict(max_new_tokens=-5), dict(temperature=-1),
                dict(top_p=0), dict(top_p=1.5), dict(max_new_tokens=10**6)]:
        with pytest.raises(SettingsError):
            DecodeSettings(**bad).validate()
    with pytest.raises(SettingsError, match="unknown method"):
        make_drafter("nope")
    with pytest.raises(SettingsError):
        make_drafter("pld", num_output_tokens=0)
    with pytest.raises(SettingsError, match="bad settings"):
        make_drafter("pld", not_a_param=3)
    assert issubclass(SettingsError, SpecvizError)


def test_generation_stops_at_context_end():
    t = make_tiny_target(vocab_size=64, seed=9, eos=63)
    ids = [5] * 505
    tr = generate(t, "pld", ids, DecodeSettings(max_new_tokens=50))
    assert len(ids) + tr.new_tokens <= t.max_context
    assert tr.meta["stop_reason"] in ("context", "eos")


def test_step_records_timings_and_drafter_extras(tiny_target):
    sess = Session(tiny_target, make_drafter("pld"), [4, 5, 6, 4, 5], DecodeSettings(max_new_tokens=5))
    r = sess.step()
    assert r.t_verify > 0 and r.t_draft >= 0
    assert r.extras["match"]["kind"] == "lexical" and r.draft[:1] == [6]
    while sess.step():
        pass
    assert sess.done and sess.stop_reason in ("eos", "max_new_tokens")
    assert sess.step() is None
