"""The Streamlit app driven through its real widgets (streamlit.testing AppTest) on the embedded
model, plus the plain helpers behind the pages (specviz.appstate)."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from specviz import appstate
from specviz.engine import DecodeSettings, Session
from specviz.errors import SettingsError, TraceError
from specviz.trace import Trace
from specviz.viz.stats import speedup_estimate
from specviz.viz.tables import compare_runs_table, topk_table
from specviz.viz.tokens import tokens_html

APP = str(Path(__file__).resolve().parent.parent / "app.py")
TIMEOUT = 180


# ---------------------------------------------------------------- plain helpers (no model)
def test_examples_cover_categories_and_default():
    ex = appstate.load_examples()
    cats = appstate.examples_by_category(ex)
    assert {"math", "code", "dialogue"} <= set(cats)
    assert appstate.example_by_id(ex, appstate.DEFAULT_EXAMPLE_ID) is not None


def test_load_examples_skips_bad_lines(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"id": "a-1", "category": "math", "prompt": "x"}\nnot json\n{"id": 1}\n\n')
    assert [e["id"] for e in appstate.load_examples(p)] == ["a-1"]
    assert appstate.load_examples(tmp_path / "missing.jsonl") == []


def test_method_param_specs_from_drafter():
    specs = {s.name: s for s in appstate.method_param_specs("pld")}
    assert specs["max_matching_ngram_size"].default == 2
    assert specs["num_output_tokens"].kind == "int"
    assert appstate.method_param_specs("ar") == []
    assert appstate.method_param_specs("no-such-method") == []


def _cfg(**kw):
    args = dict(model="default", method="pld", params={}, sampling=False, temperature=0.7,
                top_p=0.9, max_new_tokens=64, seed=0, chat_template=True, prompt="hi")
    args.update(kw)
    return appstate.build_config(**args)


def test_build_config_valid_and_key():
    a = _cfg()
    assert a.settings.greedy and a.settings.max_new_tokens == 64
    assert a.key() == _cfg().key()
    assert a.key() != _cfg(prompt="other").key()
    assert a.key() != _cfg(params={"num_output_tokens": 5}).key()
    s = _cfg(sampling=True, temperature=0.5, top_p=0.8).settings
    assert s.temperature == 0.5 and s.top_p == 0.8


@pytest.mark.parametrize("kw, msg", [
    (dict(max_new_tokens=0), "at least 1"),
    (dict(max_new_tokens=10 ** 9), "at most"),
    (dict(max_new_tokens=2.5), "whole number"),
    (dict(sampling=True, temperature=1000.0), "temperature"),
    (dict(sampling=True, temperature=0.0), "temperature above 0"),
    (dict(sampling=True, top_p=0.0), "top_p"),
    (dict(seed=-1), "seed"),
    (dict(model="  "), "enter a model"),
    (dict(method="nope"), "unknown method"),
    (dict(params={"num_output_tokens": 0}), "Draft length must be a whole number from 1 to 128"),
    (dict(params={"num_output_tokens": 2.5}), "Draft length must be a whole number"),
    (dict(params={"nope": 1}), "unknown setting 'nope' for method 'pld'"),
])
def test_build_config_rejects_absurd_settings(kw, msg):
    with pytest.raises(SettingsError, match=msg):
        _cfg(**kw)


def test_target_cache_loads_once_and_remembers_errors():
    calls = []

    def loader(name, progress):
        calls.append(name)
        time.sleep(0.05)
        if name == "bad":
            from specviz.models import ModelLoadError
            raise ModelLoadError("cannot load model 'bad'")
        if progress:
            progress(1.0, "ready")
        return object()

    cache = appstate.TargetCache(loader=loader, max_models=2)
    out = []
    threads = [threading.Thread(target=lambda: out.append(cache.get("m1"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["m1"] and len({id(x) for x in out}) == 1 and cache.loaded("m1")
    from specviz.errors import SpecvizError
    for _ in range(2):
        with pytest.raises(SpecvizError, match="bad"):
            cache.get("bad")
    assert calls.count("bad") == 1 and cache.error("bad")
    cache.forget_error("bad")
    assert cache.error("bad") is None
    cache.get("m2")
    cache.get("m3")
    assert not cache.loaded("m1") and cache.loaded("m3")  # at most two models kept


def test_compare_runs_on_a_tiny_model(tiny_target):
    prompts = [appstate.ComparePrompt("p1", "one", " ".join(f"t{i % 7 + 3}" for i in range(40))),
               appstate.ComparePrompt("p2", "two", " ".join(f"t{i % 5 + 3}" for i in range(30)))]
    seen = []
    runs = [r for _, _, r in appstate.compare_runs(
        tiny_target, ["pld"], prompts, DecodeSettings(max_new_tokens=12, chat_template=False),
        progress=lambda f, t: seen.append(f))]
    assert [(r.prompt_id, r.method) for r in runs] == [("p1", "ar"), ("p1", "pld"),
                                                        ("p2", "ar"), ("p2", "pld")]
    assert seen and seen == sorted(seen) and 0 <= seen[0] and seen[-1] <= 1.0
    per = compare_runs_table(runs)
    assert per["identical_to_ar"].all()          # greedy speculative decoding is lossless
    assert (per[per.method == "ar"].target_forwards == per[per.method == "ar"].new_tokens).all()


@pytest.mark.parametrize("data, msg", [
    (b"", "empty"),
    (b"\xff\xfe garbage", "UTF-8"),
    (b"this is not json", "not valid JSON"),
    (b"[1, 2, 3]", "not a specviz trace"),
    (b"{}", "not a specviz trace"),
    (b'{"schema_version": 99, "rounds": []}', "schema_version"),
    (b'{"schema_version": 1, "rounds": [{"index": 0}]}', "round 1: 'start' is missing"),
    (b'{"schema_version": 1, "prompt_ids": [1], "rounds": [{"index": 0, "start": 1, '
     b'"drafter": "pld", "draft": [5], "accepted": 3, "committed": [5]}]}',
     "round 1: 'accepted' is 3 but the draft has 1 token"),
    (b'{"schema_version": 1, "prompt_ids": [1], "rounds": [{"index": 0, "start": 1, '
     b'"drafter": "pld", "draft": ["x"], "accepted": 0, "committed": [5]}]}', "list of token ids"),
    (b'{"schema_version": 1, "prompt_ids": [], "rounds": []}', "no rounds"),
])
def test_load_trace_bytes_rejects_corrupt_files(data, msg):
    with pytest.raises(TraceError, match=msg):
        appstate.load_trace_bytes(data)


# ---------------------------------------------------------------- AppTest (embedded model)
def new_app():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, at.exception
    return at


def tokens_markup(at) -> str:
    """The token view's HTML (not the legend, whose samples carry the same classes)."""
    return "".join(h.value for h in at.html if 'class="specviz-tokens"' in h.value)


