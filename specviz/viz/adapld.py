"""Views of an AdaPLD run (METHODS §3): where each draft came from and what the target made of it.

Pure functions of a :class:`~specviz.trace.Trace` / :class:`~specviz.trace.Round` (no streamlit,
no model), read from the drafter's round extras (:meth:`AdaPLDDrafter._extras`):

* ``extras["retrieval"]`` — ``lexical`` | ``semantic`` | ``none`` | ``off`` (source switched off
  by the adaptive control), ``extras["source"]`` — ``lex1`` / ``lex2`` / ``lex3`` / ``sem`` /
  ``semfree``;
* ``extras["suffix"]`` — ``[start, end)`` of the context suffix that was looked up;
* ``extras["matches"]`` — ranked candidates, each with its matched ``span`` and the copied
  continuation ``copy_from`` (absolute positions into prompt_ids + output), ``score``, ``kind``
  and ``branch`` (its branch index in the draft, or None for a ranked alternative not drafted).

Functions:

* :func:`context_spans_html` — the round's context (prompt + generated tokens) with the matched
  spans (classes ``m-lex`` / ``m-sem``, opacity and a badge from the score), the looked-up suffix
  (``m-suffix``) and the copied continuations (``m-copy``) marked; :func:`context_tokens` gives
  the same as records.
* :func:`branch_tree_figure` — the draft tree (:mod:`specviz.viz.tree`) with each node's
  branch of origin (a chain is a one-branch tree).
* :func:`retrieval_counts`, :func:`retrieval_table`, :func:`fig_retrieval` — retrieval kinds over
  the run.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ..analysis import metrics
from ..drafters import AdaPLDDrafter, methods_of
from ..trace import Round, Trace
from .rounds import RoundNotes
from .rounds import round_summary_html as _round_sentence
from .tables import join_tokens
from . import tree as vt
from .tokens import visible_text

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
_RGB = {"lexical": (37, 99, 235), "semantic": (147, 51, 234)}
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


def round_context(trace: Trace, round_index: int) -> list[int]:
    """The context the drafter saw in round ``round_index``: prompt + everything committed before
    it (absolute positions, as in the extras)."""
    ctx = [int(t) for t in trace.prompt_ids]
    for r in trace.rounds[:round_index]:
        ctx.extend(int(t) for t in r.committed)
    return ctx


def node_branches(r: Round) -> list[int | None]:
    """For every draft node: the branch (hypothesis) that created it — the best-ranked branch
    whose tokens pass through it (branch 0 = the best-ranked match) — or None when unknown."""
    children = r.tree.children_map()
    out: list[int | None] = [None] * len(r.draft)
    matches = [m for m in _matches(r) if m.get("branch") is not None]
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


def _matches(r: Round) -> list[dict]:
    ms = (r.extras or {}).get("matches") or []
    return [m for m in ms if isinstance(m, dict)]


def _span(v) -> tuple[int, int] | None:
    try:
        a, b = int(v[0]), int(v[1])
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    return (a, b) if b > a else None


def retrieval_kind(r: Round) -> str:
    """The round's retrieval kind: lexical | semantic | none | off (``other`` for non-AdaPLD)."""
    k = (r.extras or {}).get("retrieval") if isinstance(r.extras, dict) else None
    return "other" if not k else str(k)


# ---------------------------------------------------------------- context with matches
@dataclass
class ContextToken:
    """One context token of a round and what the drafter did with it."""

    position: int
    token_id: int
    text: str
    output: bool                    # generated (not part of the prompt)
    kind: str | None = None         # lexical | semantic: inside a matched span
    match: int | None = None        # rank (0 = best) of the best match covering it
    score: float | None = None
    used: bool = False              # that match was drafted (a branch), not just ranked
    copy: int | None = None         # rank of the best match whose continuation was copied here
    copy_used: bool = False
    suffix: bool = False            # part of the looked-up suffix
    badges: list[tuple[str, int, dict]] = field(default_factory=list)  # (role, rank, match)

    @property
    def css_class(self) -> str:
        cls = ["ctx-tok"]
        if self.output:
            cls.append("ctx-out")
        if self.kind:
            cls.append("m-lex" if self.kind == "lexical" else "m-sem")
            if not self.used:
                cls.append("m-alt")
        if self.copy is not None:
            cls.append("m-copy" if self.copy_used else "m-copy-alt")
        if self.suffix:
            cls.append("m-suffix")
        return " ".join(cls)


