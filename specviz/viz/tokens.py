"""Token-by-token rendering of a trace (speculative decoding, steps 3-4).

Every generated token is drawn as a box whose colour says where it came from:

* ``tok accepted``           — a draft token the target accepted,
* ``tok bonus t-correction`` — the target's own token at the first mismatch (a correction),
* ``tok bonus t-bonus``      — the target's own token after a fully accepted draft (a bonus),
* ``tok bonus t-nodraft``    — the target's own token in a round without a draft,
* ``tok rejected``           — a draft token of the round's rejected suffix (never committed),
  drawn struck-through right where it was rejected (before the correction that replaced it);
  ``first`` marks the token the target actually judged and rejected (the target's own choice
  and its probability are written under it), ``unjudged`` the knock-on tokens after it (never
  judged on a correct prefix, so no probability is shown for them).

Hovering a box shows its round, position and the drafter / target probabilities. The spans are
built from a :class:`~specviz.trace.Trace` only (``token_views`` gives the same data as records,
for tests and tables).
"""
from __future__ import annotations

import html
from dataclasses import dataclass

from ..trace import Round, Trace

KIND_LABELS = {
    "accepted": "accepted draft token",
    "correction": "target token: correction (replaces the first rejected draft token)",
    "bonus": "target token: bonus (the whole draft was accepted)",
    "nodraft": "target token: no draft this round (a plain decoding step)",
    "rejected": "rejected draft token (never committed)",
}

# Token colours live in TOKEN_CSS below; they were chosen for contrast on white and for
# colour-blind users (rejected tokens are also struck through and dashed, so they never rely
# on colour alone). Charts use the same hues:
CHART_COLORS = {
    "accepted": "#10b981",
    "correction": "#f59e0b",
    "bonus": "#3b82f6",
    "nodraft": "#94a3b8",
    "rejected": "#f87171",
    "rate": "#4338ca",
    "hist": "#6366f1",
}


@dataclass
class TokenView:
    """One drawn token."""

    kind: str                  # accepted | correction | bonus | nodraft | rejected
    token_id: int
    text: str
    round: int
    position: int              # absolute position (prompt included)
    output_index: int          # position - prompt_len (0 = first generated token)
    q: float | None = None     # drafter probability (None: point mass / not recorded)
    p: float | None = None     # target probability of this token (None: not recorded)
    target_argmax: int | None = None  # what the target predicted at this position
    selected: bool = False     # belongs to the highlighted round
    status: str | None = None  # a rejected token's node status: first_rejected (the target
    #                            disagreed here), rejected (a tree sibling) or not_reached
    target_argmax_p: float | None = None  # the target's probability of its own choice there

    @property
    def css_class(self) -> str:
        if self.kind == "accepted":
            base = "tok accepted"
        elif self.kind == "rejected":
            base = "tok rejected" + {"first_rejected": " first", "not_reached": " unjudged"}.get(
                self.status or "", "")
        else:
            base = f"tok bonus t-{self.kind}"
        return base + (" sel" if self.selected else "")


def _get(lst, i):
    try:
        v = lst[i]
    except (IndexError, TypeError):
        return None
    return v


def round_views(r: Round, prompt_len: int, texts: dict[int, str], show_rejected: bool = True,
                selected: bool = False, sampling: bool = False) -> list[TokenView]:
    """The tokens of one round in reading order: accepted, rejected suffix, target token."""
    kind = r.kind
    out: list[TokenView] = []
    committed = list(r.committed)
    path = r.path
    depths = r.tree.depths
    status = r.node_status(sampling=sampling)

    def view(k, tid, pos, q=None, p=None, amax=None):
        return TokenView(kind=k, token_id=int(tid), text=texts.get(int(tid), f"<{tid}>"),
                         round=r.index, position=pos, output_index=pos - prompt_len, q=q, p=p,
                         target_argmax=amax, selected=selected)

    def draft_view(k, node, pos):
        v = view(k, r.draft[node], pos, q=_get(r.q_draft, node), p=_get(r.p_draft, node),
                 amax=_get(r.target_argmax, r.node_row(node)))
        v.status = status[node] if k == "rejected" else None
        if v.status == "first_rejected":
            v.target_argmax_p = _get(r.target_argmax_prob, r.node_row(node))
        return v

    for j in range(min(r.accepted, len(committed), len(path))):
        out.append(draft_view("accepted", path[j], r.start + j))
    if show_rejected:
        for node in r.rejected_nodes:
            out.append(draft_view("rejected", node, r.start + depths[node] - 1))
    if len(committed) > r.accepted:
        tid = committed[r.accepted]
        amax = _get(r.target_argmax, r.target_row)
        p = _get(r.target_argmax_prob, r.target_row) if amax == tid else None
        out.append(view(kind, tid, r.start + r.accepted, p=p, amax=amax))
    return out


