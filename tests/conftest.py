"""Shared fixtures: tiny random models (unit tests, seconds) and the embedded target."""
from __future__ import annotations

import os

# OpenMP waiting as the entry points set it (specviz/__main__.py, app.py), before torch
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("GOMP_SPINCOUNT", "20000")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.browser_support import browser, server  # noqa: E402,F401 (one app server per run)
from tests.served_support import vllm_server  # noqa: E402,F401

torch.set_num_threads(min(2, os.cpu_count() or 1))


class ToyTokenizer:
    """Minimal tokenizer for tiny random models: token i <-> the text ' t{i}'."""

    chat_template = None

    def __init__(self, vocab_size: int, eos_token_id: int = 1):
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id

    def __len__(self) -> int:   # as a transformers tokenizer: its vocabulary, added tokens too
        return self.vocab_size

    def __call__(self, text, add_special_tokens=True):
        ids = [int(w[1:]) % self.vocab_size for w in text.split() if w[1:].isdigit()]
        return {"input_ids": ids or [2]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f" t{int(i)}" for i in ids)


def make_tiny_target(vocab_size: int = 64, seed: int = 0, layers: int = 2, eos: int = 1):
    from transformers import LlamaConfig, LlamaForCausalLM


    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, eos_token_id=eos, bos_token_id=0,
                      pad_token_id=eos, tie_word_embeddings=False)
    return finish_tiny_target(LlamaForCausalLM(cfg), vocab_size, eos, f"tiny-llama-{seed}")


def finish_tiny_target(model, vocab_size: int, eos: int, name: str):
    """Sharpen a tiny random model's outputs (so greedy runs are not all near-ties), set its
    EOS, and wrap it as a Target with a ToyTokenizer."""
    from specviz.models import target_from_model

    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    return target_from_model(model, ToyTokenizer(vocab_size, eos), name=name)


def make_tiny_rollouts(target, folder, n: int = 8, max_new_tokens: int = 24,
                       holdout: float = 0.9999):
    """Greedy rollouts (tapped layers 0 and 1) of ``n`` toy prompts in two categories."""
    from specviz.bench import PromptItem
    from specviz.train.rollouts import make_rollouts

    items = [PromptItem(f"p{i}", "ab"[i % 2], " ".join(f"t{(i * 3 + j % 4) % 60 + 2}"
                                                       for j in range(8 + i)), "x")
             for i in range(n)]
    make_rollouts(target, items, folder, max_new_tokens=max_new_tokens, layer_ids=[0, 1],
                  holdout=holdout)
    return folder


@pytest.fixture(scope="session")
def tiny_target():
    return make_tiny_target()


@pytest.fixture(scope="session")
def embedded_target():
    """The embedded model in float32 (deterministic on every machine: the rollout, replay and
    training tests compare against HF generate, which runs unpadded). The measured bfloat16
    choice and its width-invariant decoding are tested in test_numerics.py; the app tests load
    the default (auto) target."""
    from specviz.models import load_target

    return load_target("default", dtype="float32")