def _mark(toks: list[ContextToken], span, fields: tuple, values: tuple, badge) -> None:
    """Give the tokens of ``span`` a match's ``fields`` = ``values`` unless a drafted match
    already holds them (drafted matches win over alternatives; among equals the better rank,
    listed first); ``badge`` goes on the span's first token."""
    if not span:
        return
    a, b = max(0, span[0]), min(len(toks), span[1])
    for t in toks[a:b]:
        if getattr(t, fields[0]) is None or (values[-1] and not getattr(t, fields[-1])):
            for f, v in zip(fields, values):
                setattr(t, f, v)
    if a < b and badge:
        toks[a].badges.append(badge)


def context_tokens(trace: Trace, round_index: int) -> list[ContextToken]:
    """The round's context as records, each token tagged with the match / copy / suffix roles."""
    if not 0 <= round_index < len(trace.rounds):
        return []
    r = trace.rounds[round_index]
    ctx = round_context(trace, round_index)
    L = len(ctx)
    prompt_len = len(trace.prompt_ids)
    texts = trace.token_texts
    toks = [ContextToken(p, t, texts.get(t, f"<{t}>"), p >= prompt_len)
            for p, t in enumerate(ctx)]
    for rank, m in enumerate(_matches(r)):
        used = m.get("branch") is not None
        kind = "semantic" if m.get("kind") == "semantic" else "lexical"
        try:
            score = float(m.get("score"))
        except (TypeError, ValueError):
            score = None
        _mark(toks, _span(m.get("span")), ("kind", "match", "score", "used"),
              (kind, rank, score, used), ("match", rank, m))
        _mark(toks, _span(m.get("copy_from")), ("copy", "copy_used"), (rank, used),
              ("copy", rank, m) if used else None)
    sf = _span((r.extras or {}).get("suffix"))
    if sf:
        for p in range(max(0, sf[0]), min(L, sf[1])):
            toks[p].suffix = True
    return toks


CONTEXT_CSS = """
<style>
.adapld-ctx{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:0.84rem;
 line-height:2.15;padding:0.7rem 0.8rem;border:1px solid #e2e8f0;border-radius:0.5rem;
 background:#ffffff;max-height:24rem;overflow-y:auto;word-break:break-word;color:#475569;}
.adapld-ctx .ctx-tok{white-space:pre-wrap;padding:2px 0;}
.adapld-ctx .ctx-out{color:#0f172a;}
.adapld-ctx .m-lex,.adapld-ctx .m-sem{color:#0f172a;}
.adapld-ctx .m-copy{border-bottom:3px solid #059669;}
.adapld-ctx .m-copy-alt{border-bottom:2px dotted #6ee7b7;}
.adapld-ctx .m-suffix{box-shadow:inset 0 2px 0 #d97706,inset 0 -2px 0 #d97706;
 background:#fef3c7;color:#78350f;font-weight:600;}
.adapld-ctx .badge{display:inline-block;font-family:Inter,system-ui,sans-serif;font-size:0.62rem;
 line-height:1.2;padding:0 4px;margin:0 2px;border-radius:999px;vertical-align:super;
 color:#fff;font-weight:600;}
.adapld-ctx .badge.b-lex{background:#2563eb;}
.adapld-ctx .badge.b-sem{background:#9333ea;}
.adapld-ctx .badge.b-alt{background:#94a3b8;}
.adapld-ctx .badge.b-copy{background:#059669;}
.adapld-ctx .badge.b-suffix{background:#d97706;}
.adapld-ctx .ctx-gap{display:inline-block;color:#94a3b8;font-style:italic;font-size:0.76rem;
 border:1px dashed #e2e8f0;border-radius:4px;padding:0 6px;margin:0 3px;line-height:1.5;}
.adapld-ctx .ctx-boundary{display:inline-block;font-family:Inter,system-ui,sans-serif;
 font-size:0.66rem;color:#fff;background:#334155;border-radius:3px;padding:0 5px;margin:0 4px;
 line-height:1.5;vertical-align:middle;}
.adapld-ctx .ctx-next{display:inline-block;margin-left:6px;padding:0 6px;border:1px dashed #059669;
 border-radius:4px;color:#065f46;background:#ecfdf5;line-height:1.5;}
.adapld-legend{display:flex;flex-wrap:wrap;gap:0.35rem 1.1rem;font-size:0.8rem;color:#334155;
 margin:0.2rem 0 0.45rem 0;align-items:center;}
.adapld-legend .sw{display:inline-block;min-width:1.6em;text-align:center;margin-right:0.35rem;
 font-family:ui-monospace,monospace;border-radius:3px;line-height:1.45;padding:0 3px;}
</style>
"""


