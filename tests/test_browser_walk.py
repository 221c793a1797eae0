"""A user's walk through the app in a real browser: four tabs decoding at once on different
prompts (each output checked against the same run made alone), sampling on the Decode page, bad
sidebar input (one message each, the app still usable), and the Next-round settle time of every
method. The measured times go to test-artifacts/browser-walk.json."""
from __future__ import annotations

import json
import statistics
import time

import pytest

from tests.browser_support import ARTIFACTS, IDLE, max_round_js, pick

pytestmark = [pytest.mark.browser, pytest.mark.integration]

ERROR = "[data-testid='stAlertContentError']"
EXCEPTION = "[data-testid='stException']"
FINISHED_JS = "() => document.body.innerText.includes('· finished')"
#: round i on screen, or the run finished before it
ROUND_OR_END_JS = ("n => { const el = document.querySelectorAll('.specviz-tokens [data-round]');"
                   " let m = -1; el.forEach(e => { m = Math.max(m, +e.dataset.round); });"
                   " return m + 1 >= n || document.body.innerText.includes('· finished'); }")
#: four tabs: a method and a prompt each (not from any data set)
TABS = [
    ("PLD", "Translate into French: The cat sleeps on the warm windowsill every afternoon, "
            "and the dog sleeps by the door."),
    ("AdaPLD", "Write a Python function that returns the sum of the squares of a list of "
               "numbers, then explain it."),
    ("DFlash", "Tom has 3 apples and buys 5 more. He gives 2 apples to Ann. How many apples "
               "does Tom have now? Think step by step."),
    ("AR", "Summarize in one sentence: The museum opened a new wing on Monday. The new wing "
           "holds paintings from the 1800s, and the museum expects more visitors."),
]
TAB_TOKENS = 20   # new tokens per tab
REPORT: dict = {}


def _write_report() -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    old = {}
    path = ARTIFACTS / "browser-walk.json"
    if path.exists():
        old = json.loads(path.read_text())
    path.write_text(json.dumps({**old, **REPORT}, indent=1))


def _ready(page, server: str) -> None:
    page.goto(server + "/", wait_until="domcontentloaded")
    page.get_by_role("button", name="Next round").wait_for(timeout=180_000)
    page.wait_for_selector(IDLE, timeout=180_000)


def _settle(page) -> None:
    page.wait_for_timeout(150)   # the click's rerun starts
    page.wait_for_selector(IDLE, timeout=180_000)


def _set_number(page, key: str, value) -> None:
    box = page.locator(f".st-key-{key} input")
    box.fill(str(value))
    box.press("Enter")
    _settle(page)


def _set_text(page, key: str, text: str, area: bool = False) -> None:
    box = page.locator(f".st-key-{key} {'textarea' if area else 'input'}")
    box.fill(text)
    box.press("Control+Enter" if area else "Enter")
    _settle(page)


def _click(page, name: str) -> None:
    page.get_by_role("button", name=name, exact=True).click()
    _settle(page)


def _errors(page) -> list[str]:
    return page.locator(ERROR).all_inner_texts()


def _download_trace(page, path):
    from specviz.trace import Trace

    with page.expect_download(timeout=60_000) as dl:
        page.get_by_role("button", name="Trace (JSON)").click()
    dl.value.save_as(str(path))
    return Trace.load(path)


def test_four_tabs_decode_at_once_each_as_if_alone(server, browser, embedded_target, tmp_path):
    """Four tabs, four methods, four prompts, Run to end clicked in all four before any
    finishes: each tab's output is its own -- the same as its run made alone afterwards
    (identical, or different only after a near-tie of the target's top two tokens)."""
    from specviz.analysis.lossless import compare_outputs

    ctxs = [browser.new_context(viewport={"width": 1280, "height": 900}) for _ in TABS]
    pages = [c.new_page() for c in ctxs]
    try:
        for page, (method, prompt) in zip(pages, TABS):
            _ready(page, server)
            _set_number(page, "max_new_tokens", TAB_TOKENS)
            pick(page, "method", method)
            _set_text(page, "prompt_text", prompt, area=True)
            assert not _errors(page), _errors(page)
        t0 = time.perf_counter()
        for page in pages:   # all four clicked before waiting for any
            page.get_by_role("button", name="Run to end").click()
        for page in pages:
            page.wait_for_function(FINISHED_JS, timeout=300_000)
            page.wait_for_selector(IDLE, timeout=300_000)
        wall = time.perf_counter() - t0
        together = [_download_trace(p, tmp_path / f"tab{i}.json") for i, p in enumerate(pages)]
        alone, t_alone = [], []
        for i, page in enumerate(pages):   # the same runs again, one tab at a time
            _click(page, "Reset")
            t1 = time.perf_counter()
            page.get_by_role("button", name="Run to end").click()
            page.wait_for_function(FINISHED_JS, timeout=300_000)
            page.wait_for_selector(IDLE, timeout=300_000)
            t_alone.append(time.perf_counter() - t1)
            alone.append(_download_trace(page, tmp_path / f"alone{i}.json"))
        identical = 0
        for (method, prompt), a, b in zip(TABS, together, alone):
            assert a.meta["prompt"] == prompt and a.meta["method"] == method.lower()
            assert a.prompt_ids == b.prompt_ids and 0 < a.new_tokens <= TAB_TOKENS
            rep = compare_outputs(embedded_target, a.prompt_ids, b.output_ids, a.output_ids)
            assert rep.ok, (method, rep.first_divergence, rep.top2_gap)
            identical += a.output_ids == b.output_ids
        # the prompts are different, so are the outputs: no tab shows another's run
        assert len({tuple(t.output_ids) for t in together}) == len(TABS)
        for page in pages:
            assert page.locator(EXCEPTION).count() == 0
        REPORT["four_tabs"] = {
            "methods": [m for m, _ in TABS], "tokens_each": TAB_TOKENS,
            "wall_s_all_four_at_once": round(wall, 2),
            "wall_s_each_alone": [round(x, 2) for x in t_alone],
            "outputs_identical_to_alone": identical}
        _write_report()
        print("four tabs at once:", REPORT["four_tabs"])
    finally:
        for c in ctxs:
            c.close()


