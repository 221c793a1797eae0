"""What a drafter's round extras say, in words (for round sentences and the rounds table).

Each drafter records its own extras (PLD: the n-gram match; AdaPLD: retrieval kind, source,
matches, draft shape; DFlash: block size, per-slot confidence and where the block was cut).
Known ones are described in plain language with units and rounding; unknown keys fall back to
``key: value`` with floats rounded, so nothing raw (``null``, six-decimal lists) reaches a
screen.
"""
from __future__ import annotations

from typing import Any

from ..trace import Round

SOURCE_WORDS = {"lex1": "1-token match", "lex2": "2-token match", "lex3": "match of 3+ tokens",
                "sem": "similar window (semantic)", "semfree": "similar window, no shared token",
                "copy": "continuing the copy that was right last round",
                "hist": "what the target most often wrote next in its own earlier replies",
                "open": "how the target opened its replies to the most similar earlier prompts"}


def _value(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, (list, tuple)):
        shown = ", ".join(_value(x) for x in list(v)[:8])
        return f"[{shown}{', …' if len(v) > 8 else ''}]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in list(v.items())[:6]) + "}"
    return str(v)


def _pld(match) -> str:
    if not match:
        return "no n-gram match"
    try:
        a, b = match.get("span", [None, None])
        c, d = match.get("copy_from", [None, None])
        return f"{match.get('ngram', '?')}-token match at positions {a}–{b}, copied {c}–{d}"
    except (AttributeError, TypeError, ValueError):
        return f"match: {_value(match)}"


def _adapld(ex: dict) -> str:
    kind, src = ex.get("retrieval"), ex.get("source")
    if kind == "off":
        return f"{SOURCE_WORDS.get(src, 'this source')} is paused (it has not paid lately)"
    if kind == "none" or not kind:
        return "no match in the context"
    words = f"{kind} retrieval: {SOURCE_WORDS.get(src, src or 'match')}"
    if ex.get("streak"):
        words += f", {ex['streak']} full round(s) in a row"
    if ex.get("edits"):
        n = len(ex["edits"])
        words += f", with {n} learned edit{'s' if n > 1 else ''} applied (a span the target " \
                 "rewrote earlier in this reply)"
    if int(ex.get("branches") or 0) > 1:
        words += f"; a tree of {ex['branches']} branches"
    return words + (" (probe)" if ex.get("probe") else "")


def _dflash(ex: dict, r: Round) -> str:
    cut = ex.get("cut")
    words = f"block of {ex.get('block_size', '?')} slots"
    probe = ex.get("state_probe")
    if isinstance(cut, dict) and cut.get("paused") and isinstance(probe, dict) \
            and probe.get("skip"):
        return ("drafter skipped: a plain decoding step with no drafter forward (the state "
                f"probe read {probe.get('predicted', '?')} accepted tokens off the target's "
                f"state, below the {probe.get('threshold', '?')} a forward and the smallest "
                "verify cost)")
    if isinstance(cut, dict) and cut.get("paused"):
        return ("drafter paused: a plain decoding step with no drafter forward (its recent "
                f"rounds committed {cut.get('rate', '?')} tokens per step's cost, less than "
                "plain decoding's 1)")
    if isinstance(cut, dict) and cut.get("tree"):
        kept = int(cut.get("kept", 0))
        if not r.draft:
            return words + "; no tree node would pay for the longer verify: a plain step"
        depth = max(r.tree.depths) if r.draft else 0
        return (words + f"; verified as a tree of {len(r.draft)} node(s) over {depth} slot(s) "
                f"(the slots' top words, most probable paths first; {kept} paid for the "
                "wider verify)")
    if isinstance(cut, dict) and cut.get("block"):
        kept, block = int(cut.get("kept", 0)), int(cut["block"])
        if kept < block:
            return (words + f"; verified {kept} of {block} drafted tokens (the rest would not "
                    "pay for the longer verify)")
    conf = ex.get("confidence") or []
    if conf:
        words += f"; drafter confidence {sum(conf) / len(conf):.0%} on average"
    return words


def describe_extras(r: Round) -> str:
    """A short human description of a round's drafter extras."""
    ex = r.extras or {}
    if not ex:
        return ""
    if "match" in ex:
        return _pld(ex["match"])
    if "retrieval" in ex:
        return _adapld(ex)
    if "block_size" in ex:
        return _dflash(ex, r)
    if "served" in ex:
        return _served(ex["served"], r)
    return "; ".join(f"{k}: {_value(v)}" for k, v in ex.items())


def _served(sv: dict, r: Round) -> str:
    """A served run's step: vLLM's numbering and counts, rebuilt drafts or counts only."""
    if not sv.get("step"):
        return "vLLM: a step without a draft"
    how = "drafted tokens rebuilt with vLLM's rule" if sv.get("rebuilt") else \
        "counts only (drafted tokens not reported)"
    return f"vLLM step {sv['step']}: drafted {sv.get('drafted', 0)}, accepted {r.accepted}; {how}"
