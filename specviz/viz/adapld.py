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
* :func:`node_status` — accepted / rejected / unreached for every draft node;
  :func:`branch_tree_figure` — the draft tree in Plotly (a chain is a one-branch tree).
* :func:`retrieval_counts`, :func:`retrieval_table`, :func:`fig_retrieval` — retrieval kinds over
  the run.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ..trace import Round, Trace
from .tokens import visible_text

ADAPLD_METHODS = ("adapld", "adapld_sem", "adapld_lex")
#: ablation ladder shown on the page: method -> label
ABLATION_LABELS = {
    "ar": "AR (plain decoding, baseline)",
    "pld": "PLD (prompt lookup, reference)",
    "adapld_lex": "AdaPLD: lexical only",
    "adapld_sem": "AdaPLD: + semantic",
    "adapld": "AdaPLD: + branches (full)",
}
RETRIEVAL_KINDS = ("lexical", "semantic", "none", "off")
RETRIEVAL_LABELS = {
    "lexical": "lexical (n-gram match)",
    "semantic": "semantic (similar window)",
    "none": "none (no match)",
    "off": "off (source paused by the adaptive control)",
}
RETRIEVAL_COLORS = {"lexical": "#2563eb", "semantic": "#9333ea", "none": "#94a3b8",
                    "off": "#f59e0b", "other": "#64748b"}
SOURCE_LABELS = {"lex1": "lexical, 1-gram", "lex2": "lexical, 2-gram",
                 "lex3": "lexical, n >= 3", "sem": "semantic, aligned on the last token",
                 "semfree": "semantic, free: no shared token"}
STATUS_COLORS = {  # box fill, border (token colours of specviz.viz.tokens)
    "accepted": ("#d1fae5", "#059669"),
    "rejected": ("#fee2e2", "#dc2626"),
    "unreached": ("#f8fafc", "#cbd5e1"),
    "root": ("#e2e8f0", "#334155"),
    "correction": ("#fef3c7", "#d97706"),
    "bonus": ("#dbeafe", "#2563eb"),
}
STATUS_LABELS = {"accepted": "accepted", "rejected": "rejected (tried, target disagreed)",
                 "unreached": "not reached (below a rejected node)",
                 "root": "root: last committed token"}
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


def is_sampling(trace: Trace) -> bool:
    settings = trace.meta.get("settings") or {}
    try:
        return float(settings.get("temperature") or 0.0) > 0.0
    except (TypeError, ValueError):
        return False


def round_context(trace: Trace, round_index: int) -> list[int]:
    """The context the drafter saw in round ``round_index``: prompt + everything committed before
    it (absolute positions, as in the extras)."""
    ctx = [int(t) for t in trace.prompt_ids]
    for r in trace.rounds[:round_index]:
        ctx.extend(int(t) for t in r.committed)
    return ctx


def _parents(r: Round) -> list[int]:
    if r.parents is not None:
        return [int(p) for p in r.parents]
    return list(range(-1, len(r.draft) - 1))


def _path(r: Round) -> list[int]:
    n = len(r.draft)
    if r.parents is not None:
        return [int(x) for x in r.accepted_path if 0 <= int(x) < n]
    return list(range(min(int(r.accepted), n)))


def node_depths(r: Round) -> list[int]:
    """Depth of each draft node (the root's children have depth 1)."""
    d: list[int] = []
    for p in _parents(r):
        d.append(1 if p < 0 or p >= len(d) else d[p] + 1)
    return d