def token_views(trace: Trace, rejected: str = "all",
                selected_round: int | None = None) -> list[TokenView]:
    """All drawn tokens of ``trace``. ``rejected``: ``all`` rounds, ``selected`` round, ``none``."""
    if rejected not in ("all", "selected", "none"):
        raise ValueError("rejected must be 'all', 'selected' or 'none'")
    prompt_len = int(trace.meta.get("prompt_len") or len(trace.prompt_ids))
    sampling = float((trace.meta.get("settings") or {}).get("temperature") or 0.0) > 0.0
    out: list[TokenView] = []
    for r in trace.rounds:
        sel = selected_round is not None and r.index == selected_round
        show = rejected == "all" or (rejected == "selected" and sel)
        out.extend(round_views(r, prompt_len, trace.token_texts, show, sel, sampling))
    return out


def visible_text(text: str) -> str:
    """Token text with whitespace made visible (escaped for HTML)."""
    if text == "":
        return "∅"
    s = html.escape(text, quote=False)
    s = s.replace("\t", "⇥").replace("\r", "").replace("\n", "↵")
    return s


def _fmt_prob(x) -> str:
    return "—" if x is None else f"{float(x):.3f}"


def token_title(v: TokenView, texts: dict[int, str]) -> str:
    lines = [f"Round {v.round + 1} · position {v.position} (output token {v.output_index + 1})",
             KIND_LABELS.get(v.kind, v.kind),
             f"token {v.token_id}: {texts.get(v.token_id, '')!r}"]
    if v.status == "not_reached":
        lines.append("never judged: it came after the first rejected token, so the target saw "
                     "it only on a wrong prefix")
    elif v.kind in ("accepted", "rejected"):
        q = "point mass (deterministic draft)" if v.q is None else _fmt_prob(v.q)
        lines.append(f"drafter prob q: {q}")
        lines.append(f"target prob p: {_fmt_prob(v.p)}")
        if v.kind == "rejected" and v.target_argmax is not None:
            lines.append(f"target's top token here: {texts.get(v.target_argmax, '')!r}")
    else:
        lines.append("drafter prob q: — (the target's own token)")
        lines.append(f"target prob p: {_fmt_prob(v.p)}")
    return "\n".join(lines)


TOKEN_CSS = """
<style>
.specviz-tokens{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:0.86rem;
 line-height:2.05;padding:0.7rem 0.8rem;border:1px solid #e2e8f0;border-radius:0.5rem;
 background:#ffffff;max-height:28rem;overflow-y:auto;word-break:break-word;}
.specviz-tokens .tok{display:inline-block;white-space:pre;margin:0 1px;padding:0 3px;
 border:1px solid;border-radius:4px;line-height:1.45;cursor:default;}
.specviz-tokens .tok.accepted{background:#d1fae5;border-color:#059669;color:#064e3b;}
.specviz-tokens .tok.bonus.t-correction{background:#fef3c7;border-color:#d97706;color:#78350f;
 font-weight:600;}
.specviz-tokens .tok.bonus.t-bonus{background:#dbeafe;border-color:#2563eb;color:#1e3a8a;
 font-weight:600;}
.specviz-tokens .tok.bonus.t-nodraft{background:#f1f5f9;border-color:#94a3b8;color:#1e293b;}
.specviz-tokens .tok.rejected{background:#fee2e2;border:1px dashed #dc2626;color:#991b1b;
 text-decoration:line-through;text-decoration-thickness:1.5px;opacity:0.55;font-size:0.78em;}
.specviz-tokens .tok.rejected.first{opacity:0.95;border:2px solid #dc2626;font-size:0.86em;}
.specviz-tokens .rj{display:inline-flex;flex-direction:column;align-items:flex-start;
 margin-bottom:0.15em;}
.specviz-tokens .tok.rejected.unjudged{opacity:0.4;border-style:dotted;}
.specviz-tokens .rj .want{margin:1px 1px 0 1px;white-space:pre;
 font-size:0.72rem;line-height:1.1;color:#7c2d12;background:#fff7ed;border:1px solid #fdba74;
 border-radius:3px;padding:0 3px;text-decoration:none;display:inline-block;}
.specviz-tokens .tok.sel{box-shadow:0 2px 0 0 #4338ca;}
.specviz-tokens .tok.rejected.sel{opacity:0.95;}
.specviz-tokens .rsep{display:inline-block;width:2px;height:1.25em;background:#cbd5e1;
 margin:0 3px;vertical-align:middle;border-radius:1px;}
.specviz-tokens .prompt-note{color:#64748b;font-style:italic;}
.specviz-legend{display:flex;flex-wrap:wrap;gap:0.35rem 1rem;font-size:0.82rem;color:#334155;
 margin:0.2rem 0 0.5rem 0;align-items:center;}
.specviz-legend .tok{display:inline-block;padding:0 5px;border:1px solid;border-radius:4px;
 font-family:ui-monospace,monospace;margin-right:0.3rem;line-height:1.45;}
.specviz-legend .tok.accepted{background:#d1fae5;border-color:#059669;color:#064e3b;}
.specviz-legend .tok.bonus.t-correction{background:#fef3c7;border-color:#d97706;color:#78350f;}
.specviz-legend .tok.bonus.t-bonus{background:#dbeafe;border-color:#2563eb;color:#1e3a8a;}
.specviz-legend .tok.bonus.t-nodraft{background:#f1f5f9;border-color:#94a3b8;color:#1e293b;}
.specviz-legend .tok.rejected{background:#fee2e2;border:1px dashed #dc2626;color:#991b1b;
 text-decoration:line-through;}
.specviz-legend .tok.rejected.first{border:2px solid #dc2626;}
.specviz-legend .tok.rejected.unjudged{opacity:0.45;border-style:dotted;}
.specviz-legend .rsep{display:inline-block;width:2px;height:1.1em;background:#cbd5e1;
 margin-right:0.4rem;vertical-align:middle;}
</style>
"""


