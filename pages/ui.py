"""Streamlit pieces shared by the pages: the model cache, the settings from the sidebar, and the
trace explorer (tokens, metrics, round table, charts, downloads) that renders any Trace — a live
run or an uploaded file — in the same way. The numbers and figures come from specviz.viz."""
from __future__ import annotations

import streamlit as st

from specviz import appstate
from specviz.errors import SpecvizError
from specviz.metrics import METRIC_HELP
from specviz.trace import Trace
from specviz.viz.charts import (block_confidences, fig_accepted_hist, fig_confidence_calibration,
                                fig_cost_curve, fig_gate, fig_position_acceptance,
                                fig_round_lengths, fig_slot_confidence, gate_rounds, has_confidence)
from specviz.viz.prompt import copied_from_prompt, prompt_html
from specviz.viz.rounds import WAIT_SHOWN_S, round_summary_html
from specviz.viz.stats import live_metrics, trace_prefix
from specviz.viz.tables import (CHAIN_VIEWS, CompareRun, position_table, rounds_table,
                                to_csv_bytes, topk_table)
from specviz.viz.tokens import legend_html, tokens_html
from specviz.viz.tree import block_tree_figure

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}
REJECTED_MODES = {"all": "every round", "selected": "selected round only", "none": "hide"}


# ---------------------------------------------------------------- model
@st.cache_resource(show_spinner=False)
def target_cache() -> appstate.TargetCache:
    """ONE target cache per server process, shared by all tabs (each tab keeps its own Session,
    hence its own KV cache, in st.session_state; the target's lock serialises forwards)."""
    return appstate.TargetCache()


def load_target(name: str):
    """The loaded target, loading it with a progress bar the first time; None on failure
    (an st.error is shown with a Retry button)."""
    cache = target_cache()
    if cache.loaded(name):
        return cache.get(name)
    err = cache.error(name)
    if err:
        st.error(f"Model: {err}")
        if st.button("Retry loading the model", key="retry_model"):
            cache.forget_error(name)
            st.rerun()
        return None
    bar = st.progress(0.0, text=f"Loading model {name} (first time only) …")

    def progress(frac: float, text: str) -> None:
        bar.progress(min(max(float(frac), 0.0), 1.0), text=text)

    try:
        target = cache.get(name, progress=progress)
    except SpecvizError as exc:
        bar.empty()
        st.error(f"Model: {exc}")
        return None
    bar.empty()
    return target


# ---------------------------------------------------------------- settings
def current_config() -> tuple[appstate.AppConfig | None, str | None]:
    return st.session_state.get("_cfg"), st.session_state.get("_cfg_error")


def show_config_error(err: str | None) -> None:
    if err:
        st.error(f"Settings: {err}. Fix it in the sidebar.")


def page_start(title: str, caption: str) -> appstate.AppConfig | None:
    """A page's title and caption; returns the sidebar's settings (None, with a red message
    saying why, when they are invalid)."""
    st.markdown(f"## {title}")
    st.caption(caption)
    cfg, err = current_config()
    show_config_error(err)
    return cfg


def decoding_text(s) -> str:
    """The decoding settings of a run in words (greedy, or sampling T / top-p / seed)."""
    return (("greedy" if s.greedy else f"sampling T={s.temperature:g}, top-p={s.top_p:g}, "
             f"seed {s.seed}") + f" · up to {s.max_new_tokens} new tokens")


def run_vs_ar(target, methods: list[str], prompts: list, settings,
              params: dict[str, dict]) -> list[CompareRun] | None:
    """AR and ``methods`` run to the end on ``prompts`` (interleaved, appstate.compare_runs)
    under a progress bar; None, with a red message, when a run fails."""
    total = (len(methods) + 1) * len(prompts)
    prog = st.progress(0.0, text=f"0 / {total} runs")

    def on_progress(frac: float, text: str) -> None:
        prog.progress(min(max(frac, 0.0), 1.0), text=text)

    try:
        return [r for _, _, r in appstate.compare_runs(target, methods, prompts, settings,
                                                       params, progress=on_progress)]
    except SpecvizError as exc:
        st.error(str(exc))
        return None
    finally:
        prog.empty()


def compare_columns(wall_help: str = "Prefill + decoding") -> dict:
    """Column settings of a table of runs vs AR (Compare page, AdaPLD ablation): the metrics
    with their one definition (specviz.metrics)."""
    num = st.column_config.NumberColumn
    return {
        "new_tokens": num("new tokens", help="Tokens generated (all prompts together)"),
        "tau": num("tau", format="%.2f", help=METRIC_HELP["tau"]),
        "tokens_per_s": num("tokens / s", format="%.1f",
                            help="New tokens ÷ wall time (prefill + decoding)"),
        "target_forwards": num("target forwards", help=METRIC_HELP["target_forwards"]),
        "wall_s": num("wall time (s)", format="%.2f", help=wall_help),
        "speedup_vs_ar": num("speedup vs AR", format="%.2f×", help=METRIC_HELP["speedup_vs_ar"]),
        "identical_to_ar": st.column_config.CheckboxColumn(
            "same as AR", help=METRIC_HELP["identical_to_ar"]),
    }


