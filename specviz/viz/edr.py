"""EDR views (docs/methods/edr.md): where the rounds of a speculative run start (occupancy d_n)
along the text, the value curve V_n (expected rounds still to go), the per-state acceptance heatmap,
and two drafters side by side (occupancy difference: where one saves rounds). Pure functions of
:class:`~specviz.analysis.edr.MRPResult` records and token texts.
"""
from __future__ import annotations


import plotly.graph_objects as go
import torch

from .tokens import visible_text

COLORS = ("#0969da", "#bf3989", "#1a7f37", "#8250df")


def occupancy_tokens_html(tokens: list[int], texts: dict, occupancy: torch.Tensor,
                          color: str = "9,105,218") -> str:
    """The reply's tokens, each shaded by d_n (the expected number of rounds that start right
    before it: 1 = a round always starts here, 0 = it is always inside an accepted draft)."""
    spans = []
    for n, tok in enumerate(tokens):
        d = float(occupancy[n]) if n < len(occupancy) else 0.0
        t = visible_text(texts.get(int(tok), f"#{tok}"))
        border = "border-left:2px solid #1f2328;" if d > 0.5 else ""
        spans.append(f"<span title='d = {d:.2f}' style='background:rgba({color},{0.08 + 0.6 * d:.2f});"
                     f"{border}padding:1px 0;white-space:pre-wrap'>{t}</span>")
    return ("<div style='font-family:ui-monospace,monospace;line-height:1.9;font-size:0.95rem'>"
            + "".join(spans) + "</div>")


def fig_occupancy(results: dict, tokens: list[int] | None = None, texts: dict | None = None) -> go.Figure:
    """d_n along the reply for each drafter (bars)."""
    fig = go.Figure()
    for (label, r), c in zip(results.items(), COLORS):
        d = r.occupancy.tolist()
        hover = None
        if tokens is not None and texts is not None:
            hover = [visible_text(texts.get(int(t), f"#{t}")) for t in tokens[:len(d)]]
        fig.add_trace(go.Bar(x=list(range(len(d))), y=d, name=f"{label} (EDR {r.edr:.1f})",
                             marker_color=c, opacity=0.75, customdata=hover,
                             hovertemplate="token %{x} %{customdata}: d = %{y:.2f}<extra></extra>"))
    fig.update_layout(barmode="overlay", height=280, margin=dict(l=10, r=10, t=10, b=10),
                      xaxis_title="reply token n", yaxis_title="rounds starting here (d_n)")
    return fig


def fig_values(results: dict) -> go.Figure:
    """V_n: expected rounds from state n to the end (V_0 = EDR)."""
    fig = go.Figure()
    for (label, r), c in zip(results.items(), COLORS):
        v = r.value.tolist()
        fig.add_trace(go.Scatter(x=list(range(len(v))), y=v, name=label, mode="lines",
                                 line=dict(color=c)))
    fig.update_layout(height=260, margin=dict(l=10, r=10, t=10, b=10),
                      xaxis_title="state n (tokens generated)",
                      yaxis_title="expected rounds to go (V_n)")
    return fig


def fig_acceptance(a: torch.Tensor, label: str) -> go.Figure:
    """Per-state acceptance a[n, t] (state x slot), greyed past the budget."""
    z = a.float().T.tolist()
    fig = go.Figure(go.Heatmap(z=z, x=list(range(a.shape[0])), y=list(range(1, a.shape[1] + 1)),
                               colorscale=[[0, "#ffebe9"], [1, "#1a7f37"]], zmin=0, zmax=1,
                               showscale=False,
                               hovertemplate="state %{x}, slot %{y}: %{z:.2f}<extra></extra>"))
    fig.update_layout(title=label, height=220, margin=dict(l=10, r=10, t=30, b=10),
                      xaxis_title="state n", yaxis_title="slot")
    return fig


def fig_difference(results: dict) -> go.Figure:
    """d_n(B) - d_n(A): positive where B starts more rounds (A saves them), negative where B
    saves rounds."""
    (la, a), (lb, b) = list(results.items())[:2]
    diff = (b.occupancy - a.occupancy).tolist()
    fig = go.Figure(go.Bar(x=list(range(len(diff))), y=diff,
                           marker_color=["#cf222e" if x > 0 else "#1a7f37" for x in diff],
                           hovertemplate="token %{x}: %{y:+.2f}<extra></extra>"))
    fig.update_layout(height=240, margin=dict(l=10, r=10, t=10, b=10),
                      xaxis_title="reply token n",
                      yaxis_title=f"d_n({lb}) - d_n({la})")
    return fig


def acceptance_column(k: int) -> str:
    """The summary table's name for the paper's AR_k."""
    return f"slot {k} accepted"


#: what the summary table's columns mean (the EDR page's column help)
SUMMARY_HELP = {
    "expected rounds (EDR)": "Exact expected number of decoding rounds to write this reply "
                             "(the sum of the occupancies d_n)",
    "tau = tokens / EDR": "Expected tokens committed per round",
    "rounds of a real run": "Rounds of a real speculative run of this drafter on the prompt",
    **{acceptance_column(k): f"P(draft slot {k} accepted | slots before it accepted), weighted "
       f"by how often the run starts a round at each state (the EDR paper's AR_{k})"
       for k in (1, 2, 3)},
}


def summary_rows(results: dict, actual: dict | None = None) -> list[dict]:
    """One row per drafter: expected rounds, mean accepted length, the paper's AR_1..AR_3
    (named "slot k accepted" here: "AR" is plain decoding everywhere else in specviz), and the
    rounds of a real run on the same prompt (when given)."""
    rows = []
    for label, r in results.items():
        ar = r.position_acceptance.tolist()
        row = {"drafter": label, "expected rounds (EDR)": round(r.edr, 2),
               "tokens": r.tokens, "tau = tokens / EDR": round(r.mean_accepted_length, 3)}
        for k in range(min(3, len(ar))):
            row[acceptance_column(k + 1)] = round(ar[k], 3)
        if actual is not None and label in actual:
            row["rounds of a real run"] = actual[label]
        rows.append(row)
    return rows
