"""Compare page: run several methods on the same prompt(s), with plain decoding (AR) as the
baseline in the same run, and compare tau, forward passes, wall time and real speedup."""
from __future__ import annotations

import streamlit as st

from pages import ui
from specviz import appstate
from specviz.drafters import METHODS
from specviz.metrics import METRIC_HELP
from specviz.viz.charts import fig_compare
from specviz.viz.tables import (compare_runs_table, compare_summary_table, compare_verdict,
                                to_csv_bytes)

ss = st.session_state


def choose(cfg) -> tuple[list[str], list[appstate.ComparePrompt] | None]:
    """The comparison's settings row: (methods, and -- when **Run comparison** was pressed --
    the prompts to run, else None)."""
    choices = [m for m in METHODS if m != "ar"]
    ss.setdefault("cmp_methods", [cfg.method] if cfg and cfg.method in choices else choices[:2])
    by_cat = appstate.examples_by_category(appstate.load_examples())
    c = st.columns([2, 2, 1])
    methods = c[0].multiselect("Methods (AR runs as the baseline anyway)", choices,
                               key="cmp_methods", format_func=lambda m: METHODS[m].display,
                               help="; ".join(f"{METHODS[m].display}: {METHODS[m].description}"
                                              for m in choices))
    prompt_set = c[1].radio("Prompts", ["The sidebar's prompt", "A small example set"],
                            key="cmp_set", horizontal=True)
    per_cat = 1
    cats: list[str] = []
    if prompt_set == "A small example set":
        ss.setdefault("cmp_cats", [k for k in ("math", "code", "summarization") if k in by_cat])
        cats = st.multiselect("Categories", list(by_cat), key="cmp_cats")
        per_cat = c[2].number_input("Prompts per category", min_value=1, max_value=5, value=1,
                                    key="cmp_per_cat")
    if not st.button("Run comparison", key="cmp_run", type="primary",
                     icon=":material/play_arrow:"):
        return methods, None
    prompts: list[appstate.ComparePrompt] = []
    if prompt_set == "A small example set":
        for cat in cats:
            for e in by_cat.get(cat, [])[:int(per_cat)]:
                prompts.append(appstate.ComparePrompt(e["id"], e["title"], e["prompt"]))
    elif cfg is not None:
        prompts.append(appstate.ComparePrompt(cfg.prompt_id or "sidebar", "sidebar prompt",
                                              cfg.prompt))
    return methods, prompts


def run_comparison(cfg, methods: list[str], prompts: list[appstate.ComparePrompt]) -> None:
    """AR and ``methods`` on ``prompts``; the runs, their verdict and a caption into the
    session state (a red message instead when something is missing)."""
    if cfg is None:
        st.error("Fix the settings in the sidebar first.")
    elif not methods:
        st.error("Choose at least one method to compare with plain decoding.")
    elif not prompts:
        st.error("Choose at least one category of example prompts.")
    else:
        target = ui.load_target(cfg.model)
        runs = None if target is None else ui.run_vs_ar(
            target, methods, prompts, cfg.settings, {cfg.method: cfg.params})
        if runs is not None:
            ss["cmp_verdict"] = compare_verdict(runs, target)  # near-ties checked
            ss["cmp_runs"] = runs
            ss["cmp_greedy"] = cfg.settings.greedy
            ss["cmp_about"] = (
                f"{len(prompts)} prompt(s) · model *{target.name}* · "
                + ui.decoding_text(cfg.settings) + " · "
                + ", ".join(f"{m.upper()} {cfg.params}" if m == cfg.method and cfg.params
                            else m.upper() for m in methods))


def show_runs(runs) -> None:
    """The side-by-side table, the verdict, the chart, the per-prompt table and downloads."""
    summary = compare_summary_table(runs)
    per = compare_runs_table(runs)
    st.markdown("##### Side by side")
    if ss.get("cmp_about"):
        st.caption("Ran on " + ss["cmp_about"])
    st.dataframe(summary, hide_index=True, width="stretch",
                 column_config=ui.compare_columns("Prefill + decoding, all prompts"))
    verdict = ss.get("cmp_verdict") or compare_verdict(runs)
    getattr(st, verdict.level)(verdict.message)
    st.plotly_chart(fig_compare(summary), width="stretch", config=ui.PLOTLY_CONFIG,
                    key="cmp_fig")
    st.markdown("##### Per prompt")
    st.dataframe(per, hide_index=True, width="stretch", column_config={
        "tau": st.column_config.NumberColumn("tau", format="%.2f"),
        "wall_s": st.column_config.NumberColumn("wall time (s)", format="%.2f"),
        "speedup_vs_ar": st.column_config.NumberColumn(
            "speedup vs AR", format="%.2f×", help=METRIC_HELP["speedup_vs_ar"]),
        "identical_to_ar": st.column_config.CheckboxColumn("same as AR"),
    })
    d = st.columns(2)
    d[0].download_button("Summary (CSV)", to_csv_bytes(summary),
                         file_name="specviz-compare-summary.csv", mime="text/csv",
                         key="cmp_dl_summary", on_click="ignore", width="stretch")
    d[1].download_button("Per prompt (CSV)", to_csv_bytes(per),
                         file_name="specviz-compare-runs.csv", mime="text/csv",
                         key="cmp_dl_runs", on_click="ignore", width="stretch")


def main() -> None:
    cfg = ui.page_start(
        "Compare methods",
        "Every method runs to the end on the same prompt(s) with the sidebar's model and "
        "decoding settings. Plain autoregressive decoding (**AR**) always runs too, on the same "
        "prompts in the same run, so the speedup here is **measured**: AR's wall time ÷ the "
        "method's, prefill and every round included. The Decode page's speedup is an "
        "**estimate** from one run's round times and acceptance (AR not run), so the two can "
        "differ.")
    methods, prompts = choose(cfg)
    if prompts is not None:
        run_comparison(cfg, methods, prompts)
    runs = ss.get("cmp_runs")
    if runs:
        show_runs(runs)


main()
