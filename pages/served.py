"""Served run: send prompts to a vLLM endpoint and see its speculative rounds as a trace
(docs/served.md). The library side is specviz.served; this page only draws."""
from __future__ import annotations

import os

import pandas as pd
import streamlit as st

from pages import ui
from specviz import appstate
from specviz.errors import SpecvizError
from specviz.served.client import DEFAULT_ENDPOINT
from specviz.served.ngram_rule import NgramConfig
from specviz.served.run import SPEC_METHODS, agreement, check_endpoint, served_row, served_trace
from specviz.viz.charts import fig_accepted_lengths
from specviz.viz.stats import accepted_lengths
from specviz.viz.tables import to_csv_bytes

ss = st.session_state


def settings_row() -> tuple[str, str, NgramConfig]:
    """(endpoint URL, the server's speculative method, its ngram settings)."""
    ss.setdefault("sv_url", os.environ.get("SPECVIZ_ENDPOINT", DEFAULT_ENDPOINT))
    c = st.columns([3, 1.4, 1, 1])
    url = c[0].text_input("Endpoint", key="sv_url",
                          help="http://HOST:PORT of a vLLM server (OpenAI API). Start a local "
                               "one with `python -m specviz serve-vllm`; a GPU cluster is the "
                               "same kind of URL.")
    method = c[1].selectbox("Its speculative method", SPEC_METHODS, key="sv_method",
                            help="ngram: the drafted tokens are rebuilt with vLLM's rule and "
                                 "checked; learned drafters (EAGLE, DFlash, ...): counts only.")
    lo = c[2].number_input("n-gram min", 1, 16, 1, key="sv_lo")
    hi = c[3].number_input("n-gram max", 1, 16, 2, key="sv_hi")
    return url, method, NgramConfig(10, int(lo), max(int(lo), int(hi)))


def choose_prompts(cfg) -> list[tuple[str, str]] | None:
    """(name, prompt) pairs when **Send** was pressed, else None."""
    by_cat = appstate.examples_by_category(appstate.load_examples())
    c = st.columns([2, 2, 1])
    which = c[0].radio("Prompts", ["The sidebar's prompt", "A small example set"],
                       key="sv_set", horizontal=True)
    cats: list[str] = []
    per_cat = 1
    if which == "A small example set":
        ss.setdefault("sv_cats", [k for k in ("math", "code") if k in by_cat])
        cats = c[1].multiselect("Categories", list(by_cat), key="sv_cats")
        per_cat = c[2].number_input("Per category", 1, 10, 2, key="sv_per_cat")
    if not st.button("Send to the endpoint", key="sv_run", type="primary",
                     icon=":material/cloud_upload:"):
        return None
    if which == "A small example set":
        return [(e["id"], e["prompt"]) for cat in cats for e in by_cat.get(cat, [])[:per_cat]]
    return [(cfg.prompt_id or "sidebar prompt", cfg.prompt)] if cfg is not None else []


def send(cfg, url: str, method: str, ngram: NgramConfig, prompts) -> None:
    """Check the endpoint, send every prompt (progress bar), keep the traces."""
    if cfg is None:
        st.error("Fix the settings in the sidebar first.")
        return
    if not prompts:
        st.error("Choose at least one category of example prompts.")
        return
    target = ui.load_target(cfg.model)
    if target is None:
        return
    prog = st.progress(0.0, text=f"0 / {len(prompts)} prompts")
    runs = []
    try:
        ep = check_endpoint(url, target.tokenizer)
        for i, (name, text) in enumerate(prompts):
            cfg_n = NgramConfig(ngram.num_speculative_tokens, ngram.prompt_lookup_min,
                                ngram.prompt_lookup_max, ep.info.max_model_len or 4096)
            runs.append((name, served_trace(target, ep, text, cfg.settings, method, cfg_n)))
            prog.progress((i + 1) / len(prompts), text=f"{i + 1} / {len(prompts)} prompts")
    except SpecvizError as exc:
        st.error(str(exc))
        return
    finally:
        prog.empty()
    ss["sv_runs"] = runs
    ss["sv_about"] = f"{ep.info.url} · served model *{ep.info.model}* · " + \
        ui.decoding_text(cfg.settings)


def show(runs) -> None:
    """Agreement, the per-prompt table, the acceptance histogram, one run's token view."""
    st.caption("Sent to " + ss.get("sv_about", ""))
    checks = [agreement(t) for _, t in runs]
    oks = [ok for ok, _ in checks if ok is not None]
    if oks and all(oks):
        st.success(f"Agreement check: every draft step of {len(oks)} run(s) rebuilt and in "
                   "agreement with vLLM's accepted counts.")
    for (name, _), (ok, line) in zip(runs, checks):
        if ok is False or ok is None:
            (st.warning if ok is False else st.info)(f"{name}: {line}")
    table = pd.DataFrame([served_row(n, t) for n, t in runs])
    st.dataframe(table, hide_index=True, width="stretch")
    lengths = [x for _, t in runs for x in accepted_lengths(t)]
    st.plotly_chart(fig_accepted_lengths(lengths), width="stretch", config=ui.PLOTLY_CONFIG,
                    key="sv_hist")
    st.download_button("Runs (CSV)", to_csv_bytes(table), file_name="specviz-served-runs.csv",
                       mime="text/csv", key="sv_dl", on_click="ignore")
    names = [n for n, _ in runs]
    pick = st.selectbox("Run to explore", names, key="sv_pick") if len(runs) > 1 else names[0]
    trace = dict(runs)[pick]
    st.caption("vLLM times no single step: each round's time is the request's wall time "
               "spread evenly.")
    ui.trace_view(trace, prefix="sv", downloads=True)


def main() -> None:
    cfg = ui.page_start(
        "Served run",
        "Send prompts to a vLLM server and see its speculative rounds in the same views as a "
        "local run. vLLM reports how many tokens each step drafted and accepted; for ngram "
        "speculation specviz rebuilds the drafted tokens with vLLM's own rule and checks them "
        "against those counts, so the rejected suffix is shown exactly. The prompt is sent as "
        "the sidebar model's token ids, so the server must serve the same model.")
    url, method, ngram = settings_row()
    prompts = choose_prompts(cfg)
    if prompts is not None:
        send(cfg, url, method, ngram, prompts)
    runs = ss.get("sv_runs")
    if runs:
        show(runs)


main()