def _badge_html(role: str, rank: int, m: dict) -> str:
    kind = "semantic" if m.get("kind") == "semantic" else "lexical"
    used = m.get("branch") is not None
    k = "S" if kind == "semantic" else "L"
    if role == "copy":
        title = f"copied continuation of match #{rank + 1} (drafted as branch {m.get('branch')})"
        return (f'<span class="badge b-copy" title="{html.escape(title)}">copy #{rank + 1}'
                f'</span>')
    score = m.get("score")
    detail = [f"match #{rank + 1}: {kind}"]
    if kind == "lexical" and m.get("ngram"):
        detail.append(f"{m.get('ngram')}-gram")
    if m.get("similarity") is not None:
        detail.append(f"cosine {float(m['similarity']):.3f}")
    if score is not None:
        detail.append(f"score {float(score):.3f}")
    if m.get("votes"):
        detail.append(f"votes {m.get('votes')}")
    detail.append("drafted (branch %s)" % m.get("branch") if used else
                  "ranked alternative, not drafted")
    cls = ("b-sem" if kind == "semantic" else "b-lex") if used else "b-alt"
    s = f" {float(score):.2f}" if score is not None else ""
    return (f'<span class="badge {cls}" title="{html.escape(" · ".join(detail))}">'
            f'{k}{rank + 1}{s}</span>')


def _token_html(t: ContextToken) -> str:
    style = ""
    if t.kind and not t.suffix:
        r_, g_, b_ = _RGB[t.kind]
        s = 0.5 if t.score is None else min(max(t.score, 0.0), 1.0)
        alpha = (0.10 + 0.40 * s) * (1.0 if t.used else 0.55)
        style = f' style="background:rgba({r_},{g_},{b_},{alpha:.2f})"'
    title = [f"position {t.position} ({'output' if t.output else 'prompt'})",
             f"token {t.token_id}: {t.text!r}"]
    if t.kind:
        title.append(f"in {t.kind} match #{t.match + 1}"
                     + (f" (score {t.score:.3f})" if t.score is not None else "")
                     + ("" if t.used else ", not drafted"))
    if t.copy is not None:
        title.append(f"copied as the draft of match #{t.copy + 1}" if t.copy_used else
                     f"continuation of match #{t.copy + 1} (not drafted)")
    if t.suffix:
        title.append("looked-up suffix")
    tt = html.escape("\n".join(title), quote=True).replace("\n", "&#10;")
    out = "".join(_badge_html(role, rank, m) for role, rank, m in t.badges)
    out += (f'<span class="{t.css_class}"{style} title="{tt}" data-pos="{t.position}">'
            f'{visible_text(t.text)}</span>')
    if "\n" in t.text:
        out += "<br>"
    return out