def node_status(r: Round, sampling: bool = False) -> list[str]:
    """``accepted`` / ``rejected`` / ``unreached`` for every draft node of round ``r``.

    Accepted: on the accepted path (a tree's ``accepted_path``; the first ``accepted`` tokens of
    a chain). Rejected: a child of the root or of an accepted node that is not accepted itself —
    the target reached its position and disagreed (for a chain: the first token after the
    accepted prefix). Unreached: every node below a rejected one (never checked). With
    ``sampling=True`` children are tried in order (SpecInfer), so siblings listed after the
    accepted child were never tried and count as unreached."""
    parents = _parents(r)
    path = _path(r)
    on_path = set(path)
    tried = {-1} | on_path
    accepted_child = {}
    for node in path:
        accepted_child[parents[node]] = node
    out = []
    for i, p in enumerate(parents):
        if i in on_path:
            out.append("accepted")
        elif p in tried and not (sampling and p in accepted_child and i > accepted_child[p]):
            out.append("rejected")
        else:
            out.append("unreached")
    return out


def node_branches(r: Round) -> list[int | None]:
    """For every draft node: the branch (hypothesis) that created it — the best-ranked branch
    whose tokens pass through it (branch 0 = the best-ranked match) — or None when unknown."""
    parents = _parents(r)
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    out: list[int | None] = [None] * len(parents)
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
        sp = _span(m.get("span"))
        if sp:
            a, b = max(0, sp[0]), min(L, sp[1])
            for p in range(a, b):
                t = toks[p]
                # used matches win over alternatives; among equals the better rank (listed first)
                if t.kind is None or (used and not t.used):
                    t.kind, t.match, t.score, t.used = kind, rank, score, used
            if a < b:
                toks[a].badges.append(("match", rank, m))
        cp = _span(m.get("copy_from"))
        if cp:
            a, b = max(0, cp[0]), min(L, cp[1])
            for p in range(a, b):
                t = toks[p]
                if t.copy is None or (used and not t.copy_used):
                    t.copy, t.copy_used = rank, used
            if a < b and used:
                toks[a].badges.append(("copy", rank, m))
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
            parents = _parents(r)
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
            "votes": m.get("votes"), "copy_from": f"{cp[0]}–{cp[1]}",
            "matched_text": txt(ctx[sp[0]:sp[1]]),
            "copied_text": txt(m.get("tokens") or ctx[cp[0]:cp[1]]),
        })
    return pd.DataFrame(rows, columns=cols)


def round_summary_html(trace: Trace, round_index: int) -> str:
    """One sentence about what the AdaPLD drafter did in a round and how it went."""
    if not 0 <= round_index < len(trace.rounds):
        return ""
    r = trace.rounds[round_index]
    ex = r.extras or {}
    texts = trace.token_texts
    esc = lambda ids: html.escape("".join(texts.get(int(t), f"<{t}>") for t in ids)  # noqa
                                  .replace("\n", "↵"))
    kind = retrieval_kind(r)
    color = RETRIEVAL_COLORS.get(kind, "#64748b")
    src = ex.get("source")
    parts = [f"<b>Round {r.index + 1}</b>",
             f'<span style="color:#fff;background:{color};border-radius:4px;padding:0 6px">'
             f"{html.escape(kind)}</span>"
             + (f" <code>{html.escape(str(src))}</code>" if src else "")]
    sf = _span(ex.get("suffix"))
    if sf:
        ctx = round_context(trace, round_index)
        parts.append(f"looked up the suffix <code>{esc(ctx[sf[0]:sf[1]])}</code>")
    ms = _matches(r)
    if ms:
        used = sum(m.get("branch") is not None for m in ms)
        parts.append(f"{len(ms)} match(es) shown, {used} drafted")
    if r.draft:
        shape = (f"tree: {ex.get('branches', '?')} branches, {len(r.draft)} nodes"
                 if r.parents is not None else f"chain of {len(r.draft)}")
        parts.append(shape + (" (probe)" if ex.get("probe") else ""))
        parts.append(f"accepted <b>{r.accepted}</b>")
        tt = r.target_token
        if tt >= 0:
            label = "bonus" if r.accepted >= max(node_depths(r), default=0) else "correction"
            parts.append(f"target's {label}: <code>{esc([tt])}</code>")
    else:
        why = {"none": "no match in the context", "off": "the source is paused (adaptive "
               "control) until its next probe"}.get(kind, "no draft")
        parts.append(f"no draft ({why}); the target generated <code>{esc(r.committed[:1])}"
                     "</code> itself")
    alpha = ex.get("alpha")
    if isinstance(alpha, (list, tuple)) and len(alpha) == 2:
        parts.append(f"estimates a1={float(alpha[0]):.2f}, a2={float(alpha[1]):.2f}")
    if ex.get("fallback_reason"):
        parts.append(f"<i>{html.escape(str(ex['fallback_reason']))}</i>")
    return ('<div class="adapld-summary" style="font-size:0.9rem;color:#1e293b;background:#f8fafc;'
            'border:1px solid #e2e8f0;border-radius:0.5rem;padding:0.45rem 0.7rem;'
            'margin:0.3rem 0 0.6rem 0;">' + " · ".join(parts) + "</div>")


