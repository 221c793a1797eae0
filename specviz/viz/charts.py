"""Plotly figures built from a Trace (accepted length per round, per-position acceptance,
histogram of accepted lengths) and from the Compare page's summary table."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ..trace import Trace
from .stats import accepted_lengths, position_acceptance
from .tokens import CHART_COLORS

_FONT = dict(family="Inter, system-ui, sans-serif", size=12, color="#1e293b")


def _layout(fig: go.Figure, title: str, xtitle: str, ytitle: str, height: int = 300,
            empty: bool = False) -> go.Figure:
    if empty:
        fig.add_annotation(text="No rounds yet", showarrow=False, xref="paper", yref="paper",
                           x=0.5, y=0.5, font=dict(size=13, color="#94a3b8"))
        fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
        fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False)
    fig.update_layout(
        title=dict(text=title, x=0.0, xanchor="left", font=dict(size=14)),
        template="plotly_white", height=height, font=_FONT,
        margin=dict(l=50, r=15, t=45, b=45), bargap=0.15,
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
        xaxis_title=xtitle, yaxis_title=ytitle)
    return fig


def fig_round_lengths(trace: Trace, selected_round: int | None = None) -> go.Figure:
    """Per round: accepted draft tokens, the target's own token (+1) and the rejected suffix."""
    rounds = trace.rounds
    x = [r.index + 1 for r in rounds]
    acc = [r.accepted for r in rounds]
    has_tgt = [len(r.committed) > r.accepted for r in rounds]
    rej = [len(r.rejected_suffix) for r in rounds]
    kinds = [r.kind for r in rounds]
    fig = go.Figure()
    fig.add_bar(x=x, y=acc, name="accepted", marker_color=CHART_COLORS["accepted"],
                hovertemplate="round %{x}: %{y} accepted<extra></extra>")
    for kind, label in (("correction", "target: correction"), ("bonus", "target: bonus"),
                        ("nodraft", "target: no draft")):
        y = [1 if (k == kind and t) else 0 for k, t in zip(kinds, has_tgt)]
        fig.add_bar(x=x, y=y, name=label, marker_color=CHART_COLORS[kind],
                    showlegend=any(y),
                    hovertemplate=f"round %{{x}}: the target's own token ({kind})<extra></extra>")
    fig.add_bar(x=x, y=rej, name="rejected", marker_color=CHART_COLORS["rejected"],
                marker_pattern_shape="/", opacity=0.55,
                hovertemplate="round %{x}: %{y} rejected<extra></extra>")
    fig.update_layout(barmode="stack")
    if rounds:
        tau = trace.tau
        fig.add_hline(y=tau, line_dash="dot", line_color="#334155",
                      annotation_text=f"tau = {tau:.2f}", annotation_position="top left")
    if selected_round is not None and 0 <= selected_round < len(rounds):
        fig.add_vrect(x0=selected_round + 0.5, x1=selected_round + 1.5, fillcolor="#0f172a",
                      opacity=0.07, line_width=0)
    _layout(fig, "Tokens per round (accepted + target token = committed)", "round", "tokens",
            empty=not rounds)
    fig.update_xaxes(rangemode="tozero")
    fig.update_yaxes(rangemode="tozero")
    return fig


def fig_position_acceptance(trace: Trace) -> go.Figure:
    """Acceptance rate at each draft position, given that the position was reached."""
    stats = position_acceptance(trace)
    x = [s.position for s in stats]
    y = [s.rate for s in stats]
    fig = go.Figure()
    fig.add_bar(x=x, y=y, marker_color=CHART_COLORS["rate"],
                customdata=[[s.accepted, s.reached] for s in stats],
                text=[f"{s.accepted}/{s.reached}" if s.reached else "" for s in stats],
                textposition="outside", cliponaxis=False,
                hovertemplate="position %{x}: %{customdata[0]} of %{customdata[1]} rounds "
                              "that reached it accepted it<extra></extra>")
    _layout(fig, "Acceptance rate per draft position (given the position was reached)",
            "draft position", "P(accept | reached)", empty=not stats)
    if not stats and trace.rounds:
        fig.layout.annotations[0].text = ("No round drafted anything yet (plain decoding, AR, "
                                          "never drafts): no position to accept")
    fig.update_yaxes(range=[0, 1.12], tickformat=".0%")
    fig.update_xaxes(dtick=1)
    return fig


