"""ReTrace views (docs/methods/retrace.md): round r's rejected suffix under round r+1's block, the
match-rate heatmap (rejected slot x offset), the gate per slot, and ReTrace beside its DFlash
backbone.

Pure functions of :class:`~specviz.trace.Trace` records (a saved trace reopens the page without
a model). A ReTrace round records ``extras['retrace']``: the slots that received a memory, the
absolute positions / round-r slots they came from, whether round r's drafted token agreed with the
target's verify argmax there, and the gate value.
"""
from __future__ import annotations


import pandas as pd
import plotly.graph_objects as go

from ..analysis.alignment import OFFSETS, by_slot, final_tokens, rejected_tokens
from ..analysis.suffix_bound import SuffixBound
from ..trace import Trace
from .tokens import visible_text

KIND_COLORS = {"matched": "#1a7f37", "shifted": "#bf8700", "unmatched": "#cf222e"}
CSS = """<style>
.rt-grid{border-collapse:collapse;font-family:ui-monospace,monospace;font-size:0.92rem}
.rt-grid td,.rt-grid th{border:1px solid #d0d7de;padding:3px 6px;text-align:center;white-space:pre}
.rt-grid th{background:#f6f8fa;font-weight:600}
.rt-grid td.lbl{text-align:left;font-family:sans-serif;background:#f6f8fa}
.rt-matched{background:#dafbe1}.rt-shifted{background:#fff8c5}.rt-unmatched{background:#ffebe9}
.rt-first{outline:2px solid #cf222e;outline-offset:-2px}
.rt-fused{background:#ddf4ff}.rt-gate{font-size:0.75rem;color:#57606a}
</style>"""


def has_retrace(trace: Trace) -> bool:
    """True when some round of the trace carries ReTrace memory details."""
    return any("retrace" in r.extras for r in trace.rounds)


def no_memory_note(trace: Trace) -> str | None:
    """Why the page has no memory to show (None when some round carries one): the run was made
    by another drafter, or ReTrace never had a rejected suffix (two or more draft tokens after the
    first mismatch) before a drafted round -- the memory lives one round, and a round where the
    forward gate pauses the drafter has no block to fuse it into."""
    if has_retrace(trace):
        return None
    method = str(trace.meta.get("method") or "?").upper()
    tail = ("The alignment views below still show what its rejected suffixes were worth")
    if not any(r.drafter == "retrace" for r in trace.rounds):
        return (f"This run has no ReTrace memory details: it was made with **{method}**. {tail}; "
                "run ReTrace to see the memory and the gates.")
    drafted = sum(1 for r in trace.rounds if r.draft)
    return (f"ReTrace carried no memory in this run: no drafted round followed a round that "
            f"rejected two or more draft tokens (the memory is the rejected tokens after the "
            f"first mismatch, and it lives one round), or the trace was saved before ReTrace "
            f"recorded its memory. The drafter drafted in {drafted} of {trace.num_rounds} rounds "
            f"(tau {trace.tau:.2f}): its forward gate pauses it where drafting does not pay. "
            f"{tail}; a prompt where DFlash drafts well (math, code) shows the memory at work.")


def no_pairs_note(trace: Trace) -> str:
    """Why no round can be drawn under a rejected suffix: token-tree rounds (DFlash's default,
    :mod:`specviz.drafters.dflash.block_tree`) are not laid out by position, or no chain round
    rejected two or more tokens before the next round."""
    if any(r.is_tree for r in trace.rounds):
        return ("This run drafts token trees (several candidates per position), which are not "
                "laid out here: a rejected suffix and the next block are drawn for chain rounds "
                "(ReTrace, PLD, DFlash with tree=0).")
    return ("No round here rejected two or more draft tokens before the next round: there is "
            "no rejected suffix to lay under a next block.")


