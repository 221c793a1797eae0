"""The prompt as the model saw it: every token of ``trace.prompt_ids``, chat template included.

The chat template wraps the user's text in tokens the user never typed (a system prompt, role
markers). A lookup drafter (PLD, AdaPLD) copies from all of them, so a first draft like
"You are a helpful AI assistant…" comes from the template's system prompt. This view marks each
prompt token as ``template`` (greyed, italic) or ``user`` (the user's own text, found by
matching it in the decoded prompt tokens), and can outline what a round's lookup matched and
copied (:func:`copy_sources`).
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass

from ..trace import Round, Trace
from .tokens import visible_text

MAX_FUZZY_CHARS = 20_000  # longer user texts are matched exactly only (the regex grows with it)

PROMPT_CSS = """
<style>
.specviz-prompt{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:0.84rem;
 line-height:1.9;padding:0.6rem 0.8rem;border:1px solid #e2e8f0;border-radius:0.5rem;
 background:#ffffff;max-height:24rem;overflow-y:auto;word-break:break-word;}
.specviz-prompt .ptok{white-space:pre;border-radius:2px;}
.specviz-prompt .ptok.template{color:#94a3b8;font-style:italic;}
.specviz-prompt .ptok.user{color:#0f172a;}
.specviz-prompt .ptok.match{border-bottom:2px dotted #4338ca;}
.specviz-prompt .ptok.copied{background:#e0e7ff;outline:1.5px solid #4338ca;}
.specviz-prompt-legend{font-size:0.8rem;color:#475569;margin:0 0 0.35rem 0;}
.specviz-prompt-legend .template{color:#94a3b8;font-style:italic;}
.specviz-prompt-legend .copied{background:#e0e7ff;outline:1.5px solid #4338ca;padding:0 2px;}
.specviz-prompt-legend .match{border-bottom:2px dotted #4338ca;}
</style>
"""


@dataclass
class PromptToken:
    """One prompt token as drawn."""

    token_id: int
    text: str
    position: int            # absolute position (0 = the first prompt token)
    part: str                # template | user | unknown (the user's text was not found)
    source: str | None = None  # match (the window a lookup matched) | copied (what it copied)

    @property
    def css_class(self) -> str:
        return " ".join(c for c in ("ptok", self.part, self.source) if c)


def _pattern(text: str) -> str:
    """A regex for ``text`` inside decoded token texts: whitespace runs match any whitespace
    (or none: some tokenizers drop a word's leading space when decoding one token), and a
    non-ASCII character also matches the U+FFFD replacement characters a token that holds only
    part of its bytes decodes to."""
    parts = []
    for chunk in re.split(r"(\s+)", text):
        if not chunk:
            continue
        if chunk.isspace():
            parts.append(r"\s*")
            continue
        for c in chunk:
            parts.append(re.escape(c) if ord(c) < 128 else f"(?:{re.escape(c)}|\ufffd{{1,4}})")
    return "".join(parts)


def user_span(prompt_ids: list[int], texts: dict[int, str], user_text: str | None
              ) -> tuple[int, int] | None:
    """Token indices ``[a, b)`` of ``prompt_ids`` that hold the user's text (the last place it
    occurs: a chat template puts the user's message after its system prompt); None when there
    is no user text or it cannot be found in the decoded tokens."""
    text = (user_text or "").strip()
    if not text or not prompt_ids:
        return None
    pieces = [texts.get(int(t), "") for t in prompt_ids]
    joined = "".join(pieces)
    at = joined.rfind(text)
    if at >= 0:
        start, end = at, at + len(text)
    elif len(text) <= MAX_FUZZY_CHARS:
        found = None
        for found in re.finditer(_pattern(text), joined):
            pass
        if found is None or found.end() == found.start():
            return None
        start, end = found.start(), found.end()
    else:
        return None
    a = b = None
    pos = 0
    for i, piece in enumerate(pieces):
        lo, pos = pos, pos + len(piece)
        if pos > start and lo < end:  # the token overlaps the user's text
            a = i if a is None else a
            b = i + 1
    return None if a is None else (a, b)


def _span(v) -> tuple[int, int] | None:
    try:
        a, b = (int(x) for x in v)
    except (TypeError, ValueError):
        return None
    return (a, b) if 0 <= a <= b else None


def copy_sources(r: Round) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(matched window, copied span) of each lookup the round's draft came from, in absolute
    positions ``[a, b)``: PLD's n-gram match, AdaPLD's matches that became a draft branch. The
    copied span is cut to the draft's depth (a draft is clipped to the token budget)."""
    ex = r.extras or {}
    found = []
    if isinstance(ex.get("match"), dict):
        found.append(ex["match"])
    for m in ex.get("matches") or []:
        if isinstance(m, dict) and m.get("branch") is not None:
            found.append(m)
    out = []
    for m in found:
        win, cop = _span(m.get("span")), _span(m.get("copy_from"))
        if win is not None and cop is not None and r.draft:
            out.append((win, (cop[0], min(cop[1], cop[0] + r.draft_depth))))
    return out


def prompt_tokens(trace: Trace, selected_round: int | None = None) -> list[PromptToken]:
    """Every prompt token, marked template / user, and (with ``selected_round``) the window
    that round's lookup matched and the tokens it copied, where they lie in the prompt."""
    ids = [int(t) for t in trace.prompt_ids]
    prompt = trace.meta.get("prompt")
    span = user_span(ids, trace.token_texts, prompt if isinstance(prompt, str) else None)
    source: dict[int, str] = {}
    if selected_round is not None and 0 <= selected_round < len(trace.rounds):
        for win, cop in copy_sources(trace.rounds[selected_round]):
            source.update({p: "match" for p in range(*win)})
            source.update({p: "copied" for p in range(*cop)})
    out = []
    for i, t in enumerate(ids):
        part = "unknown" if span is None else ("user" if span[0] <= i < span[1] else "template")
        out.append(PromptToken(t, trace.token_texts.get(t, f"<{t}>"), i, part, source.get(i)))
    return out


def prompt_html(trace: Trace, selected_round: int | None = None,
                include_css: bool = True) -> str:
    """The prompt's tokens as HTML, with a one-line key (see the module docstring)."""
    toks = prompt_tokens(trace, selected_round)
    parts = [PROMPT_CSS if include_css else ""]
    key = []
    if any(t.part == "template" for t in toks):
        key.append('<span class="template">grey italic</span>: added by the chat template '
                   'or the tokenizer (never typed)')
        key.append("normal: your prompt")
    elif toks and all(t.part == "unknown" for t in toks):
        key.append("the exact tokens the model read")
    if any(t.source for t in toks):
        r = selected_round + 1
        key.append(f'<span class="match">dotted</span>: what round {r}\'s lookup matched; '
                   f'<span class="copied">outlined</span>: what it copied as its draft')
    if key:
        parts.append('<div class="specviz-prompt-legend">' + " · ".join(key) + "</div>")
    parts.append('<div class="specviz-prompt">')
    for t in toks:
        where = {"template": "chat template", "user": "your prompt"}.get(t.part, "prompt")
        title = html.escape(f"position {t.position} · token {t.token_id} · {where}", quote=True)
        parts.append(f'<span class="{t.css_class}" title="{title}" data-pos="{t.position}">'
                     f"{visible_text(t.text)}</span>")
        if "\n" in t.text:
            parts.append("<br>")
    parts.append("</div>")
    return "".join(parts)


def copied_from_prompt(trace: Trace, i: int) -> bool:
    """Whether round ``i``'s draft copied tokens from the prompt (not from generated text)."""
    if not 0 <= i < len(trace.rounds):
        return False
    n = len(trace.prompt_ids)
    return any(cop[0] < n and cop[1] > cop[0] for _, cop in copy_sources(trace.rounds[i]))


__all__ = ["PROMPT_CSS", "PromptToken", "copied_from_prompt", "copy_sources", "prompt_html",
           "prompt_tokens", "user_span"]
