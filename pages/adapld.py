"""AdaPLD page: where each draft of an AdaPLD run came from (the matched spans in the context,
the looked-up suffix, the copied tokens), the draft tree and what the target accepted,
retrieval kinds over the run, and an ablation (lexical → + semantic → + branches, with PLD and
plain decoding for reference) on the same prompt. The views come from specviz.viz.adapld."""
from __future__ import annotations

import dataclasses

import streamlit as st

from pages import ui
from specviz import appstate
from specviz.drafters import make_drafter
from specviz.errors import SpecvizError
from specviz.metrics import METRIC_HELP
from specviz.viz import adapld as va
from specviz.viz.adapld_context import context_legend_html, context_spans_html
from specviz.viz.charts import fig_compare

ss = st.session_state
SOURCES = {"decode": "The Decode page's run", "page": "The run made on this page",
           "upload": "A saved trace"}
ABLATION_CHOICES = [("adapld_lex", "Lexical only", True), ("adapld_sem", "+ semantic", True),
                    ("adapld_nohist", "+ branches", True),
                    ("adapld", "+ history store (full AdaPLD)", True),
                    ("pld", "PLD (reference)", True)]


# ---------------------------------------------------------------- settings of the runs
def run_method(cfg) -> str:
    """The AdaPLD variant this page runs: the sidebar's method if it is one, else full AdaPLD."""
    return cfg.method if cfg is not None and cfg.method in va.ADAPLD_METHODS else "adapld"


def variant_params(cfg, method: str) -> dict:
    """Settings for ``method``: the sidebar's if it is the sidebar method, else the values last
    set for it in the sidebar (kept in the session state), else the drafter's defaults."""
    if cfg is not None and method == cfg.method:
        return dict(cfg.params)
    out = {}
    for spec in appstate.method_param_specs(method):
        key = f"param_{method}_{spec.name}"
        if key in ss:
            out[spec.name] = ss[key]
    return out


def settings_error(cfg, method: str) -> str | None:
    """The drafter's own validation of the settings (out-of-range budgets etc.), or None."""
    try:
        make_drafter(method, None, **variant_params(cfg, method))
    except SpecvizError as exc:
        return f"{method.upper()} settings: {exc}. Fix it in the sidebar."
    return None


def _request_run(method: str) -> None:
    ss["_ada_run_request"] = method


def run_here(cfg, method: str) -> None:
    """Run ``method`` to the end on the sidebar's prompt and settings (progress bar)."""
    target = ui.load_target(cfg.model)
    if target is None:
        return
    run_cfg = dataclasses.replace(cfg, method=method, params=variant_params(cfg, method))
    prog = st.progress(0.0, text=f"Running {method.upper()} …")
    try:
        session = appstate.new_session(target, run_cfg)

        def on_progress(done: int, total: int) -> None:
            prog.progress(min(done / max(total, 1), 1.0),
                          text=f"Running {method.upper()} … {done}/{total} tokens")

        session.run(progress=on_progress)
        ss["ada_trace"] = session.trace()
        ss["ada_source"] = "page"
    except SpecvizError as exc:
        st.error(str(exc))
    prog.empty()


# ---------------------------------------------------------------- which run to show
def available_traces() -> dict:
    """The runs the page can show (the Decode page's, its own, an uploaded one) by source; the
    shown source defaults to the first AdaPLD run."""
    traces = {}
    dec = ss.get("dec_trace")
    if dec is not None and dec.rounds:
        traces["decode"] = dec
    if ss.get("ada_trace") is not None:
        traces["page"] = ss["ada_trace"]
    if ss.get("uploaded_trace") is not None:
        traces["upload"] = ss["uploaded_trace"]
    if ss.get("ada_source") not in traces:
        adapld_first = [k for k in ("decode", "page", "upload") if k in traces
                        and va.is_adapld_trace(traces[k])]
        ss["ada_source"] = (adapld_first or list(traces) or ["page"])[0]
    return traces


