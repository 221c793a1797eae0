"""Served runs without a server: vLLM's ngram rule, the per-step rebuild, the client's input
checks and messages (the tests against a real vLLM server: test_served_vllm.py)."""
from __future__ import annotations

import random
import socket

import pytest

from specviz.errors import SettingsError
from specviz.served.client import EndpointError, complete, normalise, server_info
from specviz.served.ngram_rule import NgramConfig, longest_earliest_match, propose
from specviz.served.rebuild import StepCounts, counts_only, rebuild_ngram
from specviz.trace import Trace


def brute_force(ctx, lo, hi, k, max_len):
    """The rule spelled out: longest n-gram ending the context found earlier, earliest one."""
    total = len(ctx)
    k = min(k, max_len - total)
    if total < lo or k <= 0:
        return []
    for n in range(min(hi, total - 1), lo - 1, -1):
        suffix = ctx[total - n:]
        for s in range(0, total - n):          # occurrences ending before the context's end
            if ctx[s:s + n] == suffix:
                start = s + n
                return ctx[start:start + min(k, total - start)]
    return []


@pytest.mark.parametrize("seed", range(6))
def test_rule_equals_brute_force(seed):
    rng = random.Random(seed)
    for _ in range(400):
        vocab = rng.choice([2, 3, 5, 20])
        ctx = [rng.randrange(vocab) for _ in range(rng.randrange(0, 40))]
        lo = rng.randint(1, 3)
        hi = rng.randint(lo, 5)
        k = rng.randint(1, 8)
        cfg = NgramConfig(k, lo, hi, max_model_len=rng.choice([10_000, len(ctx) + 2]))
        assert propose(ctx, cfg) == brute_force(ctx, lo, hi, k, cfg.max_model_len), (ctx, cfg)


def test_rule_examples():
    cfg = NgramConfig(3, 1, 2)
    # "a b c a b" -> the 2-gram "a b" occurred at 0 -> continue with "c a b"
    assert propose([7, 8, 9, 7, 8], cfg) == [9, 7, 8]
    # the earliest of two equally long matches
    assert propose([1, 5, 2, 5, 3, 5], cfg) == [2, 5, 3]
    assert propose([1, 2, 3], cfg) == []                  # nothing repeats: no draft
    assert longest_earliest_match([4, 4, 4, 4], 1, 2) == (2, 2)


def simulate_vllm(prompt, n_new, next_token, cfg, corrupt_step=None):
    """A served ngram run as vLLM makes it (greedy): prefill token, then per step the rule's
    draft, verified against ``next_token``; the per-step counts vLLM would report."""
    ctx = list(prompt)
    out = [next_token(ctx)]
    ctx.append(out[0])
    acc, dr = [], []
    while len(out) < n_new:
        draft = propose(ctx, cfg)
        committed = []
        for t in draft:
            want = next_token(ctx + committed)
            committed.append(want)
            if want != t:
                break
        else:
            committed.append(next_token(ctx + committed))
        if draft:
            dr.append(len(draft))
            acc.append(len(committed) - 1)
        committed = committed[:n_new - len(out)]
        out += committed
        ctx += committed
    if corrupt_step is not None:
        acc[corrupt_step] = dr[corrupt_step] if acc[corrupt_step] == 0 else 0
    return out, StepCounts(acc, dr)


def periodic_target(period):
    return lambda ctx: (ctx[-1] * 3 + len(ctx) % period) % 11


@pytest.mark.parametrize("period", [1, 2, 3, 5])
def test_rebuild_agrees_with_a_simulated_server(period):
    cfg = NgramConfig(6, 1, 3)
    prompt = [1, 2, 3, 1, 2, 4]
    out, counts = simulate_vllm(prompt, 60, periodic_target(period), cfg)
    rb = rebuild_ngram(prompt, out, counts, cfg)
    assert rb.failure is None and rb.agreed == rb.steps == len(counts.accepted)
    assert [t for r in rb.rounds for t in r.committed] == out
    assert rb.rounds[0].draft == [] and rb.rounds[0].committed == out[:1]   # the prefill token
    drafted = [r for r in rb.rounds if r.draft]
    # vLLM counts what it accepted; the last step may be cut by max_tokens
    assert [r.accepted for r in drafted][:-1] == counts.accepted[:-1]
    assert drafted[-1].accepted <= counts.accepted[-1]
    assert [len(r.draft) for r in drafted] == counts.drafted
    for r in drafted:   # accepted tokens are the draft's, the target's token differs from it
        assert r.committed[:r.accepted] == r.draft[:r.accepted]
        if r.accepted < len(r.draft) and len(r.committed) > r.accepted:
            assert r.committed[r.accepted] != r.draft[r.accepted]
            assert r.rejected_suffix == r.draft[r.accepted:]


