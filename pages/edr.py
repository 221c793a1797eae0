"""EDR page: speculative decoding as a Markov reward process on one prompt's rollout (greedy, or
sampled when the sidebar's temperature is above 0) --
where rounds start (occupancy d_n, on the tokens and as a chart), expected rounds still to go
(V_n), per-state acceptance, two drafters side by side, and the expected rounds next to the
rounds of real runs. Views from specviz.viz.edr; numbers from specviz.analysis.edr."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from pages import ui
from specviz.analysis.offline_eval import MARKOV, DrafterSpec, at_temperature, prompt_mrp
from specviz.engine import DecodeSettings, Session
from specviz.errors import SpecvizError
from specviz.drafters import make_drafter
from specviz.viz import edr as ve

ss = st.session_state


def explain() -> None:
    """What the charts show, folded."""
    with st.expander("What the charts show", expanded=False):
        st.markdown(
            "- **Occupancy on the tokens**: darker = a round starts here (a bar on the left edge). "
            "Light stretches were inside an accepted draft: no round of their own.\n"
            "- **V_n** (value): the expected rounds still needed from state n; V_0 is the EDR.\n"
            "- **Acceptance heatmap**: for every state n (column) and slot t (row), whether the "
            "drafter's token at that slot matches the text, given the slots before it did.\n"
            "- **Difference**: d_n of the second drafter minus the first. Green = the second "
            "drafter skips a round start the first one needs; red = the other way round.\n"
            "- The expected rounds are computed offline with no speculative decoding; the last "
            "column shows the rounds a real greedy run of the same drafter took (they agree "
            "exactly for these deterministic drafters).\n"
            "- **Sampling** (sidebar temperature above 0): the reply is sampled, and a learned "
            "drafter drafts at the same temperature, so a slot is accepted only with probability "
            "min(1, q(y)/p(y)) -- q the drafter's and p the target's probability of the token the "
            "text has there. Occupancies become fractions (a round starts at n in some runs, not "
            "in others), the EDR is the average over runs that produce this text, and one real "
            "sampled run is one draw from it (it writes another text and may take more or fewer "
            "rounds).")


def choose(cfg) -> tuple[str, str, bool]:
    """(drafter A, drafter B, Compute pressed)."""
    choices = list(MARKOV)
    c = st.columns([2, 2, 1.4], vertical_alignment="bottom")
    a_lab = c[0].selectbox("Drafter A", choices, index=0, key="edr_a")
    b_lab = c[1].selectbox("Drafter B", choices, index=choices.index("dflash"), key="edr_b")
    go_btn = c[2].button("Compute", key="edr_run", type="primary", icon=":material/calculate:",
                         disabled=cfg is None or a_lab == b_lab, width="stretch",
                         help="Generates the model's reply to the sidebar prompt (greedy, or "
                              "sampled at the sidebar's temperature; up to the sidebar's max "
                              "new tokens), evaluates both drafters on it, and runs each once "
                              "for real to compare the rounds.")
    if a_lab == b_lab:
        st.caption("Pick two different drafters.")
    return a_lab, b_lab, go_btn


def compute(cfg, target, labels: tuple[str, str]) -> None:
    """The reply, both drafters' MRPs on it and one real run of each, into the session state."""
    T, seed = float(cfg.settings.temperature), int(cfg.settings.seed)
    prog = st.progress(0.0, text="Generating the "
                                 + (f"sampled (T = {T:g})" if T > 0 else "greedy") + " reply …")
    try:
        ids = target.encode_prompt(cfg.prompt, cfg.settings.chat_template)
        specs = [DrafterSpec(x, x, at_temperature(x, MARKOV[x], T)) for x in labels]
        with target.lock:
            res = prompt_mrp(target, ids, specs, cfg.settings.max_new_tokens, T, seed)
        actual = {}
        for i, s in enumerate(specs):
            prog.progress(0.4 + 0.3 * i, text=f"Real run of {s.label} …")
            tr = Session(target, make_drafter(s.method, target, **s.params), ids,
                         DecodeSettings(max_new_tokens=cfg.settings.max_new_tokens,
                                        temperature=T, seed=seed)).run()
            actual[s.label] = tr.num_rounds
        ss["edr_temperature"] = T
        ss["edr_result"], ss["edr_actual"] = res, actual
        ss["edr_texts"] = {int(t): target.tokenizer.decode([int(t)])
                           for t in set(res.rollout.tokens)}
    except SpecvizError as exc:
        st.error(f"EDR could not run: {exc}")
    prog.empty()


def show(res) -> None:
    """The summary table, occupancy on the text and as charts, values, the difference and the
    acceptance heatmaps."""
    texts = ss.get("edr_texts", {})
    y = res.rollout.tokens[res.rollout.prompt_len:]
    if ss.get("edr_temperature", 0.0) > 0:
        st.caption(f"Sampled reply (T = {ss['edr_temperature']:g}): the expected rounds average "
                   "over the runs that write this text; the real run is one sampled draw (top-p "
                   "is not applied on this page).")
    st.dataframe(pd.DataFrame(ve.summary_rows(res.results, ss.get("edr_actual"))),
                 hide_index=True, width="stretch",
                 column_config={c: st.column_config.Column(c, help=h)
                                for c, h in ve.SUMMARY_HELP.items()})
    labels = list(res.results)
    st.markdown("##### Where rounds start, on the text")
    which = st.radio("Drafter", labels, horizontal=True, key="edr_which",
                     label_visibility="collapsed")
    st.html(ve.occupancy_tokens_html(y, texts, res.results[which].occupancy))
    st.plotly_chart(ve.fig_occupancy(res.results, y, texts), width="stretch",
                    config=ui.PLOTLY_CONFIG, key="edr_occ")
    cols = st.columns(2)
    with cols[0]:
        st.markdown("##### Expected rounds to go (V_n)")
        st.plotly_chart(ve.fig_values(res.results), width="stretch", config=ui.PLOTLY_CONFIG,
                        key="edr_val")
    with cols[1]:
        st.markdown(f"##### Where {labels[1]} saves rounds over {labels[0]}")
        st.plotly_chart(ve.fig_difference(res.results), width="stretch",
                        config=ui.PLOTLY_CONFIG, key="edr_diff")
    st.markdown("##### Acceptance per state and slot")
    for lab in labels:
        st.plotly_chart(ve.fig_acceptance(res.acceptance[lab], lab), width="stretch",
                        config=ui.PLOTLY_CONFIG, key=f"edr_acc_{lab}")


def main() -> None:
    cfg = ui.page_start(
        "EDR: where the rounds go",
        "Fix the text the model will write (its greedy reply). A **state** is how many tokens of "
        "it exist so far; from each state the drafter proposes a block and the target keeps the "
        "part that matches, so the run jumps ahead. The **occupancy** d_n says how many rounds "
        "start at token n (here 0 or 1, since greedy drafts are deterministic); their sum is the "
        "expected number of decoding rounds (**EDR**). A drafter is better when it needs fewer "
        "rounds for the same text: long accepted blocks at the states the run actually visits "
        "count, long blocks at states it jumps over do not. That is why EDR weights each state "
        "by its occupancy instead of maximising every block's accepted length.")
    explain()
    a_lab, b_lab, go_btn = choose(cfg)
    if go_btn and cfg is not None:
        target = ui.load_target(cfg.model)
        if target is not None:
            compute(cfg, target, (a_lab, b_lab))
    res = ss.get("edr_result")
    if res is None:
        st.info("Press **Compute** to evaluate the two drafters on the sidebar prompt.")
    else:
        show(res)


main()