# ---------------------------------------------------------------- trace upload
def trace_upload(key: str, id_key: str, error_key: str, on_load: dict | None = None,
                 reset: tuple[str, ...] = (), drop_on_error: bool = False) -> None:
    """A trace-file uploader shared by the pages. A newly chosen file is read once into
    ``session_state["uploaded_trace"]`` (its name in ``"uploaded_name"``); on success the
    ``on_load`` values are set and ``error_key`` and the ``reset`` keys dropped; a bad file's
    message goes to ``session_state[error_key]`` (``drop_on_error``: the previous trace is
    dropped too) and is shown below the uploader. ``id_key`` remembers the file read last."""
    ss = st.session_state
    up = st.file_uploader("Trace file (JSON)", type=["json"], key=key)
    if up is not None and ss.get(id_key) != up.file_id:
        ss[id_key] = up.file_id
        try:
            ss["uploaded_trace"] = appstate.load_trace_bytes(up.getvalue())
            ss["uploaded_name"] = up.name
            for k, v in (on_load or {}).items():
                ss[k] = v
            for k in (error_key, *reset):
                ss.pop(k, None)
        except SpecvizError as exc:
            if drop_on_error:
                ss.pop("uploaded_trace", None)
            ss[error_key] = f"Cannot open {up.name}: {exc}"
    if ss.get(error_key):
        st.error(ss[error_key])


# ---------------------------------------------------------------- trace explorer
def _fmt(x, spec: str, none: str = "—") -> str:
    return none if x is None else format(x, spec)


def metrics_row(trace: Trace) -> None:
    m = live_metrics(trace)
    c = st.columns(5)
    c[0].metric("tau (tokens / round)", f"{m['tau']:.2f}" if m["rounds"] else "—",
                help=METRIC_HELP["tau"] + " (so far).")
    c[1].metric("Target forward passes", m["target_forwards"],
                help=METRIC_HELP["target_forwards"] + ". Plain decoding needs one per "
                     "generated token.")
    c[2].metric("Generated tokens", m["new_tokens"],
                help=f"Drafted {m['drafted']} tokens, accepted {m['accepted']}.")
    waited = (f" {m['wait_time']:.2f} s of it was waiting for another tab's turn on the "
              "shared model." if m["wait_time"] >= WAIT_SHOWN_S else "")
    c[3].metric("Tokens / s", f"{m['tokens_per_s']:.1f}" if m["rounds"] else "—",
                help=f"Generated tokens ÷ decode time ({m['decode_time']:.2f} s; the "
                     f"prefill took {m['prefill_time']:.2f} s and is not included).{waited}")
    c[4].metric("Speedup (estimate)", _fmt(m["speedup_est"], ".2f") + ("×" if m["speedup_est"]
                                                                       else ""),
                help=m["speedup_explain"])
    if m["speedup_est"]:
        st.caption("The speedup here is an **estimate** from this run's round times and "
                   "acceptance; plain decoding was not run. The **Compare** page times plain "
                   "decoding and the method in the same run: its **measured** speedup can "
                   "differ.")


def _rounds_dataframe(table) -> None:
    st.dataframe(table, hide_index=True, width="stretch", height=min(38 + 35 * len(table), 320),
                 column_config={
                     "drafted": st.column_config.NumberColumn(
                         "drafted", help="Draft tokens sent to the target this round"),
                     "accepted": st.column_config.NumberColumn(
                         "accepted (count)", help="Draft tokens the target accepted"),
                     "committed": st.column_config.NumberColumn(
                         "new tokens", help="Tokens this round added: accepted + the target's "
                                            "own token"),
                     "output_pos": st.column_config.NumberColumn(
                         "output pos", help="Output position of the round's first token"),
                     "target_token_kind": st.column_config.TextColumn(
                         "target token is", help="correction (after a rejection), bonus (whole "
                                                 "draft accepted) or no draft"),
                     "accepted_text": "accepted text", "target_token": "target token",
                     "rejected_text": "rejected suffix", "drafter_info": "where the draft came "
                                                                         "from",
                     "p_first_rejected": st.column_config.TextColumn(
                         "p(first rejected)",
                         help="Target probability of the draft token it rejected (— when "
                              "nothing was rejected)"),
                     "t_draft_ms": st.column_config.NumberColumn("draft (ms)", format="%.1f"),
                     "t_forward_ms": st.column_config.NumberColumn(
                         "verify forward (ms)", format="%.1f",
                         help="The target's forward pass alone (compute)"),
                     "t_wait_ms": st.column_config.NumberColumn(
                         "waited for model (ms)", format="%.1f",
                         help="Time the verify spent waiting for another tab's turn on the "
                              "shared model: a queue, not compute"),
                     "t_verify_ms": st.column_config.NumberColumn(
                         "verify total (ms)", format="%.1f",
                         help="Wait + forward + verification + cache update"),
                 })
    if (table["t_wait_ms"] >= WAIT_SHOWN_S * 1000).any():
        st.caption("Some rounds waited for another browser tab's turn on the shared model "
                   "(**waited for model**): that time is a queue, not this method's compute.")


