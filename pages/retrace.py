"""ReTrace page: what the previous round's rejected suffix was worth, and what ReTrace does with
it -- round r's rejected tokens under round r+1's block (matched / shifted / unmatched), the
gate per slot, the match-rate heatmap (rejected slot x offset), and ReTrace beside its DFlash
backbone on the same prompt. Everything is drawn from Traces (specviz.viz.retrace)."""
from __future__ import annotations

import dataclasses

import streamlit as st

from pages import ui
from specviz import appstate
from specviz.analysis.suffix_bound import suffix_bound
from specviz.drafters import make_drafter
from specviz.errors import SpecvizError
from specviz.viz import retrace as vr

ss = st.session_state
SOURCES = {"decode": "The Decode page's run", "page": "The run made on this page",
           "upload": "A saved trace"}

def retrace_params(cfg) -> dict:
    """The sidebar's ReTrace settings when ReTrace is the sidebar method, else the defaults."""
    if cfg is not None and cfg.method == "retrace":
        return dict(cfg.params)
    return {}


def backbone_params(cfg, params: dict) -> dict:
    """The DFlash run that ReTrace sits on: same backbone, block, cut and sampling settings."""
    drafter = make_drafter("retrace", ui.load_target(cfg.model), **params)
    c = drafter.config()
    out = {"checkpoint": c["backbone"] or "", "block_size": drafter.block_size,
           "cut": c["cut"], "draft_temperature": c["draft_temperature"], "tree": 0,
           "seed": params.get("seed", 0)}
    return out


def _request_run() -> None:
    ss["_rt_run_request"] = True


def run_pair(cfg) -> None:
    """ReTrace and its DFlash backbone to the end on the sidebar's prompt, into the session
    state."""
    target = ui.load_target(cfg.model)
    if target is None:
        return
    prog = st.progress(0.0, text="Running ReTrace …")
    try:
        params = retrace_params(cfg)
        out = {}
        for i, (method, p) in enumerate((("retrace", params),
                                         ("dflash", backbone_params(cfg, params)))):
            run_cfg = dataclasses.replace(cfg, method=method, params=p)
            session = appstate.new_session(target, run_cfg)
            label = "ReTrace" if method == "retrace" else "its DFlash backbone"

            def on_progress(done, total, i=i, label=label):
                prog.progress(min((i + done / max(total, 1)) / 2, 1.0),
                              text=f"Running {label} … {done}/{total} tokens")
            session.run(progress=on_progress)
            out[method] = session.trace()
        ss["rt_trace"], ss["rt_backbone"] = out["retrace"], out["dflash"]
        ss["rt_source"] = "page"
    except SpecvizError as exc:
        st.error(f"ReTrace could not run: {exc}")
    prog.empty()


def available_traces() -> dict:
    """The runs the page can show (the Decode page's, its own, an uploaded one) by source; the
    shown source defaults to the first with ReTrace rounds."""
    traces = {}
    if ss.get("dec_trace") is not None and ss["dec_trace"].rounds:
        traces["decode"] = ss["dec_trace"]
    if ss.get("rt_trace") is not None:
        traces["page"] = ss["rt_trace"]
    if ss.get("uploaded_trace") is not None:
        traces["upload"] = ss["uploaded_trace"]
    if ss.get("rt_source") not in traces:
        first = [k for k in ("page", "decode", "upload")
                 if k in traces and vr.has_retrace(traces[k])]
        ss["rt_source"] = (first or list(traces) or ["page"])[0]
    return traces


def pick_trace(cfg, traces: dict):
    """The run button, the source picker and a line about the chosen run; the run to show (None
    when there is none or it has no rounds)."""
    bar = st.columns([2.2, 5], vertical_alignment="center")
    bar[0].button("Run ReTrace and its backbone", key="rt_run", type="primary", width="stretch",
                  icon=":material/play_arrow:", on_click=_request_run, disabled=cfg is None,
                  help="Runs ReTrace (the sidebar's ReTrace settings when ReTrace is the sidebar "
                       "method, else its defaults) and the same DFlash drafter without the "
                       "memory, on the sidebar's prompt and decoding settings.")
    if len(traces) > 1:
        with bar[1]:
            st.radio("Show", list(traces), key="rt_source", horizontal=True,
                     format_func=lambda k: SOURCES[k], label_visibility="collapsed")
    trace = traces.get(ss["rt_source"])
    if trace is None:
        bar[1].markdown("No run yet: press the button, or decode with **retrace** on the Decode "
                        "page.")
    elif not trace.rounds:
        st.info("This run has no rounds yet.")
        trace = None
    else:
        m = trace.meta
        bar[1].markdown(f"**{str(m.get('method', '?')).upper()}** · {trace.num_rounds} rounds · "
                        f"{trace.new_tokens} tokens · tau {trace.tau:.2f}")
        note = vr.no_memory_note(trace)
        if note:
            st.info(note)
    return trace


def show_pair(trace) -> None:
    """One round that follows a rejected suffix, under the suffix it inherited."""
    pairs = [r.index for r in trace.rounds if vr.pair_rows(trace, r.index) is not None]
    st.markdown("##### A rejected suffix and the next block")
    if not pairs:
        st.caption(vr.no_pairs_note(trace))
    else:
        sel = st.select_slider("Round (that follows a rejected suffix)",
                               options=[p + 1 for p in pairs],
                               key="rt_round") if len(pairs) > 1 else pairs[0] + 1
        st.html(vr.alignment_grid_html(trace, sel - 1))
        st.html(vr.CSS + "<p style='font-size:0.85rem'>" + vr.legend_html() + "</p>")