def assert_clean(at):
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def app_after_rounds(method: str, rounds: int):
    """The app after choosing ``method`` and clicking Next round ``rounds`` times."""
    at = new_app()
    at.selectbox(key="method").set_value(method).run()
    assert_clean(at)
    for _ in range(rounds):
        at.button(key="next").click().run()
        assert_clean(at)
    return at


@pytest.fixture(scope="module")
def decoded_app():
    """The app after choosing PLD and clicking Next round three times."""
    return app_after_rounds("pld", 3)


@pytest.mark.integration
def test_next_round_three_times(decoded_app):
    at = decoded_app
    session = at.session_state["dec_session"]
    trace = at.session_state["dec_trace"]
    assert len(session.rounds) == 3 and trace.num_rounds == 3
    assert session.drafter.name == "pld" and trace.meta["method"] == "pld"
    markup = tokens_markup(at)
    assert 'class="tok accepted' in markup
    assert 'class="tok rejected' in markup
    assert 'class="tok bonus' in markup
    n_committed = markup.count('class="tok accepted') + markup.count('class="tok bonus')
    assert n_committed == trace.new_tokens
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Target forward passes"] == "3"
    assert metrics["tau (tokens / round)"] == f"{trace.tau:.2f}"
    # the per-round table
    df = next(d.value for d in at.dataframe if "t_verify_ms" in d.value.columns)
    assert list(df["round"]) == [1, 2, 3] and int(df["accepted"].sum()) == sum(
        r.accepted for r in trace.rounds)
    # latencies of the three clicks were recorded
    assert len(at.session_state["dec_latency"]) == 3


@pytest.mark.integration
def test_prompt_as_seen_topk_and_estimate_are_shown(decoded_app):
    """The prompt with its chat template marked, the top-k of the selected round one
    click away, and the speedup labelled as an estimate."""
    at = decoded_app
    trace = at.session_state["dec_trace"]
    prompt = "".join(h.value for h in at.html if 'class="specviz-prompt"' in h.value)
    assert 'class="ptok template' in prompt and 'class="ptok user' in prompt
    assert "added by the chat template" in prompt
    topk = next(d.value for d in at.dataframe if "target_topk" in d.value.columns)
    assert topk.equals(topk_table(trace, trace.num_rounds - 1))
    assert all(r.target_topk for r in trace.rounds)
    assert any("**estimate**" in c.value and "**measured**" in c.value for c in at.caption)


