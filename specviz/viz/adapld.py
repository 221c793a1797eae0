"""Views of an AdaPLD run (docs/methods/adapld.md): where each draft came from and what the target
made of it.

Pure functions of a :class:`~specviz.trace.Trace` / :class:`~specviz.trace.Round` (no streamlit,
no model), read from the drafter's round extras (:meth:`AdaPLDDrafter._extras`):

* ``extras["retrieval"]`` — ``lexical`` | ``semantic`` | ``none`` | ``off`` (source switched off
  by the adaptive control), ``extras["source"]`` — ``lex1`` / ``lex2`` / ``lex3`` / ``sem`` /
  ``semfree``;
* ``extras["suffix"]`` — ``[start, end)`` of the context suffix that was looked up;
* ``extras["matches"]`` — ranked candidates, each with its matched ``span`` and the copied
  tokens ``copy_from`` (absolute positions into prompt_ids + output), ``score``, ``kind``
  and ``branch`` (its branch index in the draft, or None for a ranked alternative not drafted).

Functions:

* the round's context (prompt + generated tokens) with the matched spans, the looked-up suffix
  and the copied tokens marked: :mod:`.adapld_context`.
* :func:`branch_tree_figure` — the draft tree (:mod:`specviz.viz.tree`) with each node's
  branch of origin (a chain is a one-branch tree).
* :func:`retrieval_counts`, :func:`retrieval_table`, :func:`fig_retrieval` — retrieval kinds over
  the run.
"""
from __future__ import annotations

import html
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from .. import metrics
from ..drafters import methods_of
from ..drafters.adapld.drafter import AdaPLDDrafter
from ..trace import Round, Trace
from . import tree as vt
from .adapld_context import retrieval_kind, round_context, round_matches, span_of
from .rounds import RoundNotes
from .rounds import round_summary_html as _round_sentence
from .tables import join_tokens

#: the registered methods AdaPLD builds (the full method and its ablations)
ADAPLD_METHODS = methods_of(AdaPLDDrafter)
#: ablation ladder shown on the page: method -> label
ABLATION_LABELS = {
    "ar": "AR (plain decoding, baseline)",
    "pld": "PLD (prompt lookup, reference)",
    "adapld_lex": "AdaPLD: lexical only",
    "adapld_sem": "AdaPLD: + semantic",
    "adapld_nohist": "AdaPLD: + branches",
    "adapld": "AdaPLD: + history store (full)",
}
RETRIEVAL_KINDS = ("lexical", "semantic", "history", "none", "off")
RETRIEVAL_LABELS = {
    "lexical": "lexical (n-gram match)",
    "semantic": "semantic (similar window)",
    "history": "history (what the target wrote next in its own earlier replies)",
    "none": "none (no match)",
    "off": "off (source paused by the adaptive control)",
}
RETRIEVAL_COLORS = {"lexical": "#2563eb", "semantic": "#9333ea", "history": "#0d9488",
                    "none": "#94a3b8",
                    "off": "#f59e0b", "other": "#64748b"}
SOURCE_LABELS = {"lex1": "lexical, 1-gram", "lex2": "lexical, 2-gram",
                 "lex3": "lexical, n >= 3", "sem": "semantic, aligned on the last token",
                 "semfree": "semantic, free: no shared token",
                 "hist": "history store: the target's most frequent next token",
                 "open": "reply opening: how the target began replies to similar prompts",
                 "copy": "long copy: the span that was right last round, continued"}
_FONT = dict(family="Inter, system-ui, sans-serif", size=12, color="#1e293b")


# ---------------------------------------------------------------- basics
def is_adapld_trace(trace: Trace | None) -> bool:
    """True for a run of an AdaPLD method (by its meta, or its rounds' retrieval extras)."""
    if trace is None:
        return False
    if str(trace.meta.get("method") or "").lower() in ADAPLD_METHODS:
        return True
    return any(isinstance(r.extras, dict) and "retrieval" in r.extras for r in trace.rounds)


def chains_only(trace: Trace | None) -> str:
    """Why this run drew no token trees, when the reason is the target's numerics ('' else):
    under width-invariant padding only a tree's first branch is exact, so AdaPLD drafts chains
    (:func:`specviz.numerics.first_branch_only`)."""
    meta = trace.meta if trace is not None else {}
    if int(meta.get("min_width") or 1) <= 1:
        return ""
    return ("No token trees in this run: the target runs in bfloat16 with forwards padded to "
            f"{int(meta['min_width'])} tokens, where only a tree's first branch is verified "
            "exactly, so AdaPLD drafts its best branch alone (a second branch could never add a "
            "token). Run with float32 numerics (`--target-dtype float32`) to see branch trees.")