def test_sampling_mode_on_decode(server, browser, tmp_path):
    """Sampling with temperature 0.8: rounds run, the trace records the settings, and the seed
    makes the run reproducible (Reset, the same rounds again give the same tokens)."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        _ready(page, server)
        pick(page, "method", "PLD")
        page.locator(".st-key-mode").get_by_text("Sampling", exact=True).click()
        _settle(page)
        _set_number(page, "temperature", 0.8)
        _set_number(page, "seed", 7)
        runs = []
        for k in range(2):
            for i in range(1, 4):
                page.get_by_role("button", name="Next round").click()
                page.wait_for_function(max_round_js(), arg=i, timeout=60_000)
                page.wait_for_selector(IDLE, timeout=60_000)
            runs.append(_download_trace(page, tmp_path / f"sampled{k}.json"))
            _click(page, "Reset")
        assert not _errors(page) and page.locator(EXCEPTION).count() == 0
        s = runs[0].meta["settings"]
        assert (s["temperature"], s["seed"], runs[0].num_rounds) == (0.8, 7, 3)
        assert runs[0].output_ids == runs[1].output_ids
    finally:
        page.close()


def test_bad_sidebar_input_one_message_each(server, browser, tmp_path):
    """Each bad input gives one message in the app's words and no traceback; after all of
    them the app still decodes."""
    empty_folder = tmp_path / "not-a-model"
    empty_folder.mkdir()
    (empty_folder / "README.txt").write_text("no model here")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    seen = {}
    try:
        _ready(page, server)

        def one_message(case: str, expect: str, click_next: bool = True) -> None:
            if click_next:
                _click(page, "Next round")
            errs = _errors(page)
            assert len(errs) == 1 and expect in errs[0], (case, errs)
            assert page.locator(EXCEPTION).count() == 0, case
            assert "Traceback" not in errs[0], case
            seen[case] = errs[0]

        prompt = page.locator(".st-key-prompt_text textarea").input_value()
        _set_text(page, "prompt_text", "", area=True)
        one_message("empty prompt", "empty")
        _set_text(page, "prompt_text", "word " * 10_000, area=True)   # 50,000 characters
        one_message("50,000-character prompt", "context")
        _set_text(page, "prompt_text", prompt, area=True)
        for value, expect in ((0, "at least 1"), (100_000, "at most")):
            _set_number(page, "max_new_tokens", value)
            one_message(f"max new tokens {value}", expect)
        _set_number(page, "max_new_tokens", 32)
        page.locator(".st-key-model_choice").get_by_text("Hugging Face id or local folder").click()
        _settle(page)
        for case, name in (("unknown model id", "no-such-org/no-such-model-xyz"),
                           ("a folder without a model", str(empty_folder))):
            _set_text(page, "model_name", name)
            one_message(case, name, click_next=False)
        page.locator(".st-key-model_choice").get_by_text("Embedded SmolLM2-135M-Instruct").click()
        _settle(page)
        page.get_by_role("button", name="Next round").click()
        page.wait_for_function(max_round_js(), arg=1, timeout=120_000)
        page.wait_for_selector(IDLE, timeout=60_000)
        assert not _errors(page) and page.locator(EXCEPTION).count() == 0
        assert page.locator(".specviz-tokens .tok").count() > 0
        REPORT["bad_input_messages"] = seen
        _write_report()
        print(json.dumps(seen, indent=1))
    finally:
        page.close()


@pytest.mark.slow   # a measurement (about a minute): `bash scripts/test.sh -m slow`
def test_next_round_settle_time_of_every_method(server, browser):
    """Each method on a math prompt: Next round clicked 3 times, click -> script idle (the
    first click of a method builds its session's first round only: the prefill ran when the
    method was chosen)."""
    from specviz.drafters import METHODS

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    settle = {}
    try:
        _ready(page, server)
        _set_number(page, "max_new_tokens", 128)
        _set_text(page, "prompt_text", TABS[2][1], area=True)   # a math prompt: drafters draft
        for name, spec in METHODS.items():
            pick(page, "method", spec.display)
            _click(page, "Reset")   # the last method's rounds leave the screen
            times = []
            for i in range(1, 4):
                t0 = time.perf_counter()
                page.get_by_role("button", name="Next round").click()
                page.wait_for_function(ROUND_OR_END_JS, arg=i, timeout=120_000)
                page.wait_for_selector(IDLE, timeout=120_000)
                times.append(time.perf_counter() - t0)
                if page.evaluate(FINISHED_JS):   # a run can end in fewer rounds (EOS)
                    break
            assert not _errors(page) and page.locator(EXCEPTION).count() == 0, name
            settle[name] = {"median_s": round(statistics.median(times), 3),
                            "clicks_s": [round(x, 3) for x in times]}
        REPORT["next_round_settle"] = settle
        _write_report()
        print("Next round settle, median s:", {k: v["median_s"] for k, v in settle.items()})
        # the goal is 1 s; a busy 2-core CI machine shares its cores with Chromium and the
        # server, so the bound that fails the test is looser
        assert all(v["median_s"] < 5.0 for v in settle.values()), settle
    finally:
        page.close()