@pytest.mark.integration
def test_scrub_back_through_rounds(decoded_app):
    at = decoded_app
    trace = at.session_state["dec_trace"]
    at.slider(key="dec_scrub").set_value(1).run()
    assert_clean(at)
    markup = tokens_markup(at)
    first = trace.rounds[0]
    n = markup.count('class="tok accepted') + markup.count('class="tok bonus')
    assert n == len(first.committed)
    assert {m.label: m.value for m in at.metric}["Target forward passes"] == "1"
    at.slider(key="dec_scrub").set_value(3).run()
    assert {m.label: m.value for m in at.metric}["Target forward passes"] == "3"


@pytest.mark.integration
def test_run_to_end_then_reset():
    at = new_app()
    at.number_input(key="max_new_tokens").set_value(24).run()
    at.button(key="run").click().run()
    assert_clean(at)
    session = at.session_state["dec_session"]
    assert session.done and session.trace().new_tokens <= 24
    assert session.stop_reason in ("max_new_tokens", "eos")
    # once finished, Next round explains instead of failing
    at.button(key="next").click().run()
    assert not at.exception and any("finished" in i.value for i in at.info)
    at.button(key="reset").click().run()
    assert_clean(at)
    assert at.session_state["dec_trace"].num_rounds == 0
    # a fresh session is ready (its prefill done), with no rounds yet
    assert at.session_state["dec_session"] is not session
    assert at.session_state["dec_session"].rounds == []


@pytest.mark.integration
def test_changing_settings_starts_a_new_run():
    at = new_app()
    at.button(key="next").click().run()
    at.selectbox(key="method").set_value("ar").run()
    assert any("settings changed" in w.value for w in at.warning)
    at.button(key="next").click().run()
    assert_clean(at)
    trace = at.session_state["dec_trace"]
    assert trace.meta["method"] == "ar" and trace.num_rounds == 1
    assert 'class="tok bonus t-nodraft' in tokens_markup(at)


@pytest.mark.integration
def test_sampling_mode_and_settings_survive_page_switches():
    at = new_app()
    at.radio(key="mode").set_value("Sampling").run()
    at.number_input(key="temperature").set_value(0.8).run()
    at.number_input(key="seed").set_value(7).run()
    at.number_input(key="param_pld_num_output_tokens").set_value(5).run()
    at.button(key="next").click().run()
    assert_clean(at)
    trace = at.session_state["dec_trace"]
    assert trace.meta["settings"]["temperature"] == 0.8 and trace.meta["settings"]["seed"] == 7
    assert len(trace.rounds[0].draft) <= 5
    # the saved-trace page hides the sidebar; the choices must still be there on return
    at.switch_page("pages/trace.py").run()
    assert_clean(at)
    at.switch_page("pages/decode.py").run()
    assert_clean(at)
    assert at.radio(key="mode").value == "Sampling"
    assert at.number_input(key="param_pld_num_output_tokens").value == 5
    assert at.session_state["dec_trace"].num_rounds == 1   # the run is kept too