def node_branches(r: Round) -> list[int | None]:
    """For every draft node: the branch (hypothesis) that created it — the best-ranked branch
    whose tokens pass through it (branch 0 = the best-ranked match) — or None when unknown."""
    children = r.tree.children_map()
    out: list[int | None] = [None] * len(r.draft)
    matches = [m for m in round_matches(r) if m.get("branch") is not None]
    for m in sorted(matches, key=lambda m: int(m["branch"])):
        cur = -1
        for tok in m.get("tokens") or []:
            nxt = next((c for c in children.get(cur, []) if int(r.draft[c]) == int(tok)), None)
            if nxt is None:
                break
            if out[nxt] is None:
                out[nxt] = int(m["branch"])
            cur = nxt
    if r.parents is None and r.draft:  # a chain is branch 0
        out = [0 if b is None else b for b in out]
    return out


# ---------------------------------------------------------------- the round's matches
def matches_table(trace: Trace, round_index: int) -> pd.DataFrame:
    """The round's ranked matches: kind, span, copied range and text, score, drafted or not."""
    cols = ["rank", "kind", "drafted", "span", "ngram", "similarity", "score", "votes",
            "copy_from", "matched_text", "copied_text"]
    if not 0 <= round_index < len(trace.rounds):
        return pd.DataFrame(columns=cols)
    r = trace.rounds[round_index]
    ctx = round_context(trace, round_index)
    texts = trace.token_texts

    def txt(ids) -> str:
        return "".join(texts.get(int(t), f"<{t}>") for t in ids).replace("\n", "↵")

    rows = []
    for rank, m in enumerate(round_matches(r)):
        sp = span_of(m.get("span")) or (0, 0)
        cp = span_of(m.get("copy_from")) or (0, 0)
        rows.append({
            "rank": rank + 1, "kind": m.get("kind"),
            "drafted": f"branch {m['branch']}" if m.get("branch") is not None else "no",
            "span": f"{sp[0]}–{sp[1]}", "ngram": m.get("ngram"),
            "similarity": m.get("similarity"), "score": m.get("score"),
            "votes": m.get("votes"),
            "copy_from": "history store" if m.get("kind") == "history" else f"{cp[0]}–{cp[1]}",
            "matched_text": txt(ctx[sp[0]:sp[1]]),
            "copied_text": txt(m.get("tokens") or ctx[cp[0]:cp[1]]),
        })
    return pd.DataFrame(rows, columns=cols)


def retrieval_notes(trace: Trace, round_index: int) -> RoundNotes:
    """AdaPLD's parts of a round's sentence: the retrieval kind and source, the looked-up
    suffix, the matches, the draft's shape (chain / tree) and the adaptive control's state."""
    r = trace.rounds[round_index]
    ex = r.extras or {}
    esc = lambda ids: html.escape(join_tokens(ids, trace.token_texts))  # noqa: E731
    kind = retrieval_kind(r)
    src = ex.get("source")
    label = (f'<span style="color:#fff;background:{RETRIEVAL_COLORS.get(kind, "#64748b")};'
             f'border-radius:4px;padding:0 6px">{html.escape(kind)}</span>'
             + (f" <code>{html.escape(str(src))}</code>" if src else ""))
    draft = []
    sf = span_of(ex.get("suffix"))
    if sf:
        ctx = round_context(trace, round_index)
        draft.append(f"looked up the suffix <code>{esc(ctx[sf[0]:sf[1]])}</code>")
    ms = round_matches(r)
    if ms:
        used = sum(m.get("branch") is not None for m in ms)
        draft.append(f"{len(ms)} match(es) shown, {used} drafted")
    if r.draft:
        draft.append((f"tree: {ex.get('branches', '?')} branches, {len(r.draft)} nodes"
                      if r.parents is not None else f"chain of {len(r.draft)}")
                     + (" (probe)" if ex.get("probe") else ""))
    tail = []
    alpha = ex.get("alpha")
    if isinstance(alpha, (list, tuple)) and len(alpha) == 2:
        tail.append(f"estimates a1={float(alpha[0]):.2f}, a2={float(alpha[1]):.2f}")
    if ex.get("fallback_reason"):
        tail.append(f"<i>{html.escape(str(ex['fallback_reason']))}</i>")
    no_draft = {"none": "no match in the context", "off": "the source is paused (adaptive "
                "control) until its next probe"}.get(kind, "")
    return RoundNotes(label=label, draft=draft, no_draft=no_draft, tail=tail,
                      css_class="adapld-summary")