def test_rebuild_names_the_step_that_disagrees():
    cfg = NgramConfig(6, 1, 3)
    prompt = [1, 2, 3, 1, 2, 4]
    out, counts = simulate_vllm(prompt, 60, periodic_target(2), cfg, corrupt_step=3)
    rb = rebuild_ngram(prompt, out, counts, cfg)
    assert rb.agreed == 3
    assert rb.failure is not None and "vLLM step 4" in rb.failure
    assert [t for r in rb.rounds for t in r.committed] == out   # every token still shown


def test_rebuild_with_a_wrong_config_says_so():
    cfg = NgramConfig(6, 1, 3)
    prompt = [1, 2, 3, 1, 2, 4]
    out, counts = simulate_vllm(prompt, 40, periodic_target(3), cfg)
    rb = rebuild_ngram(prompt, out, counts, NgramConfig(2, 1, 3))
    assert rb.failure and "vLLM drafted" in rb.failure


def test_counts_only_rounds_keep_counts_and_tokens():
    rb = counts_only(5, list(range(10, 20)), StepCounts([2, 0, 3], [4, 4, 4]), "vllm-eagle")
    assert [t for r in rb.rounds for t in r.committed] == list(range(10, 20))
    assert [r.accepted for r in rb.rounds[1:4]] == [2, 0, 3]
    assert all(r.extras["served"]["drafted"] == 4 for r in rb.rounds[1:4])
    assert rb.rounds[1].kind == "correction"     # 2 of 4 drafted accepted: a rejection
    assert not rb.rebuilt and "not reported" in rb.failure


def test_served_rounds_make_a_valid_trace():
    cfg = NgramConfig(6, 1, 3)
    prompt = [1, 2, 3, 1, 2, 4]
    out, counts = simulate_vllm(prompt, 30, periodic_target(2), cfg)
    rb = rebuild_ngram(prompt, out, counts, cfg)
    tr = Trace(meta={"method": "vllm-ngram", "vocab_size": 11,
                     "served": {"endpoint": "http://h:1", "rebuild": rb.summary()}},
               prompt_ids=prompt, rounds=rb.rounds, token_texts={i: f"t{i}" for i in range(11)})
    back = Trace.from_json(tr.to_json())
    assert back.output_ids == out and back.meta["served"]["rebuild"]["agreed"] == rb.agreed


@pytest.mark.parametrize("url,want", [("127.0.0.1:8123", "http://127.0.0.1:8123"),
                                      ("http://h:1/v1/", "http://h:1"),
                                      ("https://x.org/api/v1", "https://x.org/api")])
def test_normalise(url, want):
    assert normalise(url) == want


@pytest.mark.parametrize("url", ["", "ftp://h:1", "http://"])
def test_normalise_refuses(url):
    with pytest.raises(EndpointError):
        normalise(url)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_unreachable_endpoint_is_one_sentence():
    port = _closed_port()
    with pytest.raises(EndpointError, match="cannot reach .*serve-vllm"):
        server_info(f"127.0.0.1:{port}", timeout=2)
    with pytest.raises(EndpointError, match="cannot reach"):
        complete(f"127.0.0.1:{port}", "m", [1, 2], 4, timeout=2)


def test_speculating_server_without_detailed_metrics():
    from specviz.served.client import Completion, ServerInfo
    from specviz.served.run import Endpoint, spec_counts

    ep = Endpoint(ServerInfo("http://h:1", "m", 100), speculative=True)
    c = Completion([1], [2, 3], "length", None, 0.1)
    with pytest.raises(EndpointError, match="per-request-spec-decode-metrics detailed"):
        spec_counts(c, ep)
    c.spec = {"mean_acceptance_length": 1.5}
    with pytest.raises(EndpointError, match="only summary counts"):
        spec_counts(c, ep)
    assert spec_counts(Completion([1], [2], "length", None, 0.1),
                        Endpoint(ep.info, speculative=False)) is None


def test_endpoint_labels_and_levels():
    from specviz.served.bench import parse_endpoints, parse_levels

    assert parse_endpoints(["h:1", "ar2=http://h:2"]) == {"vllm": "http://h:1",
                                                          "ar2": "http://h:2"}
    with pytest.raises(EndpointError):
        parse_endpoints(["ar=h:1"])
    assert parse_levels("1,4,16") == [1, 4, 16] and parse_levels("") == []
    for bad in ("0", "x", "1000"):
        with pytest.raises(SettingsError):
            parse_levels(bad)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped counts as ended)."""
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_server_process_ends_with_the_process_that_started_it():
    """popen_tied (how VllmServer starts vLLM): SIGKILL the parent, the child goes too."""
    import subprocess
    import sys
    import time

    parent = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from specviz.served.server import popen_tied; "
         "p = popen_tied(['sleep', '120']); print(p.pid, flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert _running(child)                  # alive while its parent lives
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(child)