def _meta_line(t) -> str:
    m = t.meta
    return (f"**{str(m.get('method', '?')).upper()}** on *{m.get('model', '?')}* · "
            f"{t.num_rounds} rounds · {t.new_tokens} tokens · tau {t.tau:.2f}"
            + (f" · stop: {m['stop_reason']}" if m.get("stop_reason") else ""))


def source_bar(cfg, method: str, err: str | None, traces: dict):
    """The run button, the source picker and a line about the chosen run; (source, its run)."""
    bar = st.columns([2.2, 5], vertical_alignment="center")
    label = f"Run {method.upper()} on the sidebar prompt" if cfg is not None and \
        cfg.method in va.ADAPLD_METHODS else "Run AdaPLD on the current prompt"
    bar[0].button(label, key="ada_run", type="primary", width="stretch",
                  icon=":material/play_arrow:", on_click=_request_run, args=(method,),
                  disabled=cfg is None or bool(err),
                  help="Runs to the end with the sidebar's model, prompt and decoding settings "
                       "(the Decode page's run is not touched).")
    if len(traces) > 1:
        with bar[1]:
            st.radio("Show", list(traces), key="ada_source", horizontal=True,
                     format_func=lambda k: SOURCES[k] + (f" ({ss.get('uploaded_name', 'file')})"
                                                         if k == "upload" else ""),
                     label_visibility="collapsed")
    source = ss["ada_source"]
    trace = traces.get(source)
    if trace is None:
        bar[1].markdown("No run yet: press the button to run "
                        + (f"**{method.upper()}**" if cfg else "AdaPLD")
                        + " on the sidebar prompt, or step through one on the **Decode** page.")
    elif len(traces) == 1:
        bar[1].markdown(f"{SOURCES[source]}: " + _meta_line(trace))
    else:
        st.markdown(_meta_line(trace))
    return source, trace


def usable(trace, cfg, method: str, err: str | None):
    """``trace`` when it is an AdaPLD run with rounds, else None (saying why)."""
    if trace is not None and not va.is_adapld_trace(trace):
        st.warning(f"This run uses **{str(trace.meta.get('method', '?')).upper()}**, not an "
                   "AdaPLD method, so it has no retrieval details to show. Run AdaPLD on the "
                   "same prompt (or choose an AdaPLD method in the sidebar).")
        st.button("Run AdaPLD on the current prompt", key="ada_run_switch",
                  icon=":material/account_tree:", on_click=_request_run, args=(method,),
                  disabled=cfg is None or bool(err))
        return None
    if trace is not None and not trace.rounds:
        st.info("This run has no rounds yet.")
        return None
    return trace


# ---------------------------------------------------------------- one round
def tree_rounds_of(trace) -> list[int]:
    """The rounds (from 1) whose draft was a tree; a caption says why when there is none."""
    tree_rounds = [r.index + 1 for r in trace.rounds if r.parents is not None]
    why_no_trees = "" if tree_rounds else va.chains_only(trace)
    if why_no_trees:
        st.caption(why_no_trees)
    return tree_rounds


def pick_round(trace, source: str, tree_rounds: list[int]) -> int:
    """The round slider with jumps to the previous / next tree round; the chosen round (from
    1)."""
    n = trace.num_rounds
    sig = (source, id(trace), n)
    if ss.get("_ada_sig") != sig or not 1 <= int(ss.get("ada_round", 0) or 0) <= n:
        ss["_ada_sig"] = sig
        ss["ada_round"] = va.default_round(trace)

    def _jump(step: int) -> None:
        cur = int(ss.get("ada_round", 1))
        cands = [k for k in tree_rounds if (k > cur if step > 0 else k < cur)]
        if cands:
            ss["ada_round"] = cands[0] if step > 0 else cands[-1]

    cur = int(ss["ada_round"])
    row = st.columns([6, 1.3, 1.3], vertical_alignment="bottom")
    with row[0]:
        if n > 1:
            sel = st.slider("Round", 1, n, key="ada_round",
                            help="Every view below shows this round (the retrieval chart marks "
                                 "it).")
        else:
            sel = 1
    row[1].button("◀ tree round", key="ada_prev_tree", on_click=_jump, args=(-1,),
                  width="stretch", disabled=not any(k < cur for k in tree_rounds),
                  help="The previous round whose draft was a tree (several branches).")
    row[2].button("tree round ▶", key="ada_next_tree", on_click=_jump, args=(1,),
                  width="stretch", disabled=not any(k > cur for k in tree_rounds),
                  help="The next round whose draft was a tree (several branches).")
    return sel