def _scrub(trace: Trace, prefix: str) -> int:
    """The 'show the run up to round' slider; returns the chosen round count."""
    n = len(trace.rounds)
    scrub_key = f"{prefix}_scrub"
    if n <= 1:
        return n
    if st.session_state.get(scrub_key, n + 1) > n:
        st.session_state[scrub_key] = n
    return st.slider("Show the run up to round", 1, n, key=scrub_key,
                     help="Scrub back through the rounds already run; everything below "
                          "(tokens, metrics, table, charts) shows the run as it was then.")


def _tokens_section(trace: Trace, view: Trace, sel: int, prefix: str) -> None:
    head = st.columns([3, 2])
    with head[0]:
        st.markdown("##### Generated text, token by token")
    with head[1]:
        mode = st.radio("Rejected draft tokens", list(REJECTED_MODES),
                        format_func=REJECTED_MODES.get, horizontal=True,
                        key=f"{prefix}_rejected", label_visibility="collapsed")
    st.html(legend_html(include_css=True))
    st.html(tokens_html(view, rejected=mode, selected_round=sel - 1 if sel else None,
                            include_css=False))
    if sel:
        st.html(round_summary_html(view, sel - 1))
        _topk_section(view, sel - 1)
        _chain_section(view, sel - 1)
    with st.expander(f"Prompt as the model saw it ({len(trace.prompt_ids)} tokens, chat "
                     "template included)"):
        if sel and copied_from_prompt(view, sel - 1):
            st.caption(f"Round {sel}'s draft was copied from the prompt: outlined below.")
        st.html(prompt_html(view, sel - 1 if sel else None))


def _topk_section(view: Trace, i: int) -> None:
    """Round ``i`` slot by slot: the drafter's and the target's top-k at each judged slot."""
    with st.expander("Top-k at each judged slot of this round"):
        st.caption(f"Round {i + 1}: each draft token the target judged, with what the drafter "
                   "and the target "
                   "would have picked there and how likely. Lookup drafters (PLD, AdaPLD) copy "
                   "one token and have no top-k (—). Draft tokens after the first rejection "
                   "were never judged and are left out.")
        st.dataframe(topk_table(view, i), hide_index=True, width="stretch",
                     column_config={
                         "slot": st.column_config.NumberColumn(
                             "slot", help="Draft position (1 = first token after the prompt "
                                          "so far)"),
                         "drafted": "drafted token", "verdict": "verdict",
                         "p_target": st.column_config.TextColumn(
                             "target p(drafted)", help="The target's probability of the "
                                                       "drafted token"),
                         "drafter_topk": "drafter's top-k", "target_topk": "target's top-k"})


def _chain_section(view: Trace, i: int) -> None:
    """Round ``i`` of a DFlash2 or Domino drafter: how its left-to-right pass chose the words."""
    for key, (title, caption, table) in CHAIN_VIEWS.items():
        if (view.rounds[i].extras or {}).get(key):
            with st.expander(title, expanded=True):
                st.caption(caption)
                st.dataframe(table(view, i), hide_index=True, width="stretch")


def _chart(fig, key: str) -> None:
    st.plotly_chart(fig, width="stretch", config=PLOTLY_CONFIG, key=key)


def _charts_section(view: Trace, sel: int, prefix: str) -> None:
    st.markdown("##### Charts")
    _chart(fig_round_lengths(view, sel - 1 if sel else None), f"{prefix}_fig_rounds")
    c = st.columns(2)
    with c[0]:
        _chart(fig_position_acceptance(view), f"{prefix}_fig_pos")
    with c[1]:
        _chart(fig_accepted_hist(view), f"{prefix}_fig_hist")
    if has_confidence(view):
        _confidence_section(view, sel, prefix)
    if len(gate_rounds(view)):
        _gate_section(view, prefix)
    if view.meta.get("cost_model"):
        _cost_section(view, prefix)