def fig_accepted_hist(trace: Trace) -> go.Figure:
    """How many rounds accepted 0, 1, 2, ... draft tokens."""
    return fig_accepted_lengths(accepted_lengths(trace))


def fig_accepted_lengths(lengths: list[int]) -> go.Figure:
    """The histogram of accepted lengths of any set of rounds (one run, or several)."""
    top = max(lengths, default=0)
    counts = [lengths.count(k) for k in range(top + 1)]
    fig = go.Figure()
    fig.add_bar(x=list(range(top + 1)), y=counts, marker_color=CHART_COLORS["hist"],
                hovertemplate="%{y} round(s) accepted %{x} token(s)<extra></extra>")
    _layout(fig, "Histogram of accepted lengths", "accepted draft tokens in a round", "rounds",
            empty=not lengths)
    fig.update_xaxes(dtick=1)
    if max(counts, default=0) <= 10:
        fig.update_yaxes(dtick=1)  # counts are whole numbers
    return fig


def fig_compare(summary: pd.DataFrame) -> go.Figure:
    """Speedup vs plain decoding (measured) and tau, one bar pair per method."""
    fig = go.Figure()
    if not summary.empty:
        fig.add_bar(x=summary["method"], y=summary["speedup_vs_ar"], name="speedup vs AR",
                    marker_color=CHART_COLORS["accepted"],
                    text=[f"{v:.2f}×" if pd.notna(v) else "" for v in summary["speedup_vs_ar"]],
                    textposition="outside", cliponaxis=False)
        fig.add_bar(x=summary["method"], y=summary["tau"], name="tau (tokens / forward)",
                    marker_color=CHART_COLORS["rate"],
                    text=[f"{v:.2f}" for v in summary["tau"]], textposition="outside",
                    cliponaxis=False)
        fig.add_hline(y=1.0, line_dash="dot", line_color="#64748b")
    fig.update_layout(barmode="group")
    return _layout(fig, "Measured speedup vs plain decoding, and tau", "method", "")


# ---------------------------------------------------------------- drafter confidence (DFlash)
def slot_confidences(r) -> list[float]:
    """The drafter's per-slot confidence of round ``r`` (max softmax prob of each draft slot, as
    stored by block drafters such as DFlash in ``extras['confidence']``); [] when absent."""
    conf = (r.extras or {}).get("confidence") or []
    try:
        return [float(c) for c in conf][:len(r.draft)]
    except (TypeError, ValueError):
        return []


def block_confidences(r) -> list[float]:
    """Confidence in every slot the drafter filled, including slots cut before verification
    (``extras['cut']['block_confidence']``); the verified ones otherwise."""
    cut = (r.extras or {}).get("cut")
    if isinstance(cut, dict) and cut.get("block_confidence"):
        try:
            return [float(c) for c in cut["block_confidence"]]
        except (TypeError, ValueError):
            return []
    return slot_confidences(r)


def has_confidence(trace: Trace) -> bool:
    return any(block_confidences(r) for r in trace.rounds)


def _draw_cut(fig: go.Figure, r, kept: int) -> None:
    """Slots a block drafter filled but did not send to the target (the cost-aware cut of
    specviz.drafters.dflash.block_cut), greyed, with a dashed line where the block was cut."""
    cut = (r.extras or {}).get("cut")
    if not isinstance(cut, dict):
        return
    block = [float(c) for c in cut.get("block_confidence") or []]
    if len(block) <= kept:
        return
    xs = list(range(kept + 1, len(block) + 1))
    fig.add_bar(x=xs, y=block[kept:], name="cut (not verified)", marker_color="#e2e8f0",
                marker_line=dict(color="#94a3b8", width=1),
                hovertemplate="slot %{x}: confidence %{y:.3f}, not worth a longer verify"
                              "<extra>cut</extra>")
    fig.add_vline(x=kept + 0.5, line=dict(color="#64748b", dash="dash"),
                  annotation_text=f"cut after {kept}", annotation_position="top")