def gate_forced_off(trace: Trace) -> bool:
    """True when the run had ReTrace's gate forced off (``gate=off``: the memory is kept and
    aligned but adds nothing, so ReTrace drafts what its backbone does)."""
    return any((r.extras.get("retrace") or {}).get("gate_off") for r in trace.rounds)


def fusion_inert(trace: Trace) -> bool:
    """True when the trace's fusion added nothing to any slot with its gate on (every recorded
    ``residual`` is 0: a zero projection, i.e. an untrained fusion -- ReTrace then drafts what its
    backbone does, whatever the gate reads). Gate forced off, or traces recorded before the
    residual was kept: False."""
    if gate_forced_off(trace):
        return False
    res = [v for r in trace.rounds for v in (r.extras.get("retrace") or {}).get("residual", [])]
    return bool(res) and all(v == 0 for v in res)


def _text(trace: Trace, tok: int | None) -> str:
    if tok is None:
        return ""
    return visible_text(trace.token_texts.get(int(tok), f"#{tok}"))


def classify(token: int, position: int, final: list[int], max_offset: int = 3) -> str:
    """matched (the final text holds it at its position), shifted (within +-max_offset), or
    unmatched."""
    if position < len(final) and final[position] == token:
        return "matched"
    for o in range(1, max_offset + 1):
        for p in (position - o, position + o):
            if 0 <= p < len(final) and final[p] == token:
                return "shifted"
    return "unmatched"


def pair_rows(trace: Trace, i: int) -> dict | None:
    """Round i-1's rejected suffix and round i's block by absolute position (None when round
    i-1 rejected nothing after its first mismatch -- no memory to carry -- or one of them is a
    tree round)."""
    if i < 1 or i >= len(trace.rounds):
        return None
    prev, cur = trace.rounds[i - 1], trace.rounds[i]
    if prev.is_tree or cur.is_tree or len(prev.rejected_suffix) < 2:
        return None
    final = final_tokens(trace)
    rej = {prev.start + prev.accepted + j: t for j, t in enumerate(prev.rejected_suffix)}
    first = prev.start + prev.accepted
    new = {cur.start + j: t for j, t in enumerate(cur.draft)}
    info = cur.extras.get("retrace") or {}
    anchor = cur.start - 1
    gates = {anchor + s: g for s, g in zip(info.get("slots", []), info.get("gate", []))}
    positions = sorted(set(rej) | set(new) | {first})
    return {"positions": positions, "rejected": rej, "first_rejected": first, "draft": new,
            "final": {p: final[p] for p in positions if p < len(final)}, "gates": gates,
            "kinds": {p: classify(t, p, final) for p, t in rej.items()},
            "prev_index": prev.index, "index": cur.index}


def alignment_grid_html(trace: Trace, i: int, include_css: bool = True) -> str:
    """An HTML grid: positions as columns; round r's rejected tokens (coloured matched /
    shifted / unmatched against the final text, the first rejected outlined), round r+1's draft
    (blue where the memory was fused, with its gate), and the final text."""
    rows = pair_rows(trace, i)
    if rows is None:
        return ("<p><i>The previous round rejected nothing after its first mismatch, so this "
                "round has no memory.</i></p>")
    P = rows["positions"]
    head = "".join(f"<th>{p}</th>" for p in P)
    r1 = []
    for p in P:
        t = rows["rejected"].get(p)
        cls = f"rt-{rows['kinds'][p]}" if t is not None else ""
        if p == rows["first_rejected"] and t is not None:
            cls += " rt-first"
        r1.append(f"<td class='{cls}'>{_text(trace, t)}</td>")
    r2 = []
    for p in P:
        t = rows["draft"].get(p)
        g = rows["gates"].get(p)
        gate = f"<br><span class='rt-gate'>gate {g:.2f}</span>" if g is not None else ""
        r2.append(f"<td class='{'rt-fused' if g is not None else ''}'>{_text(trace, t)}{gate}</td>")
    r3 = "".join(f"<td>{_text(trace, rows['final'].get(p))}</td>" for p in P)
    return ((CSS if include_css else "") +
            "<table class='rt-grid'><tr><th>position</th>" + head + "</tr>"
            f"<tr><td class='lbl'>round {rows['prev_index'] + 1}: rejected</td>{''.join(r1)}</tr>"
            f"<tr><td class='lbl'>round {rows['index'] + 1}: draft</td>{''.join(r2)}</tr>"
            f"<tr><td class='lbl'>final text</td>{r3}</tr></table>")