def show_context(trace, i: int) -> None:
    """Round ``i``'s context with the matches, the suffix and the copied draft; its matches."""
    head = st.columns([4, 1.6], vertical_alignment="bottom")
    head[0].markdown("##### Context: the matches, the suffix and the copied draft")
    collapse = head[1].toggle("Only around the matches", value=True, key="ada_collapse",
                              help="Hide long stretches of the context that no match touches.")
    st.html(context_legend_html(include_css=True))
    st.html(context_spans_html(trace, i, collapse=12 if collapse else None,
                               include_css=False))
    matches = va.matches_table(trace, i)
    with st.expander(f"Matches of round {i + 1} ({len(matches)})"):
        if matches.empty:
            st.caption("No match this round.")
        else:
            st.dataframe(matches, hide_index=True, width="stretch", column_config={
                "score": st.column_config.NumberColumn("score", format="%.3f",
                                                       help="Lexical: 0.5 n/max_ngram + 0.2 "
                                                            "recency + 0.3 votes; semantic: "
                                                            "cosine similarity"),
                "similarity": st.column_config.NumberColumn("cosine", format="%.3f"),
                "drafted": st.column_config.TextColumn(
                    "drafted", help="The branch of the draft it became, or 'no' for a ranked "
                                    "alternative that was not drafted"),
            })


def show_draft(trace, i: int) -> None:
    """Round ``i``'s draft tree and what the target kept."""
    st.markdown("##### The draft and what the target kept")
    st.plotly_chart(va.branch_tree_figure(trace, i), width="stretch", config=ui.PLOTLY_CONFIG,
                    key="ada_fig_tree")
    st.caption("Root = the last committed token. Green: accepted (the accepted path is bold); "
               "red: the target checked it and disagreed; grey: below a rejected token, never "
               "checked. On the dotted edge: the target's own token (amber: a correction; blue: a "
               "bonus after a fully accepted draft). Hover a token for the target's "
               "probabilities.")


# ---------------------------------------------------------------- retrieval over the run
def show_retrieval(trace, i: int, tree_rounds: list[int]) -> None:
    """Retrieval kinds over the run (round ``i`` marked) and per source."""
    st.markdown("##### Retrieval over the run")
    counts = va.retrieval_counts(trace)
    c = st.columns(5)
    c[0].metric("Lexical rounds", counts["lexical"], help="An n-gram of the suffix matched.")
    c[1].metric("Semantic rounds", counts["semantic"],
                help="No lexical match of 2+ tokens; a similar window matched.")
    c[2].metric("No match", counts["none"], help="Nothing matched: a plain decoding step.")
    c[3].metric("Paused", counts["off"],
                help="The matching source did not pay lately, so the adaptive control drafted "
                     "nothing (it probes it again after 4, 8, 16, 32 rounds; a weak "
                     "source, such as a one-token match, after 16, 32, 64).")
    c[4].metric("Tree rounds", len(tree_rounds), help="Rounds whose draft had several branches.")
    st.plotly_chart(va.fig_retrieval(trace, i), width="stretch", config=ui.PLOTLY_CONFIG,
                    key="ada_fig_retrieval")
    st.dataframe(va.retrieval_table(trace), hide_index=True, width="stretch", column_config={
        "first_token_hit": st.column_config.NumberColumn(
            "first token accepted", format="%.2f",
            help="Share of this source's drafted rounds whose first token was accepted"),
        "tau": st.column_config.NumberColumn("tau", format="%.2f",
                                             help=METRIC_HELP["tau"] + ", over its rounds"),
        "tree_rounds": "tree rounds",
    })