def _confidence_section(view: Trace, sel: int, prefix: str) -> None:
    """A block drafter's per-slot confidence, its calibration and the round's draft tree."""
    st.markdown("##### Drafter confidence per slot")
    st.caption("A block drafter (DFlash) fills all slots of its block at once; its confidence "
               "in a slot is the top probability there. Bars: this round's slots, coloured by "
               "the target's verdict (◆ = the target's own probability of the drafted token; "
               "grey: slots cut because a longer verify would not pay). "
               "Right: over the run so far, how often tokens at each confidence were "
               "accepted — confident-but-rejected slots show where the drafter misleads.")
    c = st.columns(2)
    pick = sel - 1 if sel else 0
    if not block_confidences(view.rounds[pick]):
        pick = max(i for i, r in enumerate(view.rounds) if block_confidences(r))
    with c[0]:
        _chart(fig_slot_confidence(view, pick), f"{prefix}_fig_conf")
    with c[1]:
        _chart(fig_confidence_calibration(view), f"{prefix}_fig_calib")
    if (view.rounds[pick].extras or {}).get("tree_slots"):
        st.caption("This round's block was verified as a token tree: the slots' top words, "
                   "most probable paths first (the product of the slots' probabilities), as "
                   "many nodes as paid for the wider verify. The accepted path may run "
                   "through a slot's second or third word, where a chain would have stopped.")
        _chart(block_tree_figure(view, pick), f"{prefix}_fig_block_tree")


def _gate_section(view: Trace, prefix: str) -> None:
    """When DFlash's forward gate ran the drafter, paused it and probed it."""
    with st.expander("When the drafter ran (forward gate)"):
        st.caption("The drafter's own forward costs a fraction of a target step even when "
                   "the cut keeps nothing, so a block drafter runs only while its recent "
                   "rounds commit more tokens per one-token forward than plain decoding "
                   "(1, the dashed line). Below it the drafter is paused: those rounds are "
                   "plain decoding steps with no drafter forward, and every 4, 8, 16, 32 "
                   "rounds a probe tries it again; a probe that pays switches it back on. "
                   "Where the drafter has a fitted state probe, a round the gate would draft "
                   "is also skipped (a plain step) when the target's own state predicts "
                   "fewer accepted tokens than the forward and the smallest verify cost "
                   "(triangles).")
        _chart(fig_gate(view), f"{prefix}_fig_gate")


def _cost_section(view: Trace, prefix: str) -> None:
    """The measured verify-cost curve and the target's numerics / kernels."""
    with st.expander("Verify cost on this machine (what longer drafts cost)"):
        st.caption("Measured on the loaded model when it was loaded, then refined "
                   "from every round's own verify forward. In float32 on a CPU the curve "
                   "is a step: one new token runs matrix-vector kernels, two or more run "
                   "matrix-matrix kernels; packed kernels with sibling linears fused (chosen "
                   "by timing them at load: 'Target linears' below) make the step smaller. "
                   "In width-invariant bfloat16 every forward is "
                   "padded to a few tokens and the curve is nearly flat. AdaPLD "
                   "(cost = auto) and DFlash (cut = auto) choose their draft length from "
                   "this curve.")
        if view.meta.get("numerics"):
            st.caption(f"Target numerics: {view.meta['numerics']}")
        if view.meta.get("kernels"):
            st.caption(f"Target linears: {view.meta['kernels']}")
        _chart(fig_cost_curve(view), f"{prefix}_fig_cost")


def _downloads(trace: Trace, prefix: str) -> None:
    st.markdown("##### Download")
    d = st.columns(3)
    d[0].download_button("Trace (JSON)", trace.to_json().encode("utf-8"),
                         file_name=appstate.trace_filename(trace),
                         mime="application/json", key=f"{prefix}_dl_trace",
                         on_click="ignore", width="stretch",
                         help="The whole run; open it later on the 'Open a saved trace' page.")
    d[1].download_button("Rounds table (CSV)", to_csv_bytes(rounds_table(trace)),
                         file_name="specviz-rounds.csv", mime="text/csv",
                         key=f"{prefix}_dl_rounds", on_click="ignore", width="stretch")
    d[2].download_button("Per-position acceptance (CSV)",
                         to_csv_bytes(position_table(trace)),
                         file_name="specviz-positions.csv", mime="text/csv",
                         key=f"{prefix}_dl_pos", on_click="ignore", width="stretch")


def trace_view(trace: Trace, prefix: str, downloads: bool = True) -> None:
    """The whole explorer for ``trace``; widget keys start with ``prefix``."""
    sel = _scrub(trace, prefix)
    view = trace_prefix(trace, sel)
    metrics_row(view)
    _tokens_section(trace, view, sel, prefix)
    st.markdown("##### Rounds")
    table = rounds_table(view)
    if table.empty:
        st.caption("One row per round appears here as the rounds run.")
    else:
        _rounds_dataframe(table)
    _charts_section(view, sel, prefix)
    if downloads and trace.rounds:
        _downloads(trace, prefix)
