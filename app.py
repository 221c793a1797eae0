"""specviz — the Streamlit app: run real speculative decoding round by round and see what the
target accepted and rejected.

Start it with ``streamlit run app.py``. This file is the entry point: navigation between the
pages and the sidebar (model, method, decoding settings, prompt) whose choices every page reads
from ``st.session_state["_cfg"]`` (or the error in ``st.session_state["_cfg_error"]``).
The model is loaded once per server (st.cache_resource, see pages/ui.py); each browser tab keeps
its own Session (and KV cache) in st.session_state.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

# PyTorch's OpenMP threads spin while they wait by default. On a small CPU shared with the
# browser and the Streamlit server that turns a 0.2 s round into 3 s (measured on the 2-core
# test machine); passive waiting keeps rounds fast. Must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# A short bounded spin (libgomp) still keeps the workers awake through one forward and yields
# between rounds: a one-token step 65 -> 47 ms on the 2-core machine (specviz/__main__.py).
os.environ.setdefault("GOMP_SPINCOUNT", "20000")

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from specviz import appstate  # noqa: E402
from specviz.drafters import METHODS  # noqa: E402
from specviz.drafters.registry import ParamSpec  # noqa: E402
from specviz.errors import SpecvizError  # noqa: E402

st.set_page_config(page_title="specviz — speculative decoding, step by step", page_icon="⚡",
                   layout="wide", initial_sidebar_state="expanded")

PAGE_CSS = """<style>
[data-testid="stMainBlockContainer"]{padding-top:2.2rem;padding-bottom:3rem;}
[data-testid="stSidebarUserContent"]{padding-top:0.5rem;}
[data-testid="stMetricValue"]{font-size:1.7rem;}
</style>"""
EMBEDDED = "Embedded SmolLM2-135M-Instruct"
CUSTOM = "Hugging Face id or local folder"
SIDEBAR_KEYS = ["model_choice", "model_name", "method", "mode", "temperature", "top_p",
                "max_new_tokens", "seed", "category", "example_id", "prompt_text",
                "chat_template"]


@st.cache_data(show_spinner=False)
def _examples() -> list[dict]:
    return appstate.load_examples()


def _keep_widget_state() -> None:
    """Widgets that are not drawn in a run lose their value; keep the sidebar's across pages."""
    for k in list(st.session_state.keys()):
        if k in SIDEBAR_KEYS or str(k).startswith("param_"):
            st.session_state[k] = st.session_state[k]


def _init_defaults(examples: list[dict]) -> None:
    ss = st.session_state
    defaults = {"model_choice": EMBEDDED, "model_name": "", "method": "pld" if "pld" in METHODS
                else next(iter(METHODS)), "mode": "Greedy", "temperature": 0.7, "top_p": 0.9,
                "max_new_tokens": appstate.DEFAULT_MAX_NEW_TOKENS, "seed": 0,
                "chat_template": True}
    for k, v in defaults.items():
        ss.setdefault(k, v)
    if "example_id" not in ss:
        ex = appstate.example_by_id(examples, appstate.DEFAULT_EXAMPLE_ID) or \
            (examples[0] if examples else None)
        ss["category"] = ex["category"] if ex else "free text"
        ss["example_id"] = ex["id"] if ex else ""
        ss["prompt_text"] = ex["prompt"] if ex else ""


def _on_category(examples: list[dict]) -> None:
    ss = st.session_state
    cat = appstate.examples_by_category(examples).get(ss["category"], [])
    if cat:
        ss["example_id"] = cat[0]["id"]
        ss["prompt_text"] = cat[0]["prompt"]


def _on_example(examples: list[dict]) -> None:
    ex = appstate.example_by_id(examples, st.session_state["example_id"])
    if ex:
        st.session_state["prompt_text"] = ex["prompt"]


def param_widget(spec: ParamSpec, key: str):
    """One method setting's sidebar widget, from its registry entry: a checkbox, a selectbox of
    its choices, a number input bounded by its range, or a text input."""
    hlp = spec.help or None
    if spec.type is bool:
        return st.checkbox(spec.label, key=key, help=hlp)
    if spec.choices:
        return st.selectbox(spec.label, list(spec.choices), key=key, help=hlp)
    if spec.type in (int, float):
        lo, hi = spec.range or (None, None)
        cast = spec.type
        return st.number_input(spec.label, key=key, help=hlp,
                               step=cast(1) if cast is int else 0.05,
                               min_value=None if lo is None else cast(lo),
                               max_value=None if hi is None else cast(hi))
    return st.text_input(spec.label, key=key, help=hlp)


def _model_section() -> str:
    """The target: the embedded default or any model id / folder."""
    ss = st.session_state
    st.markdown("**Model** (the target)")
    st.radio("Model", [EMBEDDED, CUSTOM], key="model_choice", label_visibility="collapsed")
    if ss["model_choice"] == CUSTOM:
        st.text_input("Model id or folder", key="model_name",
                      placeholder="HuggingFaceTB/SmolLM2-360M-Instruct or /path/to/model",
                      help="Any causal LM that transformers can load: a Hugging Face hub "
                           "id (needs network or the local HF cache) or a local folder.")
    return appstate.DEFAULT_MODEL if ss["model_choice"] == EMBEDDED else ss["model_name"]