def _tree_slot_bars(fig: go.Figure, trace: Trace, r) -> None:
    """A block verified as a token tree (:mod:`specviz.drafters.dflash.block_tree`): each slot's top
    probability, coloured by how far the accepted path reached, and the drafter's probability
    of the word the target accepted at each slot (not always the slot's top word)."""
    from .tables import join_tokens

    block = block_confidences(r)
    depth = len(r.path)
    state = ["accepted" if j <= depth else "first rejected" if j == depth + 1 else "not reached"
             for j in range(1, len(block) + 1)]
    colors = {"accepted": CHART_COLORS["accepted"], "first rejected": CHART_COLORS["rejected"],
              "not reached": "#cbd5e1"}
    for s in ("accepted", "first rejected", "not reached"):
        idx = [i for i, x in enumerate(state) if x == s]
        if idx:
            fig.add_bar(x=[i + 1 for i in idx], y=[block[i] for i in idx], name=s,
                        marker_color=colors[s],
                        hovertemplate="slot %{x}: top word's probability %{y:.3f}<extra>"
                                      + s + "</extra>")
    conf = slot_confidences(r)   # a hybrid's merged tree: the block's nodes come first
    path = [n for n in r.path if n < len(conf)]
    if path:
        words = [repr(join_tokens([r.draft[n]], trace.token_texts))[1:-1] for n in path]
        fig.add_scatter(x=[i + 1 for i in range(len(path))], y=[conf[n] for n in path],
                        mode="markers+text", text=words, textposition="top center",
                        name="accepted node's probability",
                        marker=dict(symbol="diamond", size=9, color="#0f172a"),
                        hovertemplate="slot %{x}: accepted %{text}, drafter p = %{y:.3f}"
                                      "<extra></extra>")


def fig_slot_confidence(trace: Trace, round_index: int) -> go.Figure:
    """One round: the drafter's confidence in each draft slot, coloured by what the target did
    with it (accepted / first rejected / after the rejection), with the target's probability of
    the drafted token as a marker -- where the drafter was sure and wrong is where it fails."""
    from .tables import join_tokens

    fig = go.Figure()
    r = trace.rounds[round_index] if 0 <= round_index < len(trace.rounds) else None
    conf = slot_confidences(r) if r is not None else []
    if r is not None and r.is_tree and block_confidences(r):
        _tree_slot_bars(fig, trace, r)
        title = (f"Round {r.index + 1}: drafter confidence per slot (verified as a tree of "
                 f"{len(r.draft)} nodes)")
    elif r is not None and block_confidences(r):
        colors = {"accepted": CHART_COLORS["accepted"], "first rejected": CHART_COLORS["rejected"],
                  "not reached": "#cbd5e1"}
        states = [s.replace("_", " ") for s in r.node_status()[:len(conf)]]
        words = [join_tokens([t], trace.token_texts) for t in r.draft[:len(conf)]]
        x = list(range(1, len(conf) + 1))
        for state in ("accepted", "first rejected", "not reached"):
            idx = [i for i, s in enumerate(states) if s == state]
            if not idx:
                continue
            fig.add_bar(x=[x[i] for i in idx], y=[conf[i] for i in idx], name=state,
                        marker_color=colors[state], text=[repr(words[i])[1:-1] for i in idx],
                        textposition="outside", cliponaxis=False,
                        hovertemplate="slot %{x}: drafted %{text}<br>drafter confidence "
                                      "%{y:.3f}<extra>" + state + "</extra>")
        _draw_cut(fig, r, len(conf))
        p = [float(v) for v in (r.p_draft or [])][:len(conf)]
        if p and conf:
            fig.add_scatter(x=x[:len(p)], y=p, mode="markers", name="target p(draft token)",
                            marker=dict(symbol="diamond", size=9, color="#0f172a"),
                            hovertemplate="slot %{x}: target p = %{y:.3f}<extra></extra>")
        fig.update_yaxes(range=[0, 1.12])
        fig.update_xaxes(dtick=1)
        title = f"Round {r.index + 1}: drafter confidence per slot"
    else:
        title = "Drafter confidence per slot"
    shown = block_confidences(r) if r is not None else []
    _layout(fig, title, "draft slot", "probability", empty=not shown)
    if r is not None and not shown and trace.rounds:
        paused = bool(((r.extras or {}).get("cut") or {}).get("paused"))
        fig.layout.annotations[0].text = (
            "The drafter was paused this round (a plain decoding step, no drafter forward)"
            if paused else "This round has no per-slot confidence")
    fig.update_layout(barmode="overlay")
    return fig


