"""Served runs against a real local vLLM server (tests/served_support.py starts it): served
ngram runs become traces whose rebuilt drafts agree with vLLM's per-step counts, the greedy text
equals specviz's own plain decoding, the CLI and the bench talk to it, and bad endpoints get one
sentence each. vLLM's own proposer function is compared with specviz's copy of its rule."""
from __future__ import annotations

import json
import random
import subprocess

import pytest

from specviz.engine import DecodeSettings
from specviz.errors import PromptError
from specviz.served.client import EndpointError
from specviz.served.ngram_rule import NgramConfig, propose
from tests.conftest import real_prompt_sets

pytestmark = pytest.mark.integration

VLLM_RULE = """
import json, sys
import numpy as np
from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as f
out = []
for ctx, lo, hi, k, max_len in json.load(sys.stdin):
    out.append(f(np.array(ctx, dtype=np.int32), lo, hi, max_len, k).tolist())
print(json.dumps(out))
"""


def test_rule_equals_vllms_own_function():
    from specviz.errors import SpecvizError
    from specviz.served.server import vllm_python

    try:
        py = vllm_python()
    except SpecvizError as exc:
        pytest.skip(str(exc))
    rng = random.Random(0)
    cases = []
    for _ in range(1500):
        vocab = rng.choice([2, 3, 6, 50])
        ctx = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        lo = rng.randint(1, 3)
        hi = rng.randint(lo, 6)
        cases.append([ctx, lo, hi, rng.randint(1, 10), rng.choice([4096, len(ctx) + 3])])
    res = subprocess.run([str(py), "-c", VLLM_RULE], input=json.dumps(cases), text=True,
                         capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    theirs = json.loads(res.stdout.strip().splitlines()[-1])
    mine = [propose(c, NgramConfig(k, lo, hi, ml)) for c, lo, hi, k, ml in cases]
    assert sum(bool(t) for t in theirs) > 500          # the cases exercise real matches
    assert mine == theirs


@pytest.fixture(scope="module")
def endpoint(vllm_server, embedded_target):
    from specviz.served.run import check_endpoint

    return check_endpoint(vllm_server.url, embedded_target.tokenizer)


@pytest.mark.parametrize("per_category", real_prompt_sets(4))
def test_served_ngram_runs_rebuild_and_match_local_ar(endpoint, embedded_target, per_category):
    """5 example prompts (20 with -m slow): every vLLM draft step is rebuilt in agreement;
    greedy text = specviz AR."""
    from specviz.analysis.lossless import compare_outputs
    from specviz.drafters import make_drafter
    from specviz.engine import Session
    from specviz.served.run import served_trace
    from tests.conftest import example_prompts

    assert endpoint.speculative
    settings = DecodeSettings(max_new_tokens=24)
    prompts = [p["prompt"] for p in example_prompts(per_category, start=6)]
    assert len(prompts) == 5 * per_category
    steps = agreed = differ = 0
    for text in prompts:
        tr = served_trace(embedded_target, endpoint, text, settings)
        rb = tr.meta["served"]["rebuild"]
        assert rb["failure"] is None, (text, rb)
        assert rb["agreed"] == rb["steps"]
        steps, agreed = steps + rb["steps"], agreed + rb["agreed"]
        drafted = [r for r in tr.rounds if r.draft]
        assert all(r.extras["served"]["rebuilt"] for r in drafted)
        ar = Session(embedded_target, make_drafter("ar", embedded_target), text, settings).run()
        if tr.output_ids != ar.output_ids:      # only a float near-tie may tell them apart
            differ += 1
            assert compare_outputs(embedded_target, ar.prompt_ids, ar.output_ids,
                                   tr.output_ids).near_tie, text
    print(f"\nserved ngram: {agreed}/{steps} draft steps rebuilt in agreement on "
          f"{len(prompts)} prompts; greedy text differs from specviz AR on {differ}")
    assert steps > 3 * len(prompts) and agreed == steps


def test_cli_served_and_bench_endpoint(vllm_server, tmp_path, capsys):
    from specviz.cli import main
    from specviz.trace import Trace

    out = tmp_path / "served.json"
    assert main(["served", "--endpoint", vllm_server.url, "--max-new-tokens", "24",
                 "--prompt", "Count: one two three, one two three, one two", "--no-color",
                 "--save", str(out)]) == 0
    text = capsys.readouterr().out
    assert "method=vllm-ngram" in text and "rebuilt drafts agree with vLLM on" in text
    tr = Trace.load(out)
    assert tr.meta["served"]["endpoint"] == vllm_server.url and tr.new_tokens > 0
    assert main(["bench", "--data", "examples/prompts.jsonl:1", "--categories", "code",
                 "--methods", "pld", "--max-new-tokens", "12", "--endpoint",
                 f"vllm-ngram={vllm_server.url}", "--concurrency", "2",
                 "--out", str(tmp_path / "b")]) == 0
    text = capsys.readouterr().out
    bench = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert {r["method"] for r in bench["table"]} == {"ar", "pld", "vllm-ngram"}
    assert [r["concurrency"] for r in bench["meta"]["throughput"]] == [2]
    assert bench["meta"]["accepted_length_histogram"]["vllm-ngram"]
    assert "served throughput" in text


def test_bad_endpoints_and_prompts(vllm_server, endpoint, embedded_target, tiny_target):
    from specviz.served.run import check_endpoint, served_trace

    with pytest.raises(EndpointError, match="tokenizes text differently"):
        check_endpoint(vllm_server.url, tiny_target.tokenizer)
    with pytest.raises(PromptError, match="empty"):
        served_trace(embedded_target, endpoint, "   ", DecodeSettings(max_new_tokens=4))
    long_ids = [42] * (endpoint.info.max_model_len + 5)
    with pytest.raises(PromptError, match="server's context"):
        served_trace(embedded_target, endpoint, long_ids, DecodeSettings(max_new_tokens=4))
    with pytest.raises(EndpointError, match="unknown speculative method"):
        served_trace(embedded_target, endpoint, "hi", DecodeSettings(max_new_tokens=4),
                     spec_method="magic")


def test_served_page_apptest(vllm_server):
    """The Served-run page through its real widgets: one prompt, then an example set, then an
    endpoint nobody answers (one red sentence)."""
    from tests.test_app import assert_clean, new_app

    at = new_app()
    at.number_input(key="max_new_tokens").set_value(20).run()
    at.switch_page("pages/served.py").run()
    assert_clean(at)
    at.text_input(key="sv_url").set_value(vllm_server.url).run()
    at.button(key="sv_run").click().run()
    assert_clean(at)
    runs = at.session_state["sv_runs"]
    assert len(runs) == 1 and runs[0][1].meta["method"] == "vllm-ngram"
    assert any("Agreement check" in s.value for s in at.success)
    at.radio(key="sv_set").set_value("A small example set").run()
    at.multiselect(key="sv_cats").set_value(["code", "math"]).run()
    at.number_input(key="sv_per_cat").set_value(1).run()
    at.button(key="sv_run").click().run()
    assert_clean(at)
    table = at.dataframe[0].value
    assert list(table["prompt"]) == ["code-01", "math-01"]
    assert (table["agreed"] == table["draft_steps"]).all()
    at.text_input(key="sv_url").set_value("http://127.0.0.1:9").run()
    at.button(key="sv_run").click().run()
    assert not at.exception and any("cannot reach" in e.value for e in at.error)


@pytest.mark.browser
def test_served_page_in_the_browser(server, browser, vllm_server):
    """The Served-run page in Chromium: send the sidebar's prompt to the real vLLM server, see
    the rounds in the token view and the agreement check."""
    from tests.browser_support import ARTIFACTS, IDLE, open_page

    page = browser.new_page(viewport={"width": 1440, "height": 1100})
    try:
        open_page(page, server, "Served run (vLLM)")
        page.get_by_role("button", name="Send to the endpoint").wait_for(timeout=120_000)
        box = page.get_by_role("textbox", name="Endpoint")
        box.fill(vllm_server.url)
        box.press("Enter")
        page.wait_for_selector(IDLE, timeout=60_000)
        page.get_by_role("button", name="Send to the endpoint").click()
        page.get_by_text("Agreement check").wait_for(timeout=240_000)
        page.wait_for_selector(".specviz-tokens .tok", timeout=60_000)
        page.wait_for_selector(IDLE, timeout=60_000)
        assert page.locator("[data-testid='stException']").count() == 0
        page.screenshot(path=str(ARTIFACTS / "served-run.png"), full_page=True)
    finally:
        page.close()


def test_rollouts_from_the_served_engine(vllm_server, embedded_target, tmp_path, capsys):
    """``train rollouts --engine vllm --endpoint``: replies from the real server, labels from
    one specviz prefill; the folder reads as a rollout set and its replies are the greedy ones."""
    from specviz.cli import main
    from specviz.drafters import make_drafter
    from specviz.engine import Session
    from specviz.train.rollout_store import RolloutSet

    data = tmp_path / "p.jsonl"
    rows = [{"id": f"r{i}", "category": "t", "prompt": p} for i, p in enumerate(
        ["Name three colours.", "What is 12 + 30?", "Say hello in French."])]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "roll"
    assert main(["train", "rollouts", "--engine", "vllm", "--endpoint", vllm_server.url,
                 "--data", str(data), "--out", str(out), "--max-new-tokens", "12",
                 "--holdout", "0"]) == 0
    assert "vLLM generated" in capsys.readouterr().out
    rs = RolloutSet(out)
    assert len(rs) == 3
    for i, r in enumerate(rs.rows):
        toks, _, plen = rs.load(i)
        prompt = next(x["prompt"] for x in rows if r["key"].endswith(":" + x["id"]))
        ar = Session(embedded_target, make_drafter("ar", embedded_target), prompt,
                     DecodeSettings(max_new_tokens=12)).run()
        assert toks.tolist()[:plen] == ar.prompt_ids
        assert toks.tolist()[plen:] == ar.output_ids