@pytest.mark.integration
def test_bad_inputs_show_errors_and_app_keeps_working():
    at = new_app()
    # empty prompt
    at.text_area(key="prompt_text").set_value("   ").run()
    at.button(key="next").click().run()
    assert not at.exception and any("empty" in e.value for e in at.error)
    at.selectbox(key="example_id").set_value("summarization-03").run()  # restores a prompt
    # absurd settings
    for key, value, msg in [("max_new_tokens", -5, "at least 1"),
                            ("max_new_tokens", 10 ** 7, "at most")]:
        at.number_input(key=key).set_value(value).run()
        at.button(key="next").click().run()
        assert not at.exception and any(msg in e.value for e in at.error), \
            [e.value for e in at.error]
    at.number_input(key="max_new_tokens").set_value(32).run()
    at.radio(key="mode").set_value("Sampling").run()
    at.number_input(key="temperature").set_value(1000.0).run()
    assert not at.exception and any("temperature" in e.value for e in at.error)
    # the message is shown once (on the page), not again in the sidebar
    assert sum("temperature" in e.value for e in at.error) == 1 and not at.sidebar.error
    at.number_input(key="temperature").set_value(0.8).run()
    at.number_input(key="top_p").set_value(0.0).run()
    assert not at.exception and any("top_p" in e.value for e in at.error)
    at.number_input(key="top_p").set_value(0.9).run()
    at.radio(key="mode").set_value("Greedy").run()
    # method settings: the widget is bounded by the registry's range (an out-of-range value is
    # not taken), and a value set behind the widget's back is refused with the setting's label
    draft_len = at.number_input(key="param_pld_num_output_tokens")
    assert (draft_len.label, draft_len.min, draft_len.max) == ("Draft length", 1, 128)
    draft_len.set_value(0).run()
    assert not at.exception and at.number_input(key="param_pld_num_output_tokens").value >= 1
    with pytest.raises(SettingsError, match="Draft length must be a whole number from 1 to 128"):
        _cfg(params={"num_output_tokens": 0})
    at.number_input(key="param_pld_num_output_tokens").set_value(10).run()
    # unknown models: a missing folder and a hub id that is not available offline
    at.radio(key="model_choice").set_value("Hugging Face id or local folder").run()
    for name in ("/nonexistent/folder", "no-such-org/no-such-model-xyz"):
        t0 = time.perf_counter()
        at.text_input(key="model_name").set_value(name).run()
        assert time.perf_counter() - t0 < 60, "an unknown model must fail fast"
        assert not at.exception and any(name in e.value for e in at.error), \
            [e.value for e in at.error]
        at.button(key="next").click().run()
        assert not at.exception and at.error
    at.text_input(key="model_name").set_value("").run()
    assert not at.exception and any("enter a model" in e.value for e in at.error)
    # ... and the app still works after all that
    at.radio(key="model_choice").set_value("Embedded SmolLM2-135M-Instruct").run()
    at.button(key="next").click().run()
    assert_clean(at)
    assert at.session_state["dec_trace"].num_rounds == 1


@pytest.mark.integration
def test_model_from_a_local_folder():
    """Any HF model folder works as the target (here: the embedded model's cached folder)."""
    from specviz.models import embedded_model_dir

    folder = str(embedded_model_dir())
    at = new_app()
    at.radio(key="model_choice").set_value("Hugging Face id or local folder").run()
    at.text_input(key="model_name").set_value(folder).run()
    assert_clean(at)
    at.button(key="next").click().run()
    assert_clean(at)
    trace = at.session_state["dec_trace"]
    assert trace.meta["model"] == folder and trace.num_rounds == 1


@pytest.mark.integration
def test_open_a_saved_trace_without_a_model(decoded_app):
    live = decoded_app.session_state["dec_trace"]
    # the upload path: bytes -> Trace (AppTest does not render st.file_uploader)
    trace = appstate.load_trace_bytes(live.to_json().encode("utf-8"))
    assert tokens_html(trace) == tokens_html(live)
    at = new_app()
    at.switch_page("pages/trace.py").run()
    assert_clean(at)
    assert any("Choose a trace file" in i.value for i in at.info)
    at.session_state["uploaded_trace"] = trace
    at.session_state["uploaded_name"] = "saved.json"
    at.run()
    assert_clean(at)
    markup = tokens_markup(at)
    assert 'class="tok accepted' in markup and 'class="tok rejected' in markup
    assert {m.label: m.value for m in at.metric}["Target forward passes"] == "3"
    # a corrupt upload shows an error and the page keeps working
    at.session_state["upload_error"] = "Cannot open bad.json: trace file is not valid JSON"
    at.run()
    assert not at.exception and at.error


@pytest.mark.integration
def test_compare_page():
    at = new_app()
    at.number_input(key="max_new_tokens").set_value(24).run()
    at.switch_page("pages/compare.py").run()
    assert_clean(at)
    at.multiselect(key="cmp_methods").set_value(["pld"]).run()
    at.button(key="cmp_run").click().run()
    assert_clean(at)
    runs = at.session_state["cmp_runs"]
    assert [r.method for r in runs] == ["ar", "pld"]
    summary = at.dataframe[0].value.set_index("method")
    assert summary.loc["ar", "speedup_vs_ar"] == 1.0
    assert summary.loc["pld", "target_forwards"] < summary.loc["ar", "target_forwards"]
    assert bool(summary.loc["pld", "identical_to_ar"])
    assert any("lossless" in s.value for s in at.success)
    # no method chosen: a clear error, not a traceback
    at.multiselect(key="cmp_methods").set_value([]).run()
    at.button(key="cmp_run").click().run()
    assert not at.exception and any("at least one method" in e.value for e in at.error)


