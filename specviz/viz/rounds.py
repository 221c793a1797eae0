"""One round in one sentence (speculative decoding: draft → verify → commit).

:func:`round_summary_html` says what was drafted, accepted and rejected in a round and which
token the target added itself (a correction after a rejection, a bonus after a fully accepted
draft). Every page uses it; a method adds its own details (AdaPLD: the retrieval kind, the
looked-up suffix, the draft's shape) through :class:`RoundNotes`.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

from ..trace import Round, Trace
from .extras import describe_extras
from .tables import join_tokens

BOX_STYLE = ("font-size:0.9rem;color:#1e293b;background:#f8fafc;border:1px solid #e2e8f0;"
             "border-radius:0.5rem;padding:0.45rem 0.7rem;margin:0.3rem 0 0.6rem 0;")


@dataclass
class RoundNotes:
    """A method's own parts of the sentence (HTML, already escaped, except ``no_draft``)."""

    label: str | None = None        # after "Round N"; default: the drafter's name
    draft: list[str] = field(default_factory=list)  # where the draft came from (default:
    #                                                  "drafted k token(s) (drafter extras)")
    no_draft: str | None = None     # plain text: why nothing was drafted (default: the extras)
    tail: list[str] = field(default_factory=list)   # appended before the round's time
    css_class: str = ""             # extra class on the box


def _verdict_parts(r: Round, esc) -> list[str]:
    """Accepted tokens, the rejected suffix and the target's own token of a drafted round."""
    parts = [f"accepted <b>{r.accepted}</b>"
             + (f": <code>{esc(r.committed[:r.accepted])}</code>" if r.accepted else "")]
    if r.rejected_suffix:
        parts.append(f"rejected {len(r.rejected_suffix)}: <s>{esc(r.rejected_suffix)}</s>")
    if r.target_token >= 0:
        label = "bonus" if r.kind == "bonus" else "correction"
        parts.append(f"target's {label} token: <code>{esc([r.target_token])}</code>")
    return parts


WAIT_SHOWN_S = 0.005  # a queue wait shorter than this is noise, not worth a word


def round_time_text(r: Round) -> str:
    """How long the round took; a wait for the shared model (another tab's turn) is named apart
    from the round's own compute, so a slow round is not mistaken for a slow method."""
    total = (r.t_draft + r.t_verify) * 1000
    wait = max(0.0, float(r.t_wait)) * 1000
    if wait < WAIT_SHOWN_S * 1000:
        return f"{total:.0f} ms"
    return (f"{total - wait:,.0f} ms compute + {wait:,.0f} ms waiting for another tab's turn "
            "on the shared model")


def round_summary_html(trace: Trace, i: int, notes: RoundNotes | None = None) -> str:
    """One sentence about round ``i`` of ``trace`` in a box; "" when there is no such round."""
    if not 0 <= i < len(trace.rounds):
        return ""
    r = trace.rounds[i]
    notes = notes or RoundNotes()
    esc = lambda ids: html.escape(join_tokens(ids, trace.token_texts))  # noqa: E731
    info = describe_extras(r)
    parts = [f"<b>Round {r.index + 1}</b>",
             html.escape(r.drafter) if notes.label is None else notes.label]
    if not r.draft:
        why = info if notes.no_draft is None else notes.no_draft
        parts.append("no draft" + (f" ({html.escape(why)})" if why else "")
                     + " → the target generated one token itself: "
                     f"<code>{esc(r.committed[:1])}</code>")
    else:
        parts += notes.draft or [f"drafted {len(r.draft)} token(s)"
                                 + (f" ({html.escape(info)})" if info else "")]
        parts += _verdict_parts(r, esc)
    parts += notes.tail
    parts.append(html.escape(round_time_text(r)))
    cls = " ".join(c for c in ("round-summary", notes.css_class) if c)
    return f'<div class="{cls}" style="{BOX_STYLE}">' + " · ".join(parts) + "</div>"


__all__ = ["BOX_STYLE", "RoundNotes", "WAIT_SHOWN_S", "round_summary_html",
           "round_time_text"]