def example_prompts(n_per_category: int, start: int = 0) -> list[dict]:
    """Prompts ``start`` .. ``start + n_per_category - 1`` of each category in
    examples/prompts.jsonl (the first ones by default)."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "prompts.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    seen: dict[str, int] = {}
    out = []
    for r in rows:
        i = seen[r["category"]] = seen.get(r["category"], -1) + 1
        if start <= i < start + n_per_category:
            out.append(r)
    return out


def first_two_token_counts(target, prompt, drafter_fn, n, settings_kw, on_trace=None):
    """Run ``n`` seeded speculative-sampling sessions (2 new tokens each) and return
    (empirical counts, exact joint law p(x1) p(x2|x1)) of the first two generated tokens.
    Token 0 must be the EOS: a run that stops after it is counted as (0, 0)."""
    from specviz.engine import DecodeSettings, Session
    from specviz.verify import warp_probs

    vocab = target.model.config.vocab_size
    with torch.no_grad():
        p1 = warp_probs(target.model(torch.tensor([prompt])).logits[0, -1], **settings_kw)
        exact = torch.zeros(vocab, vocab)
        for a in range(vocab):
            p2 = warp_probs(target.model(torch.tensor([prompt + [a]])).logits[0, -1], **settings_kw)
            exact[a] = p1[a] * p2
        exact[0] = 0.0
        exact[0, 0] = p1[0]
    counts = torch.zeros(vocab, vocab)
    for seed in range(n):
        tr = Session(target, drafter_fn(seed), prompt,
                     DecodeSettings(max_new_tokens=2, seed=seed, **settings_kw)).run()
        if on_trace:
            on_trace(tr)
        out = tr.output_ids + [0] * (2 - len(tr.output_ids))
        counts[out[0], out[1]] += 1
    return counts, exact


def sampling_pair():
    """(a 12-word tiny target with a flat-ish law, a block-4 DFlash drafter for it whose slots
    put real mass on a few tokens): the chi-square sampling tests of the block drafters."""
    from specviz.drafters.dflash.checkpoint import new_dflash_for_target

    target = make_tiny_target(vocab_size=12, seed=5, layers=1, eos=0)
    with torch.no_grad():
        target.model.lm_head.weight.mul_(0.15)
    model = new_dflash_for_target(target, num_layers=1, block_size=4, seed=7)
    with torch.no_grad():
        model.fc.weight.mul_(20.0)
    return target, model


def assert_same_law(counts, exact, tv_tol, alpha=1e-3):
    """Chi-square goodness of fit (cells with expected count >= 5) and a TV bound."""
    from scipy.stats import chisquare

    n = float(counts.sum())
    flat_c, flat_p = counts.flatten(), exact.flatten()
    keep = flat_p * n >= 5
    obs = flat_c[keep].numpy()
    exp = (flat_p[keep] * n).numpy()
    exp = exp * obs.sum() / exp.sum()
    _, pval = chisquare(obs, exp)
    tv = 0.5 * float((flat_c / n - flat_p).abs().sum())
    assert pval > alpha, f"p-value {pval:.2e} (TV {tv:.3f})"
    assert tv < tv_tol, f"TV {tv:.3f}"


def count_forwards(monkeypatch, target) -> dict:
    """Count the target model's forward calls from now on: the returned dict's ``n``."""
    calls = {"n": 0}
    forward = target.model.forward

    def counted(*a, **k):
        calls["n"] += 1
        return forward(*a, **k)

    monkeypatch.setattr(target.model, "forward", counted)
    return calls


def assert_sampling_lossless(target, prompt, drafter_fn, min_trees: int = 0, n: int = 3000):
    """Speculative sampling (T 0.9, top-p 0.95) with ``drafter_fn(seed)`` keeps the target's law
    of the first two tokens (:func:`assert_same_law`), and drafts were really accepted (> 100
    tokens over the runs; at least ``min_trees`` tree rounds)."""
    used = {"accepted": 0, "trees": 0}

    def on_trace(tr):
        used["accepted"] += sum(r.accepted for r in tr.rounds)
        used["trees"] += sum(r.is_tree for r in tr.rounds)

    counts, exact = first_two_token_counts(target, prompt, drafter_fn, n,
                                           dict(temperature=0.9, top_p=0.95), on_trace=on_trace)
    assert_same_law(counts, exact, tv_tol=0.13)
    assert used["accepted"] > 100 and used["trees"] >= min_trees, used


def repetitive_prompt(rng, vocab: int, length: int) -> list[int]:
    """Random token ids that mostly repeat one short pattern (so lookup drafts get accepted)."""
    base = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 8))]
    ids: list[int] = []
    while len(ids) < length:
        ids += base if rng.random() < 0.7 else [rng.randrange(3, vocab)]
    return ids[:length]


_AR_CACHE: dict = {}


def ar_reply(target, prompt, max_new_tokens: int) -> tuple[list[int], list[int]]:
    """(prompt ids, plain greedy reply) for a text ``prompt``, from the AR cache where a run at
    least this long is cached (a greedy reply's first n tokens are the n-token greedy reply, or
    all of it when it stopped at EOS before)."""
    longer = [n for tid, text, n in _AR_CACHE
              if tid == id(target) and text == prompt and n >= max_new_tokens]
    tr = ar_trace(target, prompt, min(longer, default=max_new_tokens))
    return list(tr.prompt_ids), tr.output_ids[:max_new_tokens]


def ar_trace(target, prompt: str, max_new_tokens: int):
    """Plain greedy decoding's trace of ``prompt``, made once per (target, prompt, length)."""
    from specviz.engine import DecodeSettings
    from specviz.run import generate

    key = (id(target), prompt, max_new_tokens)
    if key not in _AR_CACHE:
        settings = DecodeSettings(max_new_tokens=max_new_tokens)
        _AR_CACHE[key] = generate(target, "ar", prompt, settings)
    return _AR_CACHE[key]