# ---------------------------------------------------------------- branch tree
def tree_layout(r: Round) -> tuple[list[int], list[float]]:
    """(x = depth, y = row) for every draft node: leaves take consecutive rows in depth-first
    order (the best-ranked branch first, on top), a parent sits level with its first child."""
    parents = _parents(r)
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    depth = node_depths(r)
    y: list[float] = [0.0] * len(parents)
    row = [0]

    def place(node: int) -> float:
        kids = children.get(node, [])
        if not kids:
            yy = float(row[0])
            row[0] += 1
        else:
            ys = [place(c) for c in kids]
            yy = ys[0]
        if node >= 0:
            y[node] = yy
        return yy

    place(-1)  # recursion depth <= draft depth (max_draft <= 64)
    return depth, y


def _short(text: str, n: int = 14) -> str:
    s = text.replace("\n", "↵").replace("\t", "⇥").replace("\r", "")
    if s == "":
        s = "∅"
    if s.strip() == "":
        s = s.replace(" ", "␣")
    return s if len(s) <= n else s[:n - 1] + "…"


def branch_tree_figure(trace: Trace, round_index: int, show_target: bool = True) -> go.Figure:
    """The round's draft as a tree (Plotly): nodes are draft tokens (boxes with their text),
    edges parent → child, the root is the last committed token. Colours: accepted (green, its
    path drawn bold), rejected (red), not reached (grey). The target's own token (correction or
    bonus) hangs off the last accepted node on a dotted edge. A chain is a one-branch tree."""
    fig = go.Figure()
    if not 0 <= round_index < len(trace.rounds):
        return _tree_layout(fig, "No such round", 1, 1, 200)
    r = trace.rounds[round_index]
    texts = trace.token_texts
    ctx = round_context(trace, round_index)
    root_tok = ctx[-1] if ctx else None
    parents = _parents(r)
    n = len(parents)
    status = node_status(r, sampling=is_sampling(trace))
    branches = node_branches(r)
    depth, ys = tree_layout(r)
    rows = (max(ys) + 1) if ys else 1
    path = _path(r)
    on_path = set(path)
    last = path[-1] if path else -1
    xs = [float(d) for d in depth]
    y_of = lambda node: 0.0 if node < 0 else ys[node]  # noqa: E731
    x_of = lambda node: 0.0 if node < 0 else xs[node]  # noqa: E731

    # edges: plain, accepted path (bold)
    ex_, ey_, ax_, ay_ = [], [], [], []
    for i, p in enumerate(parents):
        seg_x, seg_y = [x_of(p), x_of(p) + 0.5, x_of(p) + 0.5, xs[i], None], \
            [y_of(p), y_of(p), ys[i], ys[i], None]
        if i in on_path and (p < 0 or p in on_path):
            ax_ += seg_x
            ay_ += seg_y
        else:
            ex_ += seg_x
            ey_ += seg_y
    fig.add_scatter(x=ex_, y=ey_, mode="lines", line=dict(color="#94a3b8", width=1.5),
                    hoverinfo="skip", showlegend=False)
    fig.add_scatter(x=ax_, y=ay_, mode="lines", line=dict(color="#059669", width=5),
                    hoverinfo="skip", name="accepted path", showlegend=bool(ax_))

    # the target's own token
    tgt = None
    tt = r.target_token
    if show_target and tt >= 0:
        kind = "bonus" if r.draft and r.accepted >= max(depth, default=0) else \
            ("correction" if r.draft else "bonus")
        label = "target's token (no draft)" if not r.draft else f"target's {kind} token"
        tx = x_of(last) + 1
        kids_of_last = [i for i, p in enumerate(parents) if p == last]
        ty = y_of(last) if not kids_of_last else float(rows)
        if kids_of_last:
            rows += 1
        tgt = (tx, ty, kind, label)
        fig.add_scatter(x=[x_of(last), x_of(last) + 0.5, x_of(last) + 0.5, tx],
                        y=[y_of(last), y_of(last), ty, ty], mode="lines",
                        line=dict(color=STATUS_COLORS[kind][1], width=2, dash="dot"),
                        hoverinfo="skip", showlegend=False)

    # hover markers (under the boxes) and legend entries
    def node_hover(i: int) -> str:
        tok = int(r.draft[i])
        lines = [f"node {i} · depth {depth[i]} · {STATUS_LABELS[status[i]]}",
                 f"token {tok}: {texts.get(tok, '')!r}"]
        if branches[i] is not None:
            lines.append(f"from branch {branches[i]}" + (" (best-ranked)" if branches[i] == 0
                                                         else ""))
        if i < len(r.p_draft):
            lines.append(f"target prob of this token: {float(r.p_draft[i]):.3f}")
        row = (parents[i] + 1) if r.parents is not None else i
        if status[i] == "rejected" and row < len(r.target_argmax):
            want = int(r.target_argmax[row])
            lines.append(f"target's top token here: {texts.get(want, '')!r}")
        return "<br>".join(html.escape(s) for s in lines)

    for st_ in ("accepted", "rejected", "unreached"):
        idx = [i for i in range(n) if status[i] == st_]
        fill, line = STATUS_COLORS[st_]
        fig.add_scatter(
            x=[xs[i] for i in idx] or [None], y=[ys[i] for i in idx] or [None], mode="markers",
            marker=dict(symbol="square", size=16, color=fill, line=dict(color=line, width=2)),
            name=f"{STATUS_LABELS[st_].split(' (')[0]} ({len(idx)})",
            hovertext=[node_hover(i) for i in idx], hoverinfo="text",
            showlegend=True)
    fig.add_scatter(x=[0.0], y=[0.0], mode="markers", showlegend=False, hoverinfo="text",
                    hovertext=[html.escape(f"root: last committed token "
                                           f"{texts.get(root_tok, '')!r} (position "
                                           f"{len(ctx) - 1})")],
                    marker=dict(symbol="square", size=16, color=STATUS_COLORS["root"][0]))
    if tgt is not None:
        fill, line = STATUS_COLORS[tgt[2]]
        fig.add_scatter(x=[tgt[0]], y=[tgt[1]], mode="markers", name=tgt[3],
                        marker=dict(symbol="square", size=16, color=fill,
                                    line=dict(color=line, width=2)),
                        hoverinfo="text",
                        hovertext=[html.escape(f"{tgt[3]}: {texts.get(tt, '')!r}")])

    # token boxes
    def box(x, y, text, fill, line, width=1.5, bold=False):
        fig.add_annotation(x=x, y=y, text=("<b>%s</b>" % html.escape(text)) if bold
                           else html.escape(text), showarrow=False, bgcolor=fill,
                           bordercolor=line, borderwidth=width, borderpad=4,
                           font=dict(family="ui-monospace, Menlo, Consolas, monospace", size=12,
                                     color="#0f172a"))

    box(0.0, 0.0, _short(texts.get(root_tok, "") if root_tok is not None else "root"),
        *STATUS_COLORS["root"], width=2)
    for i in range(n):
        fill, line = STATUS_COLORS[status[i]]
        box(xs[i], ys[i], _short(texts.get(int(r.draft[i]), f"<{r.draft[i]}>")), fill, line,
            width=2.5 if status[i] == "accepted" else 1.5, bold=status[i] == "accepted")
    if tgt is not None:
        fill, line = STATUS_COLORS[tgt[2]]
        box(tgt[0], tgt[1], _short(texts.get(tt, f"<{tt}>")), fill, line, width=2)

    kind = retrieval_kind(r)
    if not r.draft:
        why = {"none": "no match", "off": "retrieval paused by the adaptive control"}.get(
            kind, "no draft")
        fig.add_annotation(text=f"No draft this round ({why}): the target made one token",
                           x=0.5, y=1.0 if rows <= 1 else 0.5, xref="x domain", yref="paper",
                           showarrow=False, font=dict(size=12, color="#64748b"), yanchor="top")
    shape = "tree" if r.parents is not None else "chain"
    title = (f"Round {r.index + 1}: draft {shape} · {n} node{'s' if n != 1 else ''}"
             f" · {len(path)} accepted" + (f" · {kind}" if kind in RETRIEVAL_KINDS else ""))
    max_x = max([0.0] + xs + ([tgt[0]] if tgt else []))
    return _tree_layout(fig, title, max_x, rows, max(220, 70 + 48 * rows))