def _method_section() -> tuple[str, dict]:
    """The drafter and its settings (one widget per ParamSpec of the method registry)."""
    ss = st.session_state
    st.markdown("**Method** (the drafter)")
    if ss.get("method") not in METHODS:
        ss["method"] = next(iter(METHODS))
    method = st.selectbox("Method", list(METHODS), key="method",
                          format_func=lambda m: METHODS[m].display,
                          label_visibility="collapsed")
    st.caption(METHODS[method].description)
    params = {}
    for spec in appstate.method_param_specs(method):
        key = f"param_{method}_{spec.name}"
        ss.setdefault(key, spec.default)
        params[spec.name] = param_widget(spec, key)
    if METHODS[method].hint:
        st.caption(METHODS[method].hint)
    return method, params


def _decoding_section() -> bool:
    """Greedy or sampled verification, length and seed; True when sampling."""
    ss = st.session_state
    st.markdown("**Decoding**")
    st.radio("Verification", ["Greedy", "Sampling"], key="mode", horizontal=True,
             help="Greedy: accept a draft token when it is the target's argmax (the output "
                  "is identical to plain greedy decoding). Sampling: rejection sampling "
                  "(the output follows the target's distribution).")
    sampling = ss["mode"] == "Sampling"
    if sampling:
        c = st.columns(2)
        c[0].number_input("Temperature", step=0.1, key="temperature", format="%.2f")
        c[1].number_input("Top-p", step=0.05, key="top_p", format="%.2f")
    c = st.columns(2)
    c[0].number_input("Max new tokens", step=16, key="max_new_tokens")
    c[1].number_input("Seed", step=1, key="seed", disabled=not sampling,
                      help="Seeds the sampler (sampling mode only).")
    return sampling


def _prompt_section(examples: list[dict]) -> str | None:
    """Category, example and the editable prompt; the example's id while its text is unedited."""
    ss = st.session_state
    by_cat = appstate.examples_by_category(examples)
    st.markdown("**Prompt**")
    cats = list(by_cat) + ["free text"]
    if ss.get("category") not in cats:
        ss["category"] = cats[0]
    st.selectbox("Category", cats, key="category", on_change=_on_category,
                 args=(examples,), format_func=str.capitalize)
    prompt_id = None
    if ss["category"] in by_cat:
        ids = [e["id"] for e in by_cat[ss["category"]]]
        if ss.get("example_id") not in ids:
            ss["example_id"] = ids[0]
            _on_example(examples)
        titles = {e["id"]: e["title"] for e in examples}
        st.selectbox("Example", ids, key="example_id", on_change=_on_example,
                     args=(examples,), format_func=lambda i: titles.get(i, i))
        ex = appstate.example_by_id(examples, ss["example_id"])
        if ex and ex["prompt"] == ss.get("prompt_text"):
            prompt_id = ex["id"]
    st.text_area("Prompt text (editable)", key="prompt_text", height=160)
    st.toggle("Apply the chat template", key="chat_template",
              help="Wrap the prompt in the model's chat template (instruct models).")
    return prompt_id


def sidebar(examples: list[dict]) -> None:
    """The run's settings; the validated config (or its error) goes to ``_cfg`` / ``_cfg_error``."""
    ss = st.session_state
    with st.sidebar:
        st.markdown("## ⚡ specviz")
        st.caption("Real speculative decoding, one round at a time.")
        model = _model_section()
        method, params = _method_section()
        sampling = _decoding_section()
        prompt_id = _prompt_section(examples)
        try:
            cfg = appstate.build_config(
                model=model, method=method, params=params, sampling=sampling,
                temperature=ss.get("temperature"), top_p=ss.get("top_p"),
                max_new_tokens=ss.get("max_new_tokens"), seed=ss.get("seed"),
                chat_template=ss.get("chat_template", True), prompt=ss.get("prompt_text", ""),
                prompt_id=prompt_id)
            ss["_cfg"], ss["_cfg_error"] = cfg, None
        except SpecvizError as exc:  # shown once, on the page (ui.page_start), not here too
            ss["_cfg"], ss["_cfg_error"] = None, str(exc)


def main() -> None:
    examples = _examples()
    _keep_widget_state()
    _init_defaults(examples)
    # url paths differ from the file names on purpose: Streamlit still scans pages/ the old
    # (v1) way until st.navigation runs, and AppTest does so on every run; a v1 page with the
    # same url path would be run directly, skipping this file's sidebar.
    pages = [
        st.Page("pages/decode.py", title="Decode step by step", icon=":material/play_circle:",
                url_path="step-by-step", default=True),
        st.Page("pages/compare.py", title="Compare methods", icon=":material/leaderboard:",
                url_path="compare-methods"),
        st.Page("pages/trace.py", title="Open a saved trace", icon=":material/upload_file:",
                url_path="open-trace"),
        st.Page("pages/served.py", title="Served run (vLLM)", icon=":material/dns:",
                url_path="served-run"),
        st.Page("pages/adapld.py", title="AdaPLD: where drafts come from",
                icon=":material/account_tree:", url_path="adapld-drafts"),
        st.Page("pages/retrace.py", title="ReTrace: rejected suffixes",
                icon=":material/replay:", url_path="retrace-memory"),
        st.Page("pages/edr.py", title="EDR: where the rounds go",
                icon=":material/timeline:", url_path="edr-rounds"),
    ]
    page = st.navigation(pages)
    st.html(PAGE_CSS)
    if page.url_path != "open-trace":
        sidebar(examples)
    else:
        with st.sidebar:
            st.markdown("## ⚡ specviz")
            st.caption("Exploring a saved trace: no model is loaded.")
    page.run()



main()