def greedy_lossless_runs(target, method: str, prompts: list[dict], max_new_tokens: int,
                         **params) -> list[tuple]:
    """Greedy runs of ``method`` on real ``prompts`` next to plain greedy decoding (AR outputs
    are cached per prompt and length across tests); fails on any divergence that is not a
    near-tie. Returns (ar trace, method trace, comparison) per prompt."""
    from specviz.analysis.lossless import compare_outputs
    from specviz.engine import DecodeSettings
    from specviz.run import generate

    settings = DecodeSettings(max_new_tokens=max_new_tokens)
    out = []
    for row in prompts:
        ar = ar_trace(target, row["prompt"], max_new_tokens)
        run = generate(target, method, row["prompt"], settings, **params)
        rep = compare_outputs(target, run.prompt_ids, ar.output_ids, run.output_ids)
        assert rep.ok, (f"{row['id']}: {method} diverged from greedy at token "
                        f"{rep.first_divergence} (top-2 gap {rep.top2_gap})")
        out.append((ar, run, rep))
    return out


def real_prompt_sets(full: int) -> list:
    """The two sizes of a real-prompt lossless check, as a ``per_category`` parameter: one
    example prompt per category (5) in the default run, ``full`` per category with ``-m slow``
    (the tiny-model twins of every method run by default either way). Each check passes its own
    ``start``, so the default run covers different prompts across methods."""
    return [pytest.param(1, id="5-prompts"),
            pytest.param(full, id=f"{5 * full}-prompts", marks=pytest.mark.slow)]


def lossless_on_examples(target, method: str, n_per_category: int, allowed_ties: int,
                         max_new_tokens: int = 40, start: int = 0, **params) -> list[tuple]:
    """``greedy_lossless_runs`` on ``n_per_category`` example prompts of each of the five
    categories, from the ``start``-th on; at most ``allowed_ties`` outputs may differ from AR
    (each a genuine near-tie)."""
    prompts = example_prompts(n_per_category, start)
    assert len(prompts) == 5 * n_per_category
    runs = greedy_lossless_runs(target, method, prompts, max_new_tokens, **params)
    identical = sum(rep.identical for _, _, rep in runs)
    assert identical >= len(prompts) - allowed_ties, f"only {identical}/{len(prompts)} identical"
    return runs


@pytest.fixture(autouse=True)
def _fresh_adapld_experience():
    """AdaPLD carries per-source experience across runs of one model in a process; every test
    starts without any, so its outcome does not depend on which tests ran before it."""
    from specviz.drafters.adapld.control import clear_experience

    clear_experience()
    yield


def counted_lossless_run(monkeypatch, target, drafter, ids, settings):
    """Run ``drafter`` on ``ids``, counting its forwards (``block_hidden`` calls), and check the
    output equals plain decoding's. Returns (trace, number of drafter forwards)."""
    from specviz.analysis.lossless import compare_outputs
    from specviz.engine import Session
    from specviz.run import generate

    calls = []
    real = drafter.block_hidden
    monkeypatch.setattr(drafter, "block_hidden", lambda t: calls.append(1) or real(t))
    tr = Session(target, drafter, ids, settings).run()
    ar = generate(target, "ar", ids, settings)
    assert compare_outputs(target, ids, ar.output_ids, tr.output_ids).ok
    return tr, len(calls)