def legend_html() -> str:
    return ("<span class='rt-matched'>&nbsp;matched&nbsp;</span> the final text holds the rejected "
            "token at its own position · <span class='rt-shifted'>&nbsp;shifted&nbsp;</span> one "
            "to three positions away · <span class='rt-unmatched'>&nbsp;unmatched&nbsp;</span> "
            "not nearby · <span class='rt-first'>&nbsp;outlined&nbsp;</span> the token the "
            "target rejected (the ones after it were never judged on a correct prefix) · "
            "<span class='rt-fused'>&nbsp;blue&nbsp;</span> a slot that received the memory, with "
            "its gate (0 = ignored, 1 = fully added)")


def match_matrix(traces: list[Trace]) -> pd.DataFrame:
    """Match rate [rejected slot x offset] over the rejected tokens of ``traces``."""
    slots = by_slot(t for tr in traces for t in rejected_tokens(tr))
    return pd.DataFrame([[summ.by_offset.get(o, 0.0) for o in OFFSETS] for summ in slots.values()],
                        index=pd.Index(list(slots), name="rejected slot"), columns=list(OFFSETS))


def fig_match_heatmap(traces: list[Trace], title: str = "") -> go.Figure:
    m = match_matrix(traces)
    fig = go.Figure(go.Heatmap(
        z=m.values, x=[f"{o:+d}" for o in m.columns], y=[str(s) for s in m.index],
        colorscale="Greens", zmin=0, zmax=max(0.3, float(m.values.max()) if m.size else 0.3),
        hovertemplate="rejected slot %{y}, offset %{x}: %{z:.0%} match<extra></extra>"))
    fig.update_layout(title=title or None, height=260 + 18 * len(m.index),
                      margin=dict(l=10, r=10, t=40 if title else 10, b=10),
                      xaxis_title="offset from the predicted position",
                      yaxis_title="slot in the rejected suffix (1 = the rejected token)")
    # labels like "+0" and "1" are categories: left to plotly, they read as numbers (a one-slot
    # run then shows slot "0.6 .. 1.4" and drops the offsets between its ticks)
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category", autorange="reversed")
    return fig


def slot_table(traces: list[Trace]) -> pd.DataFrame:
    """Exact / best-offset / top-k match rate per rejected slot (ReTrace's alignment probe)."""
    rows = []
    for s, summ in sorted(by_slot(t for tr in traces for t in rejected_tokens(tr)).items()):
        rows.append({"rejected slot": s, "tokens": summ.rejected, "exact": summ.exact,
                     "best offset": summ.best_offset, "top-k": summ.topk,
                     "next round drafted there": summ.partner})
    return pd.DataFrame(rows)


def fig_suffix_bound(bound: SuffixBound) -> go.Figure:
    """Tokens the rejected suffix would have added in the next rounds, per offset
    (:mod:`specviz.analysis.suffix_bound`), with the best offset per round (an oracle)."""
    xs = [f"{o:+d}" for o in bound.by_offset] + ["best per round"]
    ys = list(bound.by_offset.values()) + [bound.best]
    fig = go.Figure(go.Bar(x=xs, y=ys, marker_color=["#bf8700"] * len(bound.by_offset)
                           + ["#1a7f37"], hovertemplate="offset %{x}: %{y} tokens<extra></extra>"))
    fig.update_layout(height=240, margin=dict(l=10, r=10, t=10, b=10),
                      xaxis_title="rejected suffix laid over the next round, shifted by",
                      yaxis_title="tokens it adds")
    fig.update_xaxes(type="category")   # else "+0".."+2" read as numbers and "best" is dropped
    return fig