@pytest.mark.integration
def test_two_tabs_do_not_share_sessions(decoded_app):
    """Two browser tabs share the cached model but each has its own Session / KV cache."""
    other = new_app()
    other.selectbox(key="example_id").set_value("summarization-02").run()
    for _ in range(2):
        other.button(key="next").click().run()
        decoded_app.button(key="next").click().run()
    assert_clean(other)
    assert_clean(decoded_app)
    a, b = decoded_app.session_state["dec_session"], other.session_state["dec_session"]
    assert a is not b and a.target is b.target and a.cache is not b.cache
    assert len(a.rounds) == 5 and len(b.rounds) == 2
    # each run equals the same run done alone
    for s in (a, b):
        from specviz.drafters import make_drafter
        alone = Session(s.target, make_drafter("pld"), s.prompt_text, s.settings, method="pld")
        alone.run(max_rounds=len(s.rounds))
        assert alone.generated == s.generated


@pytest.mark.integration
def test_concurrent_sessions_in_threads(embedded_target):
    """Two tabs stepping at the same time (threads): outputs equal the sequential ones."""
    from specviz.drafters import make_drafter

    prompts = [e["prompt"] for e in appstate.load_examples()
               if e["id"] in ("summarization-01", "code-06")]
    settings = DecodeSettings(max_new_tokens=24)
    alone = [Session(embedded_target, make_drafter("pld"), p, settings).run().output_ids
             for p in prompts]
    results: dict[int, list[int]] = {}

    def work(i):
        s = Session(embedded_target, make_drafter("pld"), prompts[i], settings)
        while s.step() is not None:
            time.sleep(0)
        results[i] = s.trace().output_ids

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(prompts))] == alone


def test_trace_roundtrip_through_upload_helper(tmp_path):
    from tests.test_viz import make_trace

    t = make_trace()
    path = tmp_path / "t.json"
    t.save(path)
    back = appstate.load_trace_bytes(path.read_bytes())
    assert back.output_ids == t.output_ids
    assert appstate.trace_filename(back).endswith(".json")
    assert isinstance(back, Trace)


@pytest.mark.integration
def test_dflash_decode_shows_slot_confidence():
    """The bundled DFlash drafter on the decode page: per-slot confidence chart + calibration."""
    at = app_after_rounds("dflash", 2)
    trace = at.session_state["dec_trace"]
    assert trace.meta["method"] == "dflash" and trace.num_rounds == 2
    ex = trace.rounds[-1].extras
    assert len(ex["confidence"]) == len(trace.rounds[-1].draft)  # the verified slots
    assert len(ex["cut"]["block_confidence"]) == ex["cut"]["block"] > 0  # every filled slot
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    assert any("drafter confidence per slot" in s for s in specs)
    assert any("Confidence vs acceptance" in s for s in specs)
    assert any("Drafter confidence per slot" in m.value for m in at.markdown)
    assert "rate" in ex["cut"] and any("forward gate" in e.label for e in at.expander)
    assert any("Forward gate: when the drafter ran" in s for s in specs)


def test_loaded_target_has_a_measured_cost_curve(tiny_target, monkeypatch):
    """The app measures the verify-cost curve when it loads a model, so every run's trace carries
    it and the Decode page's speedup estimate of a method that drafts every round (PLD) charges
    its wide verifies their measured cost instead of assuming they cost one plain step."""
    import specviz.models
    from specviz import costs
    from specviz.drafters import make_drafter

    monkeypatch.setattr(specviz.models, "load_target", lambda name, progress=None: tiny_target)
    monkeypatch.setattr(costs, "_CACHE", {})
    steps = []
    target = appstate.TargetCache().get("tiny", progress=lambda f, t: steps.append(t))
    assert any("verify" in t for t in steps)
    model = costs.cached_model(target)
    assert model is not None and model.kind == "measured" and model.step_time > 0
    tr = Session(target, make_drafter("pld", num_output_tokens=8), [5, 6, 7, 5, 6, 7, 5, 6] * 4,
                 DecodeSettings(max_new_tokens=24, chat_template=False)).run()
    assert tr.meta["cost_model"]["step_time"] > 0
    est = speedup_estimate(tr)
    assert est.value is not None
    assert "verify-cost model" in est.basis or "without a draft" in est.basis
