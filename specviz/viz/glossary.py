"""The words the app uses, each in one line (speculative decoding), for a glossary a teacher
can point at. Every page that shows one of these terms can link here."""
from __future__ import annotations

import html

GLOSSARY = {
    "target": "The model whose output we want. Its answer never changes: speculation only "
              "makes it faster.",
    "drafter": "A cheap guesser (a lookup in the text so far, or a small network) that proposes "
               "the next few tokens.",
    "round": "One step of speculative decoding: the drafter proposes, the target checks all "
             "proposals in ONE forward pass, the agreeing prefix is kept.",
    "target forward": "One pass of the target model over some tokens; the expensive part. "
                      "Plain decoding needs one per generated token.",
    "accepted token": "A drafted token the target agreed with (greedy: it is the target's own "
                      "top choice there).",
    "correction": "The target's own token at the first disagreement: every round ends with one "
                  "token from the target, so no round is wasted.",
    "bonus": "The target's own token after a fully accepted draft: a free extra token.",
    "rejected suffix": "The drafted tokens from the first disagreement on. Only the first of "
                       "them was really judged; the rest followed a wrong token.",
    "tau": "Tokens per round (new tokens ÷ target forwards). Plain decoding has tau = 1; "
           "higher means fewer target passes.",
    "acceptance rate": "Of the rounds that reached a draft position, the share whose token there "
                       "was accepted.",
    "speedup": "Plain decoding's time ÷ this method's time. Measured on the Compare page (both "
               "timed in the same run); only estimated on the Decode page (from this run's "
               "round times and acceptance, plain decoding not run), so the two can differ.",
    "verify cost": "What a target forward over k tokens costs relative to one token. On a CPU "
                   "two tokens already cost much more than one; on a GPU k tokens cost about "
                   "the same as one.",
}


def glossary_html() -> str:
    """The glossary as a compact definition list."""
    rows = "".join(f"<dt>{html.escape(t)}</dt><dd>{html.escape(d)}</dd>"
                   for t, d in GLOSSARY.items())
    return ('<dl class="specviz-glossary" style="display:grid;grid-template-columns:max-content '
            'auto;gap:0.25rem 1rem;font-size:0.88rem;margin:0">'
            + rows.replace("<dd>", '<dd style="margin:0">') + "</dl>")
