"""The context an AdaPLD round looked up, drawn (docs/methods/adapld.md): matched spans, the
looked-up suffix and the copied tokens, as records and as HTML (the AdaPLD page's context
view).

Pure functions of a :class:`~specviz.trace.Trace` (no streamlit, no model), read from the
drafter's round extras (``retrieval``, ``suffix``, ``matches``: see :mod:`specviz.viz.adapld`).
Positions are absolute: prompt_ids + everything committed before the round.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

from ..trace import Round, Trace
from .tokens import visible_text

_RGB = {"lexical": (37, 99, 235), "semantic": (147, 51, 234)}


def round_context(trace: Trace, round_index: int) -> list[int]:
    """The context the drafter saw in round ``round_index``: prompt + everything committed before
    it (absolute positions, as in the extras)."""
    ctx = [int(t) for t in trace.prompt_ids]
    for r in trace.rounds[:round_index]:
        ctx.extend(int(t) for t in r.committed)
    return ctx



def round_matches(r: Round) -> list[dict]:
    """The lookup matches a round recorded (extras ``matches``), well-formed ones only."""
    ms = (r.extras or {}).get("matches") or []
    return [m for m in ms if isinstance(m, dict)]


def span_of(v) -> tuple[int, int] | None:
    """A recorded [start, end) span as a pair of ints; None when malformed or empty."""
    try:
        a, b = int(v[0]), int(v[1])
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    return (a, b) if b > a else None


def retrieval_kind(r: Round) -> str:
    """The round's retrieval kind: lexical | semantic | none | off (``other`` for non-AdaPLD)."""
    k = (r.extras or {}).get("retrieval") if isinstance(r.extras, dict) else None
    return "other" if not k else str(k)


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
    copy: int | None = None         # rank of the best match whose copy landed here
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
    for rank, m in enumerate(round_matches(r)):
        used = m.get("branch") is not None
        kind = "semantic" if m.get("kind") == "semantic" else "lexical"
        try:
            score = float(m.get("score"))
        except (TypeError, ValueError):
            score = None
        _mark(toks, span_of(m.get("span")), ("kind", "match", "score", "used"),
              (kind, rank, score, used), ("match", rank, m))
        _mark(toks, span_of(m.get("copy_from")), ("copy", "copy_used"), (rank, used),
              ("copy", rank, m) if used else None)
    sf = span_of((r.extras or {}).get("suffix"))
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
        title = f"copy of match #{rank + 1} (drafted as branch {m.get('branch')})"
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
                     f"copy of match #{t.copy + 1} (not drafted)")
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
    its rank and score), ``m-copy`` (the copy of a drafted match), ``m-suffix``
    (the looked-up suffix), ``ctx-out`` (generated tokens). ``collapse=k`` elides runs of
    unmarked tokens farther than k tokens from any mark; ``show_draft`` appends the round's
    best-ranked draft after the context."""
    css = CONTEXT_CSS if include_css else ""
    if not 0 <= round_index < len(trace.rounds):
        return css + '<div class="adapld-ctx"><i>No such round.</i></div>'
    toks = context_tokens(trace, round_index)
    prompt_len = len(trace.prompt_ids)
    keep = _kept(toks, prompt_len, collapse)
    parts = [css, '<div class="adapld-ctx">', *_context_parts(toks, keep, prompt_len)]
    if not toks:
        parts.append('<i>empty context</i>')
    if show_draft:
        parts.append(_draft_html(trace, trace.rounds[round_index]))
    parts.append("</div>")
    return "".join(parts)


def _kept(toks: list[ContextToken], prompt_len: int, collapse: int | None) -> list[bool]:
    """Which tokens to show: all, or with ``collapse=k`` those within k tokens of a mark (a
    match, a copy, the suffix, the last token and the prompt/output boundary)."""
    L = len(toks)
    if collapse is None or not L:
        return [True] * L
    k = max(0, int(collapse))
    marked = [i for i, t in enumerate(toks) if t.kind or t.copy is not None or t.suffix]
    marked += [L - 1, prompt_len - 1, prompt_len]
    keep = [False] * L
    for i in marked:
        for j in range(max(0, i - k), min(L, i + k + 1)):
            keep[j] = True
    return keep


def _context_parts(toks: list[ContextToken], keep: list[bool], prompt_len: int) -> list[str]:
    """The tokens' HTML: each kept token, one gap per run of elided ones (a run stops at the
    prompt/output boundary, which gets its own marker)."""
    parts, i, L = [], 0, len(toks)
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
    return parts


def _draft_html(trace: Trace, r: Round) -> str:
    """The round's draft after the context (its best-ranked branch, the first child at each
    depth), or why there was none."""
    if not r.draft:
        why = {"none": "no match", "off": "retrieval paused"}.get(retrieval_kind(r), "no draft")
        return (f'<span class="ctx-next" style="border-color:#94a3b8;color:#475569;'
                f'background:#f8fafc">no draft ({why})</span>')
    parents = r.tree.parents
    first = [0]
    while first[-1] + 1 < len(parents) and parents[first[-1] + 1] == first[-1]:
        first.append(first[-1] + 1)
    txt = "".join(visible_text(trace.token_texts.get(int(r.draft[n]), f"<{r.draft[n]}>"))
                  for n in first)
    more = f" (+{len(r.draft) - len(first)} more in other branches)" \
        if len(first) < len(r.draft) else ""
    return (f'<span class="ctx-next" title="the draft of this round (best-ranked '
            f'branch){html.escape(more)}">draft ▸ {txt}</span>')


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
         "copied tokens (the draft)"),
        ('<span class="sw" style="box-shadow:inset 0 2px 0 #d97706,inset 0 -2px 0 #d97706;'
         'background:#fef3c7">ab</span>', "looked-up suffix"),
    ]
    parts = [CONTEXT_CSS if include_css else "", '<div class="adapld-legend">']
    for sw, label in items:
        parts.append(f"<span>{sw}{html.escape(label)}</span>")
    parts.append("<span>badges: L/S + rank + score · hover a token for details</span></div>")
    return "".join(parts)


# ---------------------------------------------------------------- round summary, matches