def round_summary_html(trace: Trace, round_index: int) -> str:
    """One sentence about what the AdaPLD drafter did in a round and how it went (the common
    round sentence, :func:`specviz.viz.rounds.round_summary_html`, plus the retrieval)."""
    if not 0 <= round_index < len(trace.rounds):
        return ""
    return _round_sentence(trace, round_index, retrieval_notes(trace, round_index))


# ---------------------------------------------------------------- branch tree
#: a DFlash + AdaPLD round's node sources (``extras["hybrid"]["source"]``), as hover notes
HYBRID_SOURCES = {"block": "drafted by the DFlash block", "lookup": "drafted by lookup",
                  "both": "drafted by the DFlash block and by lookup"}


def branch_tree_figure(trace: Trace, round_index: int, show_target: bool = True) -> go.Figure:
    """The round's draft tree (:func:`specviz.viz.tree.branch_tree_figure`) with AdaPLD's
    notes: each node's branch of origin on hover, the retrieval kind in the title."""
    if not 0 <= round_index < len(trace.rounds):
        return vt.branch_tree_figure(trace, round_index)
    r = trace.rounds[round_index]
    notes = [None if b is None else f"from branch {b}" + (" (best-ranked)" if b == 0 else "")
             for b in node_branches(r)]
    source = ((r.extras or {}).get("hybrid") or {}).get("source") or []
    if len(source) == len(notes):   # DFlash + AdaPLD: which drafter proposed each node
        notes = ["; ".join(x for x in (n, HYBRID_SOURCES.get(s)) if x)
                 for n, s in zip(notes, source)]
    kind = retrieval_kind(r)
    why = {"none": "no match", "off": "retrieval paused by the adaptive control"}.get(
        kind, "no draft")
    return vt.branch_tree_figure(trace, round_index, show_target, node_notes=notes,
                                 subtitle=f" · {kind}" if kind in RETRIEVAL_KINDS else "",
                                 empty_note=why)


# ---------------------------------------------------------------- retrieval over the run
def retrieval_counts(trace: Trace) -> dict[str, int]:
    """Rounds per retrieval kind: always lexical, semantic, none, off (others if present)."""
    out = {k: 0 for k in RETRIEVAL_KINDS}
    for r in trace.rounds:
        k = retrieval_kind(r)
        out[k] = out.get(k, 0) + 1
    return out


def retrieval_table(trace: Trace) -> pd.DataFrame:
    """Per retrieval source (lex1, lex2, lex3, sem, semfree, none, off): rounds, drafted and
    accepted tokens, how often the first drafted token was accepted, tree rounds, tau."""
    rows: dict[str, dict[str, Any]] = {}
    order = ["open", "copy", "lex3", "lex2", "lex1", "sem", "semfree", "hist", "none", "off"]
    for r in trace.rounds:
        kind = retrieval_kind(r)
        src = (r.extras or {}).get("source") if kind in ("lexical", "semantic", "history") \
            else kind
        src = src or kind
        d = rows.setdefault(src, {"source": src, "kind": kind,
                                  "what": SOURCE_LABELS.get(src, RETRIEVAL_LABELS.get(src, src)),
                                  "rounds": 0, "drafted": 0, "accepted": 0, "first_hits": 0,
                                  "drafted_rounds": 0, "tree_rounds": 0, "committed": 0})
        d["rounds"] += 1
        d["drafted"] += len(r.draft)
        d["accepted"] += int(r.accepted)
        d["committed"] += len(r.committed)
        if r.draft:
            d["drafted_rounds"] += 1
            d["first_hits"] += int(r.accepted >= 1)
        d["tree_rounds"] += int(r.parents is not None)
    out = []
    for src in sorted(rows, key=lambda s: order.index(s) if s in order else len(order)):
        d = rows[src]
        out.append({"source": d["source"], "kind": d["kind"], "what": d["what"],
                    "rounds": d["rounds"], "drafted": d["drafted"], "accepted": d["accepted"],
                    "first_token_hit": round(d["first_hits"] / d["drafted_rounds"], 3)
                    if d["drafted_rounds"] else None,
                    "tau": round(metrics.tau(d["committed"], d["rounds"]), 3),
                    "tree_rounds": d["tree_rounds"]})
    return pd.DataFrame(out, columns=["source", "kind", "what", "rounds", "drafted", "accepted",
                                      "first_token_hit", "tau", "tree_rounds"])