def context_spans_html(trace: Trace, round_index: int, collapse: int | None = None,
                       include_css: bool = True, show_draft: bool = True) -> str:
    """The context of round ``round_index`` as HTML with the drafter's matches marked.

    Classes: ``m-lex`` / ``m-sem`` (a matched span; background opacity grows with the score,
    ``m-alt`` when the match was ranked but not drafted; a badge ``L1 0.62`` / ``S2 0.94`` shows
    its rank and score), ``m-copy`` (the copied continuation of a drafted match), ``m-suffix``
    (the looked-up suffix), ``ctx-out`` (generated tokens). ``collapse=k`` elides runs of
    unmarked tokens farther than k tokens from any mark; ``show_draft`` appends the round's
    best-ranked draft after the context."""
    css = CONTEXT_CSS if include_css else ""
    if not 0 <= round_index < len(trace.rounds):
        return css + '<div class="adapld-ctx"><i>No such round.</i></div>'
    r = trace.rounds[round_index]
    toks = context_tokens(trace, round_index)
    L = len(toks)
    prompt_len = len(trace.prompt_ids)
    keep = [True] * L
    if collapse is not None and L:
        k = max(0, int(collapse))
        marked = [i for i, t in enumerate(toks) if t.kind or t.copy is not None or t.suffix]
        marked += [L - 1, prompt_len - 1, prompt_len]
        keep = [False] * L
        for i in marked:
            for j in range(max(0, i - k), min(L, i + k + 1)):
                keep[j] = True
    parts = [css, '<div class="adapld-ctx">']
    i = 0
    while i < L:
        if i == prompt_len and prompt_len > 0:
            parts.append('<span class="ctx-boundary" title="the generated output starts here">'
                         'output ▸</span>')
        if not keep[i]:
            j = i
            while j < L and not keep[j] and not (j == prompt_len and j > i):
                j += 1
            parts.append(f'<span class="ctx-gap" title="positions {i}–{j - 1}">… {j - i} '
                         f'token{"s" if j - i != 1 else ""} …</span>')
            i = j
            continue
        parts.append(_token_html(toks[i]))
        i += 1
    if not L:
        parts.append('<i>empty context</i>')
    if show_draft:
        kind = retrieval_kind(r)
        if r.draft:
            parents = r.tree.parents
            first = [0]
            while first[-1] + 1 < len(parents) and parents[first[-1] + 1] == first[-1]:
                first.append(first[-1] + 1)
            txt = "".join(visible_text(trace.token_texts.get(int(r.draft[n]), f"<{r.draft[n]}>"))
                          for n in first)
            more = f" (+{len(r.draft) - len(first)} more in other branches)" \
                if len(first) < len(r.draft) else ""
            parts.append(f'<span class="ctx-next" title="the draft of this round (best-ranked '
                         f'branch){html.escape(more)}">draft ▸ {txt}</span>')
        else:
            why = {"none": "no match", "off": "retrieval paused"}.get(kind, "no draft")
            parts.append(f'<span class="ctx-next" style="border-color:#94a3b8;color:#475569;'
                         f'background:#f8fafc">no draft ({why})</span>')
    parts.append("</div>")
    return "".join(parts)


def context_legend_html(include_css: bool = False) -> str:
    """Legend for :func:`context_spans_html`."""
    items = [
        ('<span class="sw" style="background:rgba(37,99,235,0.4)">ab</span>',
         "lexical match (darker = higher score)"),
        ('<span class="sw" style="background:rgba(147,51,234,0.4)">ab</span>',
         "semantic match (similar window)"),
        ('<span class="sw" style="background:rgba(37,99,235,0.16)">ab</span>'
         '<span class="sw" style="background:#94a3b8;color:#fff;border-radius:999px;'
         'font-size:0.7em">L3</span>', "ranked alternative, not drafted"),
        ('<span class="sw" style="border-bottom:3px solid #059669">ab</span>',
         "copied continuation (the draft)"),
        ('<span class="sw" style="box-shadow:inset 0 2px 0 #d97706,inset 0 -2px 0 #d97706;'
         'background:#fef3c7">ab</span>', "looked-up suffix"),
    ]
    parts = [CONTEXT_CSS if include_css else "", '<div class="adapld-legend">']
    for sw, label in items:
        parts.append(f"<span>{sw}{html.escape(label)}</span>")
    parts.append("<span>badges: L/S + rank + score · hover a token for details</span></div>")
    return "".join(parts)


# ---------------------------------------------------------------- round summary, matches
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
    for rank, m in enumerate(_matches(r)):
        sp = _span(m.get("span")) or (0, 0)
        cp = _span(m.get("copy_from")) or (0, 0)
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
    sf = _span(ex.get("suffix"))
    if sf:
        ctx = round_context(trace, round_index)
        draft.append(f"looked up the suffix <code>{esc(ctx[sf[0]:sf[1]])}</code>")
    ms = _matches(r)
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
    and copied continuation are what the page explains), else the last round."""
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


__all__ = ["ADAPLD_METHODS", "ABLATION_LABELS", "RETRIEVAL_KINDS", "ContextToken",
           "ablation_table", "branch_tree_figure", "context_legend_html", "context_spans_html",
           "context_tokens", "fig_retrieval", "is_adapld_trace", "matches_table", "node_branches",
           "retrieval_counts", "retrieval_kind", "retrieval_table",
           "round_context", "round_summary_html", "retrieval_notes"]