def _wanted_html(v: TokenView, texts: dict[int, str]) -> str:
    """Under the first rejected token: what the target chose there, and how sure it was."""
    if v.status != "first_rejected" or v.target_argmax is None or v.target_argmax < 0:
        return ""
    p = "" if v.target_argmax_p is None else f" {float(v.target_argmax_p):.0%}"
    return (f'<span class="want" title="the target\'s own token here, and its probability">'
            f'→{visible_text(texts.get(v.target_argmax, ""))}{p}</span>')


def tokens_html(trace: Trace, rejected: str = "all", selected_round: int | None = None,
                include_css: bool = True) -> str:
    """The generated text as HTML token spans (see the module docstring for the classes)."""
    views = token_views(trace, rejected, selected_round)
    texts = trace.token_texts
    parts = [TOKEN_CSS if include_css else "", '<div class="specviz-tokens">']
    if not views:
        parts.append('<span class="prompt-note">No tokens yet: press <b>Next round</b> to run '
                     'the first speculative round.</span>')
    last_round = None
    for v in views:
        if last_round is not None and v.round != last_round:
            parts.append(f'<span class="rsep" title="round {v.round + 1} starts"></span>')
        last_round = v.round
        title = html.escape(token_title(v, texts), quote=True).replace("\n", "&#10;")
        box = (f'<span class="{v.css_class}" title="{title}" data-round="{v.round}" '
               f'data-pos="{v.position}">{visible_text(v.text)}</span>')
        want = _wanted_html(v, texts)  # under the box, its width reserved (labels never overlap)
        parts.append(f'<span class="rj">{box}{want}</span>' if want else box)
        if "\n" in v.text and v.kind != "rejected":
            parts.append("<br>")
    parts.append("</div>")
    return "".join(parts)


def legend_html(include_css: bool = False) -> str:
    """A colour legend for :func:`tokens_html`."""
    items = [
        ("tok accepted", "the", "accepted draft token"),
        ("tok bonus t-correction", "the", "target's token: correction at the first mismatch"),
        ("tok bonus t-bonus", "the", "target's token: bonus after a fully accepted draft"),
        ("tok bonus t-nodraft", "the", "target's token, no draft (plain step)"),
        ("tok rejected first", "the", "first rejected draft token: the target disagreed "
         "here (→ below it: the target's own token and its probability)"),
        ("tok rejected unjudged", "the", "later draft tokens: never judged (they followed a "
         "rejected token)"),
    ]
    parts = [TOKEN_CSS if include_css else "", '<div class="specviz-legend">']
    for cls, sample, label in items:
        parts.append(f'<span><span class="{cls}">{sample}</span>{html.escape(label)}</span>')
    parts.append('<span><span class="rsep"></span>round boundary · hover a token for details'
                 '</span></div>')
    return "".join(parts)