def gate_table(trace: Trace) -> pd.DataFrame:
    """One row per fused slot: round, slot, the position it came from, agree flag, gate."""
    rows = []
    for r in trace.rounds:
        info = r.extras.get("retrace")
        if not info:
            continue
        for s, p, a, g in zip(info["slots"], info["from_positions"], info["agree"], info["gate"]):
            acc = "accepted" if s <= r.accepted else ("rejected" if s <= len(r.draft)
                                                      else "not verified")
            rows.append({"round": r.index + 1, "slot": s, "from position": p,
                         "target agreed there": a, "gate": g, "slot's fate": acc})
    return pd.DataFrame(rows)


def fig_gates(trace: Trace) -> go.Figure:
    t = gate_table(trace)
    fig = go.Figure()
    for fate, color in (("accepted", "#1a7f37"), ("rejected", "#cf222e"),
                        ("not verified", "#8c959f")):
        sub = t[t["slot's fate"] == fate] if len(t) else t
        if len(sub):
            fig.add_trace(go.Scatter(x=sub["round"], y=sub["gate"], mode="markers", name=fate,
                                     marker=dict(color=color, size=7 + 2 * sub["slot"]),
                                     customdata=sub[["slot", "from position"]],
                                     hovertemplate="round %{x}, slot %{customdata[0]}: gate "
                                                   "%{y:.2f}<extra></extra>"))
    fig.update_layout(height=280, margin=dict(l=10, r=10, t=10, b=10), xaxis_title="round",
                      yaxis_title="gate", yaxis_range=[0, 1], legend_title="the slot was")
    return fig


def first_divergence(a: Trace, b: Trace) -> int | None:
    """Index of the first round whose draft or acceptance differs (None: identical runs)."""
    for i, (x, y) in enumerate(zip(a.rounds, b.rounds)):
        if x.draft != y.draft or x.accepted != y.accepted:
            return i
    return None if len(a.rounds) == len(b.rounds) else min(len(a.rounds), len(b.rounds))


def side_by_side(retrace: Trace, backbone: Trace) -> pd.DataFrame:
    """Per round: where each run started, how many tokens it kept, and the gain."""
    rows = []
    for k in range(max(len(retrace.rounds), len(backbone.rounds))):
        x = retrace.rounds[k] if k < len(retrace.rounds) else None
        y = backbone.rounds[k] if k < len(backbone.rounds) else None
        rows.append({"round": k + 1,
                     "ReTrace kept": None if x is None else len(x.committed),
                     "backbone kept": None if y is None else len(y.committed),
                     "ReTrace fused slots": None if x is None else
                     len((x.extras.get("retrace") or {}).get("slots", [])),
                     "ReTrace at token": None if x is None else x.start - len(retrace.prompt_ids),
                     "backbone at token": None if y is None else y.start - len(backbone.prompt_ids)})
    return pd.DataFrame(rows)


def fig_progress(retrace: Trace, backbone: Trace) -> go.Figure:
    """Tokens committed after each round: the run above the other saves rounds."""
    fig = go.Figure()
    for tr, name, color in ((retrace, "ReTrace", "#0969da"), (backbone, "DFlash backbone",
                                                               "#8c959f")):
        ys, tot = [], 0
        for r in tr.rounds:
            tot += len(r.committed)
            ys.append(tot)
        fig.add_trace(go.Scatter(x=list(range(1, len(ys) + 1)), y=ys, mode="lines+markers",
                                 name=name, line=dict(color=color)))
    fig.update_layout(height=300, margin=dict(l=10, r=10, t=10, b=10), xaxis_title="round",
                      yaxis_title="tokens committed")
    return fig
