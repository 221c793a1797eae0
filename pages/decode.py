"""Decode page: step through speculative decoding one round (one target forward) at a time."""
from __future__ import annotations

import time

import streamlit as st

from pages import ui
from specviz import appstate
from specviz.errors import SpecvizError
from specviz.viz.glossary import glossary_html
from specviz.viz.tokens import legend_html

ss = st.session_state


def intro() -> None:
    """The page's first-visit explanation and glossary."""
    with st.expander("New here? What you are looking at, and the words it uses"):
        st.markdown("Pick a **method** and a **prompt** in the sidebar, then press **Next "
                    "round**. Green tokens were guessed by the drafter and accepted by the "
                    "target; the yellow or blue token is the target's own; a struck-through red "
                    "token is where the target disagreed (its own choice is written under it). "
                    "Press **Run to end**, then scrub back with the slider; the **Compare** page "
                    "measures the real speedup against plain decoding.")
        st.html(glossary_html())


def button_bar():
    """(Next round clicked, Run to end clicked, Reset clicked, the status line's slot)."""
    bar = st.columns([1.1, 1.1, 0.9, 4.9], vertical_alignment="center")
    next_clicked = bar[0].button("Next round", key="next", type="primary", width="stretch",
                                 icon=":material/skip_next:")
    run_clicked = bar[1].button("Run to end", key="run", width="stretch",
                                icon=":material/fast_forward:")
    reset_clicked = bar[2].button("Reset", key="reset", width="stretch",
                                  icon=":material/restart_alt:")
    return next_clicked, run_clicked, reset_clicked, bar[3].empty()


def current_session(cfg, target, clicked: bool):
    """The page's Session, built (the prompt's prefill) as soon as the settings are known, so
    that the first Next round click only pays for one round. A run with rounds is never replaced
    silently: a changed sidebar replaces it on the next click (``clicked``)."""
    session = ss.get("dec_session")
    if cfg is None or target is None:
        return session
    stale = session is not None and ss.get("dec_key") != cfg.key()
    if session is None or (stale and (not session.rounds or clicked)):
        ss.pop("dec_session", None)
        ss.pop("dec_trace", None)
        session = None
        try:
            session = appstate.new_session(target, cfg)
            ss["dec_session"], ss["dec_key"] = session, cfg.key()
            ss["dec_trace"] = session.trace()
        except SpecvizError as exc:
            st.error(str(exc))
    return session


def advance(session, one_round: bool) -> None:
    """One round (``one_round``) or the run to its end, under a progress bar."""
    try:
        if session.done:
            st.info(f"This run has finished ({session.stop_reason}). Press **Reset** to start "
                    "again.")
        elif one_round:
            t0 = time.perf_counter()
            session.step()
            ss.setdefault("dec_latency", []).append(time.perf_counter() - t0)
        else:
            prog = st.progress(0.0, text="Running to the end …")

            def on_progress(done: int, total: int) -> None:
                prog.progress(min(done / max(total, 1), 1.0),
                              text=f"Running to the end … {done}/{total} tokens")

            session.run(progress=on_progress)
            prog.empty()
        ss["dec_trace"] = session.trace()
        ss["dec_scrub"] = len(session.rounds)
    except SpecvizError as exc:
        st.error(str(exc))


def show_trace(trace, cfg, session, status_slot) -> None:
    """The status line and the trace explorer of the page's run."""
    stale = cfg is not None and ss.get("dec_key") != cfg.key()
    state = "finished" + (f" ({session.stop_reason})" if session and session.stop_reason else "") \
        if session is not None and session.done else "in progress"
    meta = trace.meta
    if trace.rounds:
        status_slot.markdown(
            f"**{meta.get('method', '?').upper()}** on *{meta.get('model', '?')}* · "
            f"round {trace.num_rounds} · {trace.new_tokens} tokens · {state}")
    else:
        status_slot.markdown(f"**{meta.get('method', '?').upper()}** on "
                             f"*{meta.get('model', '?')}* · press **Next round** to run the "
                             "first round.")
    if stale and trace.rounds:
        st.warning("The sidebar settings changed since this run started. The run below used the "
                   "old settings; **Next round** or **Run to end** starts a new run.")
    ui.trace_view(trace, prefix="dec")


def show_empty(cfg, status_slot) -> None:
    """Before the first round: where the text will appear, and the prompt."""
    status_slot.markdown("Press **Next round** to run the first round"
                         + (f" of **{cfg.method.upper()}**" if cfg else "") + ".")
    st.html(legend_html(include_css=True))
    st.html('<div style="color:#64748b;border:1px dashed #cbd5e1;border-radius:0.5rem;'
            'padding:1.2rem;">The generated text will appear here, token by token, coloured by '
            'where each token came from.</div>')
    if cfg is not None:
        with st.expander("Prompt", expanded=False):
            st.text(cfg.prompt)


def main() -> None:
    cfg = ui.page_start(
        "Speculative decoding, step by step",
        "Each **Next round** runs one real round: the drafter proposes tokens, the target checks "
        "all of them in ONE forward pass, keeps the longest agreeing prefix and adds one token "
        "of its own. Fewer target passes per token is where the speedup comes from.")
    intro()
    next_clicked, run_clicked, reset_clicked, status_slot = button_bar()
    if reset_clicked:
        for k in ("dec_session", "dec_key", "dec_trace", "dec_scrub", "dec_latency"):
            ss.pop(k, None)
    target = ui.load_target(cfg.model) if cfg is not None else None
    session = current_session(cfg, target, next_clicked or run_clicked)
    if (next_clicked or run_clicked) and session is not None and ss.get("dec_key") == (
            cfg.key() if cfg else None):
        advance(session, next_clicked)
    trace = ss.get("dec_trace")
    if trace is not None:
        show_trace(trace, cfg, session, status_slot)
    else:
        show_empty(cfg, status_slot)


main()