def default_round(trace: Trace) -> int:
    """The round (1-based) a page opens on: the last one that drafted something (its matches
    and copied tokens are what the page explains), else the last round."""
    drafted = [r.index + 1 for r in trace.rounds if r.draft]
    return drafted[-1] if drafted else max(1, trace.num_rounds)


def fig_retrieval(trace: Trace, selected_round: int | None = None) -> go.Figure:
    """Per round, a bar coloured by the retrieval kind, its height the tokens committed that
    round (accepted + the target's token); the legend gives the totals per kind."""
    fig = go.Figure()
    rounds = trace.rounds
    kinds = [retrieval_kind(r) for r in rounds]
    counts = retrieval_counts(trace)
    for k in list(RETRIEVAL_KINDS) + [k for k in counts if k not in RETRIEVAL_KINDS]:
        idx = [i for i, kk in enumerate(kinds) if kk == k]
        fig.add_bar(
            x=[rounds[i].index + 1 for i in idx] or [None],
            y=[len(rounds[i].committed) for i in idx] or [None],
            name=f"{k} ({counts.get(k, 0)})", marker_color=RETRIEVAL_COLORS.get(k, "#64748b"),
            customdata=[[rounds[i].accepted, len(rounds[i].draft),
                         (rounds[i].extras or {}).get("source") or "—",
                         "tree" if rounds[i].parents is not None else "chain"] for i in idx]
            or None,
            hovertemplate=(f"round %{{x}}: {k}" + " (%{customdata[2]}, %{customdata[3]}) · "
                           "drafted %{customdata[1]}, accepted %{customdata[0]}, "
                           "committed %{y}<extra></extra>") if idx else None,
            showlegend=True)
    fig.update_layout(barmode="stack")
    if selected_round is not None and 0 <= selected_round < len(rounds):
        x = rounds[selected_round].index + 1
        fig.add_vrect(x0=x - 0.5, x1=x + 0.5, fillcolor="#0f172a", opacity=0.08, line_width=0)
    fig.update_layout(
        title=dict(text="Where each round's draft came from (bar = tokens committed)", x=0.0,
                   xanchor="left", font=dict(size=14)),
        template="plotly_white", height=300, font=_FONT, margin=dict(l=50, r=15, t=60, b=45),
        bargap=0.15, xaxis_title="round", yaxis_title="tokens committed",
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0,
                    traceorder="normal"))
    if not rounds:
        fig.add_annotation(text="No rounds yet", showarrow=False, xref="paper", yref="paper",
                           x=0.5, y=0.5, font=dict(size=13, color="#94a3b8"))
    fig.update_yaxes(rangemode="tozero")
    return fig


def ablation_table(runs: list) -> pd.DataFrame:
    """The Compare summary (tau, forwards, wall time, speedup vs AR, identical to AR) of an
    ablation run, one row per variant in ladder order, with a readable label."""
    from .tables import compare_summary_table

    summary = compare_summary_table(runs)
    if summary.empty:
        return summary.assign(variant=[])
    order = list(ABLATION_LABELS)
    summary = summary.assign(
        variant=[ABLATION_LABELS.get(m, m) for m in summary["method"]],
        _o=[order.index(m) if m in order else len(order) for m in summary["method"]])
    summary = summary.sort_values("_o", kind="stable").drop(columns="_o")
    cols = ["variant"] + [c for c in summary.columns if c != "variant"]
    return summary[cols].reset_index(drop=True)


__all__ = ["ADAPLD_METHODS", "ABLATION_LABELS", "RETRIEVAL_KINDS", "ablation_table",
           "branch_tree_figure", "fig_retrieval", "is_adapld_trace", "matches_table",
           "node_branches", "retrieval_counts", "retrieval_table", "round_summary_html",
           "retrieval_notes"]