def show_worth(trace) -> None:
    """Where the run's rejected tokens stand in the final text."""
    st.markdown("##### What the rejected tokens were worth (this run)")
    st.caption("For every rejected token: does the final text hold it at the position it was "
               "drafted for (offset 0), or a few positions away? Slot 1 is the rejected token "
               "itself (never right at offset 0 under greedy decoding).")
    table = vr.slot_table([trace])
    if table.empty:
        st.caption("No rejected tokens in this run.")
    else:
        cols = st.columns([3, 2])
        cols[0].plotly_chart(vr.fig_match_heatmap([trace]), width="stretch",
                             config=ui.PLOTLY_CONFIG, key="rt_heat")
        fmt = st.column_config.NumberColumn(format="percent")
        cols[1].dataframe(table, hide_index=True, width="stretch", column_config={
            "exact": fmt, "best offset": fmt, "top-k": fmt, "next round drafted there": fmt})


def show_bound(trace) -> None:
    """The most the rejected suffixes could have added (an oracle bound)."""
    bound = suffix_bound([trace])
    if bound.carried:
        st.markdown("##### At most: what the rejected suffixes could have added")
        st.caption("Lay each round's rejected tokens over the next round from where that round "
                   "missed, shifted by a few positions, and count how many then match the "
                   "final text: tokens the next round would have accepted on top of its own. "
                   "It bounds what any use of the rejected tokens (ReTrace's memory included) "
                   "could gain; which shift to use is unknown while drafting.")
        c = st.columns([1, 1, 3])
        c[0].metric("tau", f"{bound.tau:.2f}")
        c[0].metric("Rounds carrying a suffix", bound.carried)
        c[1].metric("tau at most", f"{bound.tau_bound:.2f}",
                    f"{bound.tau_bound / bound.tau - 1:+.1%}")
        c[1].metric("Tokens it adds", bound.best)
        c[2].plotly_chart(vr.fig_suffix_bound(bound), width="stretch", config=ui.PLOTLY_CONFIG,
                          key="rt_bound")


def show_gates(trace) -> None:
    """ReTrace's gate per slot, and why it changed nothing when it could not."""
    st.markdown("##### The gate per slot")
    st.caption("How much of the memory each slot took in (0 = ignored). Colour: whether that "
               "slot's draft token was then accepted.")
    st.plotly_chart(vr.fig_gates(trace), width="stretch", config=ui.PLOTLY_CONFIG,
                    key="rt_gates")
    if vr.gate_forced_off(trace):
        st.info("The gate was forced off in this run (`gate=off`): the memory was aligned "
                "as shown but not fused into the block, so ReTrace drafted exactly what its "
                "DFlash backbone would have.")
    elif vr.fusion_inert(trace):
        st.info("This fusion added nothing to any slot: its projection is zero (an untrained "
                "fusion -- the bundled one is, because no trained step beat its backbone on "
                "held-out rounds). Whatever the gate reads, ReTrace drafted exactly what its "
                "DFlash backbone would have.")


def show_beside(trace, base) -> None:
    """ReTrace beside its DFlash backbone on the same prompt and settings."""
    st.markdown("##### ReTrace beside its DFlash backbone (same prompt, same settings)")
    c = st.columns(4)
    c[0].metric("ReTrace tau", f"{trace.tau:.2f}", f"{trace.tau - base.tau:+.2f} vs backbone")
    c[1].metric("Backbone tau", f"{base.tau:.2f}")
    c[2].metric("Rounds", trace.num_rounds, f"{trace.num_rounds - base.num_rounds:+d}",
                delta_color="inverse")
    same = trace.output_ids == base.output_ids
    c[3].metric("Same output", "yes" if same else "no")
    div = vr.first_divergence(trace, base)
    st.caption("The two runs are identical round for round." if div is None else
               f"They first differ in round {div + 1}: before it the memory changed nothing "
               "the target saw.")
    st.plotly_chart(vr.fig_progress(trace, base), width="stretch", config=ui.PLOTLY_CONFIG,
                    key="rt_progress")
    with st.expander("Round by round"):
        st.dataframe(vr.side_by_side(trace, base), hide_index=True, width="stretch")


def main() -> None:
    cfg = ui.page_start(
        "ReTrace: what a rejected suffix is worth",
        "When the target rejects a draft token, every later token of the block is thrown away. "
        "Yet those tokens are often right: the same word one position later, or the target's "
        "word one round too early. **ReTrace** keeps the drafter's states of the thrown-away "
        "tokens, moves each to the slot of the next block that predicts the same position, adds "
        "what the target said there during verification, and lets a learned **gate** decide how "
        "much of it to mix into that slot's input. No extra forward pass; verification is "
        "unchanged, so the output is exactly the target's.")
    if ss.pop("_rt_run_request", None) and cfg is not None:
        run_pair(cfg)
    with st.expander("Open a saved trace here", expanded=False):
        ui.trace_upload("rt_upload", id_key="rt_upload_id", error_key="rt_upload_error",
                        on_load={"rt_source": "upload"})
    trace = pick_trace(cfg, available_traces())
    if trace is not None:
        show_pair(trace)
        show_worth(trace)
        show_bound(trace)
        if vr.has_retrace(trace):
            show_gates(trace)
    base = ss.get("rt_backbone") if ss.get("rt_source") == "page" else None
    if trace is not None and base is not None:
        show_beside(trace, base)


main()