def show_run(trace, source: str) -> None:
    """Everything about one AdaPLD run: a round picked, its context, draft, and the retrieval
    over the run."""
    tree_rounds = tree_rounds_of(trace)
    sel = pick_round(trace, source, tree_rounds)
    i = sel - 1
    st.html(va.round_summary_html(trace, i))
    show_context(trace, i)
    show_draft(trace, i)
    show_retrieval(trace, i, tree_rounds)


# ---------------------------------------------------------------- ablation
def ablation_choices() -> tuple[list[str], bool]:
    """The ablation's variant checkboxes and button: (the chosen methods, button pressed)."""
    st.markdown("##### Ablation: one component at a time, on the same prompt")
    st.caption("Each selected variant runs to the end on the sidebar's prompt and settings, "
               "after plain decoding (**AR**, the baseline, always runs) in the same run, so "
               "wall times and speedups are measured side by side.")
    cols = st.columns(len(ABLATION_CHOICES) + 1)
    cols[0].checkbox("AR (baseline, always)", value=True, disabled=True, key="ada_abl_ar")
    chosen = []
    for col, (m, text, default) in zip(cols[1:], ABLATION_CHOICES):
        ss.setdefault(f"ada_abl_{m}", default)
        if col.checkbox(text, key=f"ada_abl_{m}", help=f"method {m}"):
            chosen.append(m)
    return chosen, st.button("Run the ablation", key="ada_abl_run", icon=":material/science:")


def run_ablation(cfg, chosen: list[str]) -> None:
    """AR and the ``chosen`` variants on the sidebar's prompt, into the session state."""
    if cfg is None:
        st.error("Fix the settings in the sidebar first.")
    elif not chosen:
        st.error("Choose at least one variant to compare with plain decoding.")
    else:
        errors = [e for e in (settings_error(cfg, m) for m in chosen) if e]
        if errors:
            for e in errors:
                st.error(e)
        else:
            target = ui.load_target(cfg.model)
            prompt = appstate.ComparePrompt(cfg.prompt_id or "sidebar", "sidebar prompt",
                                            cfg.prompt)
            runs = None if target is None else ui.run_vs_ar(
                target, chosen, [prompt], cfg.settings,
                {m: variant_params(cfg, m) for m in chosen})
            if runs is not None:
                ss["ada_abl_runs"] = runs
                ss["ada_abl_about"] = (f"prompt *{cfg.prompt_id or 'sidebar (edited)'}* · "
                                       f"model *{target.name}* · "
                                       + ui.decoding_text(cfg.settings))


def show_ablation(runs) -> None:
    table = va.ablation_table(runs)
    if ss.get("ada_abl_about"):
        st.caption("Ran on " + ss["ada_abl_about"])
    st.dataframe(table, hide_index=True, width="stretch", column_config=ui.compare_columns())
    st.plotly_chart(fig_compare(table), width="stretch", config=ui.PLOTLY_CONFIG,
                    key="ada_fig_ablation")


def main() -> None:
    cfg = ui.page_start(
        "AdaPLD: where drafts come from",
        "AdaPLD drafts by looking the end of the text up in the prompt and what was generated so "
        "far: an exact n-gram match (**lexical**), or a window that means something similar "
        "(**semantic**), and copies what followed it; with nothing to copy, what the target "
        "most often wrote next in its own earlier replies (**history**). Several matches can be "
        "merged into a **token tree** that the target checks in one forward pass. Pick a round "
        "to see its matches, the draft and what the target kept.")
    method = run_method(cfg)
    err = settings_error(cfg, method) if cfg is not None else None
    if err:
        st.error(err)
    request = ss.pop("_ada_run_request", None)
    if request and cfg is not None and not settings_error(cfg, request):
        run_here(cfg, request)
    with st.expander("Open a saved trace here", expanded=False):
        ui.trace_upload("ada_upload", id_key="ada_upload_id", error_key="ada_upload_error",
                        on_load={"ada_source": "upload"})
    source, trace = source_bar(cfg, method, err, available_traces())
    trace = usable(trace, cfg, method, err)
    if trace is not None:
        show_run(trace, source)
    chosen, pressed = ablation_choices()
    if pressed:
        run_ablation(cfg, chosen)
    runs = ss.get("ada_abl_runs")
    if runs:
        show_ablation(runs)


main()