def confidence_calibration(trace: Trace, bins: int = 5) -> pd.DataFrame:
    """Drafted tokens the target actually judged (accepted ones + the first rejected one per
    round; of a tree round every node judged on a correct prefix), binned by drafter
    confidence: count and observed acceptance rate per bin."""
    rows = []
    for r in trace.rounds:
        if r.is_tree:   # every node judged on a correct prefix, accepted or not
            rows += [(c, s == "accepted") for c, s in zip(slot_confidences(r), r.node_status())
                     if s != "not_reached"]
            continue
        for k, c in enumerate(slot_confidences(r)):
            if k <= r.accepted:
                rows.append((c, k < r.accepted))
    edges = [i / bins for i in range(bins + 1)]
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = [a for c, a in rows if lo <= c < hi or (hi == 1.0 and c == 1.0)]
        out.append({"bin": f"{lo:.1f}–{hi:.1f}", "mid": (lo + hi) / 2, "judged": len(sel),
                    "accepted": sum(sel),
                    "acceptance": (sum(sel) / len(sel)) if sel else None})
    return pd.DataFrame(out)


def fig_confidence_calibration(trace: Trace, bins: int = 5) -> go.Figure:
    """Is the drafter's confidence honest? Observed acceptance per confidence bin vs the
    diagonal (perfect calibration); bar width shows how many tokens fell in the bin."""
    df = confidence_calibration(trace, bins)
    have = df[df["judged"] > 0]
    fig = go.Figure()
    if not have.empty:
        fig.add_bar(x=have["mid"], y=have["acceptance"], width=0.9 / bins, name="observed",
                    marker_color=CHART_COLORS["accepted"],
                    customdata=have[["bin", "judged", "accepted"]].values,
                    hovertemplate="confidence %{customdata[0]}: %{customdata[2]} of "
                                  "%{customdata[1]} accepted (%{y:.0%})<extra></extra>")
        fig.add_scatter(x=[0, 1], y=[0, 1], mode="lines", name="calibrated",
                        line=dict(dash="dot", color="#64748b"), hoverinfo="skip")
        fig.update_xaxes(range=[0, 1])
        fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    _layout(fig, "Confidence vs acceptance (tokens the target judged)", "drafter confidence",
            "accepted", empty=have.empty)
    return fig


