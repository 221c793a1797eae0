"""Draft trees drawn (token trees of SpecInfer / EAGLE / AdaPLD branched hypotheses; a chain is
a one-branch tree), for any drafter's rounds.

Node statuses come from :meth:`specviz.tree.TokenTree.node_status` via :meth:`Round.node_status`
(accepted / first_rejected / rejected / not_reached); this module only places and colours them.
Pure functions of a :class:`~specviz.trace.Trace` (no streamlit, no model).
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

from ..trace import Round, Trace

STATUS_COLORS = {  # box fill, border (token colours of specviz.viz.tokens)
    "accepted": ("#d1fae5", "#059669"),
    "first_rejected": ("#fee2e2", "#dc2626"),
    "rejected": ("#fef2f2", "#f87171"),
    "not_reached": ("#f8fafc", "#cbd5e1"),
    "root": ("#e2e8f0", "#334155"),
    "correction": ("#fef3c7", "#d97706"),
    "bonus": ("#dbeafe", "#2563eb"),
}
STATUS_LABELS = {
    "accepted": "accepted",
    "first_rejected": "first rejected (the target disagreed here; the round ended)",
    "rejected": "rejected (a sibling of an accepted token)",
    "not_reached": "not reached (below a rejected token: never judged)",
    "root": "root: last committed token",
}
_FONT = dict(family="Inter, system-ui, sans-serif", size=12, color="#1e293b")


def plotly_text(s: str) -> str:
    """``s`` safe in Plotly's text and hover labels: only & < > escaped -- Plotly decodes those
    and numeric entities, but shows a named one like ``&quot;`` literally."""
    return html.escape(s, quote=False)


def is_sampling(trace: Trace) -> bool:
    """True when the trace was verified by sampling (temperature > 0)."""
    settings = trace.meta.get("settings") or {}
    try:
        return float(settings.get("temperature") or 0.0) > 0.0
    except (TypeError, ValueError):
        return False


def root_token(trace: Trace, round_index: int) -> int | None:
    """The last committed token before round ``round_index`` (the tree's root)."""
    for r in reversed(trace.rounds[:round_index]):
        if r.committed:
            return int(r.committed[-1])
    return int(trace.prompt_ids[-1]) if trace.prompt_ids else None


def tree_layout(r: Round) -> tuple[list[int], list[float]]:
    """(x = depth, y = row) for every draft node: leaves take consecutive rows in depth-first
    order (the first branch on top), a parent sits level with its first child."""
    tree = r.tree
    children = tree.children_map()
    y: list[float] = [0.0] * len(tree)
    row = [0]

    def place(node: int) -> float:
        kids = children.get(node, [])
        if not kids:
            yy = float(row[0])
            row[0] += 1
        else:
            yy = [place(c) for c in kids][0]
        if node >= 0:
            y[node] = yy
        return yy

    place(-1)  # recursion depth <= draft depth (max_draft <= 64)
    return tree.depths, y


def short_text(text: str, n: int = 14) -> str:
    """A token's text for a small box: whitespace made visible, cut to ``n`` characters."""
    s = text.replace("\n", "↵").replace("\t", "⇥").replace("\r", "")
    if s == "":
        s = "∅"
    if s.strip() == "":
        s = s.replace(" ", "␣")
    return s if len(s) <= n else s[:n - 1] + "…"


def _edges(fig: go.Figure, r: Round, xs: list[float], ys: list[float]) -> None:
    """Parent -> child elbows; the accepted path bold."""
    on_path = set(r.path)
    x_of = lambda node: 0.0 if node < 0 else xs[node]  # noqa: E731
    y_of = lambda node: 0.0 if node < 0 else ys[node]  # noqa: E731
    ex_, ey_, ax_, ay_ = [], [], [], []
    for i, p in enumerate(r.tree.parents):
        seg_x = [x_of(p), x_of(p) + 0.5, x_of(p) + 0.5, xs[i], None]
        seg_y = [y_of(p), y_of(p), ys[i], ys[i], None]
        bold = i in on_path and (p < 0 or p in on_path)
        (ax_ if bold else ex_).extend(seg_x)
        (ay_ if bold else ey_).extend(seg_y)
    fig.add_scatter(x=ex_, y=ey_, mode="lines", line=dict(color="#94a3b8", width=1.5),
                    hoverinfo="skip", showlegend=False)
    fig.add_scatter(x=ax_, y=ay_, mode="lines", line=dict(color="#059669", width=5),
                    hoverinfo="skip", name="accepted path", showlegend=bool(ax_))


def _node_hover(trace: Trace, r: Round, i: int, status: str, depth: int,
                note: str | None) -> str:
    texts = trace.token_texts
    tok = int(r.draft[i])
    lines = [f"node {i} · depth {depth} · {STATUS_LABELS[status]}",
             f"token {tok}: {texts.get(tok, '')!r}"]
    if note:
        lines.append(note)
    if i < len(r.p_draft) and status != "not_reached":
        lines.append(f"target prob of this token: {float(r.p_draft[i]):.3f}")
    row = r.node_row(i)
    if status in ("first_rejected", "rejected") and row < len(r.target_argmax):
        want = int(r.target_argmax[row])
        lines.append(f"target's top token here: {texts.get(want, '')!r}")
    return "<br>".join(plotly_text(s) for s in lines)


def _box(fig: go.Figure, x, y, text, fill, line, width=1.5, bold=False) -> None:
    fig.add_annotation(x=x, y=y, text=("<b>%s</b>" % plotly_text(text)) if bold
                       else plotly_text(text), showarrow=False, bgcolor=fill,
                       bordercolor=line, borderwidth=width, borderpad=4,
                       font=dict(family="ui-monospace, Menlo, Consolas, monospace", size=12,
                                 color="#0f172a"))


def _marker(fig: go.Figure, x, y, name, fill, line, hover, legend=True) -> None:
    fig.add_scatter(x=x or [None], y=y or [None], mode="markers", name=name,
                    marker=dict(symbol="square", size=16, color=fill,
                                line=dict(color=line, width=2)),
                    hovertext=hover, hoverinfo="text", showlegend=legend)


def _target_node(fig: go.Figure, trace: Trace, r: Round, xs, ys, rows: float):
    """The target's own token on a dotted edge off the last accepted node; returns
    (x, y, kind, label, rows)."""
    last = r.path[-1] if r.path else -1
    kind = r.kind if r.draft else "bonus"
    label = "target's token (no draft)" if not r.draft else f"target's {kind} token"
    lx, ly = (0.0, 0.0) if last < 0 else (xs[last], ys[last])
    has_kids = bool(r.tree.children_map().get(last))
    tx, ty = lx + 1, (float(rows) if has_kids else ly)
    fig.add_scatter(x=[lx, lx + 0.5, lx + 0.5, tx], y=[ly, ly, ty, ty], mode="lines",
                    line=dict(color=STATUS_COLORS[kind][1], width=2, dash="dot"),
                    hoverinfo="skip", showlegend=False)
    tt = r.target_token
    _marker(fig, [tx], [ty], label, *STATUS_COLORS[kind],
            [plotly_text(f"{label}: {trace.token_texts.get(tt, '')!r}")])
    return tx, ty, kind, rows + (1 if has_kids else 0)


def branch_tree_figure(trace: Trace, round_index: int, show_target: bool = True,
                       node_notes: list[str | None] | None = None, subtitle: str = "",
                       empty_note: str = "no draft") -> go.Figure:
    """The round's draft as a tree (Plotly): boxes are draft tokens, edges parent -> child, the
    root is the last committed token. Colours by node status (accepted path bold); the target's
    own token (correction or bonus) hangs off the last accepted node on a dotted edge.
    ``node_notes``: an extra hover line per node (e.g. AdaPLD's branch of origin)."""
    fig = go.Figure()
    if not 0 <= round_index < len(trace.rounds):
        return _figure_layout(fig, "No such round", 1, 1, 200)
    r = trace.rounds[round_index]
    texts = trace.token_texts
    status = r.node_status(sampling=is_sampling(trace))
    depth, ys = tree_layout(r)
    xs = [float(d) for d in depth]
    rows = (max(ys) + 1) if ys else 1
    _edges(fig, r, xs, ys)
    tgt = None
    if show_target and r.target_token >= 0:
        tx, ty, kind, rows = _target_node(fig, trace, r, xs, ys, rows)
        tgt = (tx, ty, kind)
    notes = node_notes or [None] * len(r.draft)
    for st_ in ("accepted", "first_rejected", "rejected", "not_reached"):
        idx = [i for i, s in enumerate(status) if s == st_]
        if idx or st_ in ("accepted", "first_rejected", "not_reached"):
            _marker(fig, [xs[i] for i in idx], [ys[i] for i in idx],
                    f"{STATUS_LABELS[st_].split(' (')[0]} ({len(idx)})", *STATUS_COLORS[st_],
                    [_node_hover(trace, r, i, s, depth[i], notes[i])
                     for i, s in zip(idx, [st_] * len(idx))])
    root = root_token(trace, round_index)
    _marker(fig, [0.0], [0.0], "root", STATUS_COLORS["root"][0], STATUS_COLORS["root"][0],
            [plotly_text(f"root: last committed token {texts.get(root, '')!r} "
                         f"(position {r.start - 1})")], legend=False)
    _box(fig, 0.0, 0.0, short_text(texts.get(root, "") if root is not None else "root"),
         *STATUS_COLORS["root"], width=2)
    for i, s in enumerate(status):
        _box(fig, xs[i], ys[i], short_text(texts.get(int(r.draft[i]), f"<{r.draft[i]}>")),
             *STATUS_COLORS[s], width=2.5 if s == "accepted" else 1.5, bold=s == "accepted")
    if tgt is not None:
        _box(fig, tgt[0], tgt[1], short_text(texts.get(r.target_token, f"<{r.target_token}>")),
             *STATUS_COLORS[tgt[2]], width=2)
    if not r.draft:
        fig.add_annotation(text=f"No draft this round ({empty_note}): the target made one token",
                           x=0.5, y=1.0 if rows <= 1 else 0.5, xref="x domain", yref="paper",
                           showarrow=False, font=dict(size=12, color="#64748b"), yanchor="top")
    n = len(r.draft)
    title = (f"Round {r.index + 1}: draft {'tree' if r.is_tree else 'chain'} · {n} "
             f"node{'s' if n != 1 else ''} · {len(r.path)} accepted" + subtitle)
    max_x = max([0.0] + xs + ([tgt[0]] if tgt else []))
    return _figure_layout(fig, title, max_x, rows, max(220, 70 + 48 * rows))


def _figure_layout(fig: go.Figure, title: str, max_x: float, rows: float, height: int
                   ) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, x=0.0, xanchor="left", font=dict(size=14)),
        template="plotly_white", height=height, font=_FONT,
        margin=dict(l=20, r=20, t=70, b=20), hovermode="closest",
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0,
                    font=dict(size=11)),
        plot_bgcolor="#ffffff")
    # at least 9 columns, so short drafts keep the spacing of long ones instead of stretching
    fig.update_xaxes(visible=False, range=[-0.6, max(max_x, 8.0) + 0.6])
    fig.update_yaxes(visible=False, range=[rows - 0.4, -0.6])  # first branch on top
    return fig


def block_tree_figure(trace: Trace, round_index: int) -> go.Figure:
    """A DFlash block verified as a token tree (:mod:`specviz.drafters.dflash.block_tree`): the
    round's tree, each node's hover naming its word's rank in its slot and the drafter's
    probability."""
    r = trace.rounds[round_index] if 0 <= round_index < len(trace.rounds) else None
    ex = (r.extras or {}) if r is not None else {}
    ranks, conf = ex.get("tree_ranks") or [], ex.get("confidence") or []
    notes = None
    if r is not None and len(ranks) == len(r.draft) == len(conf):
        order = ("top", "2nd", "3rd")
        notes = [f"the slot's {order[k] if k < 3 else f'{k + 1}th'} word, drafter p = {p:.3f}"
                 for k, p in zip(ranks, conf)]
    return branch_tree_figure(trace, round_index, node_notes=notes,
                              subtitle=" · the block's top words, most probable paths first")