def _tree_layout(fig: go.Figure, title: str, max_x: float, rows: float, height: int
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
    order = ["lex3", "lex2", "lex1", "sem", "semfree", "none", "off"]
    for r in trace.rounds:
        kind = retrieval_kind(r)
        src = (r.extras or {}).get("source") if kind in ("lexical", "semantic") else kind
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
                    "tau": round((d["accepted"] + d["rounds"]) / d["rounds"], 3),
                    "tree_rounds": d["tree_rounds"]})
    return pd.DataFrame(out, columns=["source", "kind", "what", "rounds", "drafted", "accepted",
                                      "first_token_hit", "tau", "tree_rounds"])


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


#: sidebar help for the AdaPLD settings (specviz.drafters.METHOD_PARAMS); ranges are the
#: drafter's own checks
PARAM_HELP = {
    "max_ngram": "Longest suffix n-gram looked up (1-16). The longest one found earlier in "
                 "prompt + output wins.",
    "min_ngram": "Shortest suffix n-gram looked up (1..max ngram).",
    "max_draft": "Longest draft (tokens in the best branch, 1-64); the adaptive control picks "
                 "the length up to this.",
    "max_branches": "Most hypotheses merged into the draft tree (1-16); 1 = always a chain.",
    "node_budget": "Most nodes in a draft tree (1-256): all branches together, verified in one "
                   "target forward.",
    "semantic": "Semantic retrieval when lexical matching finds < 2 tokens: target_embed "
                "(the target's own embeddings, free), minilm (needs the MiniLM package) or off.",
    "window": "Tokens per window compared by semantic retrieval (2-64).",
    "adaptive": "Adapt draft length and branch count to the recent acceptance of each retrieval "
                "source, and pause sources that do not pay.",
    "cost": "Verify-cost model for the adaptive control: cpu (longer drafts cost more) or flat "
            "(accelerators).",
}


__all__ = ["ADAPLD_METHODS", "ABLATION_LABELS", "RETRIEVAL_KINDS", "ContextToken",
           "ablation_table", "branch_tree_figure", "context_legend_html", "context_spans_html",
           "context_tokens", "fig_retrieval", "is_adapld_trace", "matches_table", "node_branches",
           "node_depths", "node_status", "retrieval_counts", "retrieval_kind", "retrieval_table",
           "round_context", "round_summary_html", "tree_layout", "PARAM_HELP"]