def fig_cost_curve(trace: Trace) -> go.Figure:
    """The verify-cost model c(k) the run planned with (specviz.costs: measured on the loaded
    target, refined online) and this run's own forwards, each as (k, forward time / one-token
    time): where the dots sit above the line, longer drafts cost more than planned."""
    fig = go.Figure()
    cm = trace.meta.get("cost_model") or {}
    pts = [(int(k), float(c)) for k, c in cm.get("points") or []]
    step = float(cm.get("step_time") or 0.0)
    if pts:
        fig.add_scatter(x=[k for k, _ in pts], y=[c for _, c in pts], mode="lines+markers",
                        name="cost model c(k)", line=dict(color=CHART_COLORS["rate"], width=3),
                        hovertemplate="k=%{x}: c=%{y:.2f}<extra></extra>")
    seen = [(1 + len(r.draft), r.t_forward / step) for r in trace.rounds
            if step > 0 and r.t_forward > 0]
    if seen:
        fig.add_scatter(x=[k for k, _ in seen], y=[c for _, c in seen], mode="markers",
                        name="this run's forwards", marker=dict(color="#0f172a", size=6,
                                                                opacity=0.5),
                        hovertemplate="k=%{x}: %{y:.2f} × a one-token forward<extra></extra>")
    _layout(fig, f"Verify cost on this machine (one-token forward {step * 1000:.0f} ms)"
            if step else "Verify cost on this machine", "tokens in the verify forward (k)",
            "cost relative to k = 1", empty=not pts)
    if not pts:
        fig.layout.annotations[0].text = "No verify-cost model was measured for this run"
    else:
        fig.update_xaxes(type="log", dtick=0.30103)
    return fig


def gate_rounds(trace: Trace) -> pd.DataFrame:
    """Per round of a block drafter with a forward gate (``cut="auto"``): the gate's rate when
    the round was decided (tokens per one-token forward of the recent drafted rounds, decayed)
    and what the round was: drafted, drafted but cut to nothing, a probe
    of the paused drafter, paused (a plain step, no drafter forward), or skipped by the state
    probe (:mod:`specviz.drafters.dflash.state_probe`: a plain step too). Empty without a gate."""
    rows = []
    for r in trace.rounds:
        cut = (r.extras or {}).get("cut") or {}
        if "rate" not in cut:
            continue
        skipped = ((r.extras or {}).get("state_probe") or {}).get("skip")
        kind = ("skipped (state probe)" if cut.get("paused") and skipped
                else "paused" if cut.get("paused") else "probe" if cut.get("probe")
                else "drafted" if cut.get("kept", 0) > 0 else "cut to nothing")
        rows.append({"round": r.index + 1, "rate": float(cut["rate"]), "kind": kind,
                     "committed": len(r.committed)})
    return pd.DataFrame(rows, columns=["round", "rate", "kind", "committed"])


def fig_gate(trace: Trace) -> go.Figure:
    """When the drafter ran, and why (block_cut.ForwardGate): the gate's rate before each round
    against a plain step's 1 token per forward; below it the drafter pauses and is probed now
    and then, so a drafter that does not pay costs only its probes."""
    df = gate_rounds(trace)
    fig = go.Figure()
    if len(df):
        fig.add_scatter(x=df["round"], y=df["rate"], mode="lines", name="gate rate",
                        line=dict(color=CHART_COLORS["rate"], width=2), hoverinfo="skip")
        style = {"drafted": (CHART_COLORS["accepted"], "circle"),
                 "cut to nothing": (CHART_COLORS["nodraft"], "x"),
                 "probe": (CHART_COLORS["correction"], "diamond"),
                 "paused": ("#cbd5e1", "circle-open"),
                 "skipped (state probe)": ("#94a3b8", "triangle-down-open")}
        for kind, (color, symbol) in style.items():
            d = df[df["kind"] == kind]
            if len(d):
                fig.add_scatter(x=d["round"], y=d["rate"], mode="markers", name=kind,
                                customdata=d["committed"],
                                marker=dict(color=color, symbol=symbol, size=8),
                                hovertemplate="round %{x}: rate %{y:.2f}, committed "
                                              "%{customdata}<extra>" + kind + "</extra>")
        fig.add_hline(y=1.0, line=dict(color="#64748b", dash="dash"),
                      annotation_text="a plain step: 1 token per forward",
                      annotation_position="bottom right")
    _layout(fig, "Forward gate: when the drafter ran", "round",
            "tokens per one-token forward", empty=not len(df))
    if not len(df) and trace.rounds:
        fig.layout.annotations[0].text = "This run has no forward gate (cut is not 'auto')"
    return fig
