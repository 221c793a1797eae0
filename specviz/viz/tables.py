"""Tables (pandas) built from traces: the per-round table and the Compare page's tables."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

import pandas as pd

from ..trace import Round, Trace
from .stats import position_acceptance, round_kind


def join_tokens(ids: Iterable[int], texts: dict[int, str]) -> str:
    """Token ids as one readable string (newlines shown as ↵)."""
    return "".join(texts.get(int(t), f"<{t}>") for t in ids).replace("\n", "↵")


def describe_extras(r: Round) -> str:
    """A short human description of a drafter's extras (PLD's match, or compact JSON)."""
    if not r.extras:
        return ""
    parts = []
    for key, val in r.extras.items():
        if key == "match":
            if not val:
                parts.append("no n-gram match")
                continue
            try:
                a, b = val.get("span", [None, None])
                c, d = val.get("copy_from", [None, None])
                parts.append(f"{val.get('kind', 'match')} {val.get('ngram', '?')}-gram at "
                             f"{a}–{b}, copied {c}–{d}")
            except (AttributeError, TypeError, ValueError):
                parts.append(f"match: {json.dumps(val, default=str)[:120]}")
        else:
            parts.append(f"{key}: {json.dumps(val, default=str)[:120]}")
    return "; ".join(parts)


def rounds_table(trace: Trace) -> pd.DataFrame:
    """One row per round: what was drafted, accepted, rejected and committed, and the timings."""
    texts = trace.token_texts
    prompt_len = int(trace.meta.get("prompt_len") or len(trace.prompt_ids))
    rows = []
    for r in trace.rounds:
        kind = round_kind(r)
        first_rej_p = None
        if r.parents is None and r.accepted < len(r.draft) and r.accepted < len(r.p_draft):
            first_rej_p = r.p_draft[r.accepted]
        tt = r.target_token
        rows.append({
            "round": r.index + 1,
            "output_pos": r.start - prompt_len + 1,
            "drafted": len(r.draft),
            "accepted": r.accepted,
            "committed": len(r.committed),
            "target_token_kind": {"nodraft": "no draft", "bonus": "bonus",
                                  "correction": "correction"}[kind],
            "accepted_text": join_tokens(r.committed[:r.accepted], texts),
            "target_token": join_tokens([tt], texts) if tt >= 0 else "",
            "rejected_text": join_tokens(r.rejected_suffix, texts),
            "p_first_rejected": first_rej_p,
            "drafter_info": describe_extras(r),
            "t_draft_ms": round(r.t_draft * 1000, 2),
            "t_verify_ms": round(r.t_verify * 1000, 2),
        })
    cols = ["round", "output_pos", "drafted", "accepted", "committed", "target_token_kind",
            "accepted_text", "target_token", "rejected_text", "p_first_rejected", "drafter_info",
            "t_draft_ms", "t_verify_ms"]
    return pd.DataFrame(rows, columns=cols)


def position_table(trace: Trace) -> pd.DataFrame:
    stats = position_acceptance(trace)
    return pd.DataFrame([{"position": s.position, "reached": s.reached, "accepted": s.accepted,
                          "rate": s.rate} for s in stats],
                        columns=["position", "reached", "accepted", "rate"])


def to_csv_bytes(df: pd.DataFrame) -> bytes:
    return df.to_csv(index=False).encode("utf-8")


# ---------------------------------------------------------------- Compare page
@dataclass
class CompareRun:
    """One (prompt, method) run of the Compare page: its trace and the measured wall time."""

    prompt_id: str
    prompt_title: str
    method: str
    trace: Trace
    wall_s: float  # prefill + decode, measured around the whole run


def compare_runs_table(runs: list[CompareRun], baseline: str = "ar") -> pd.DataFrame:
    """Per prompt and method: tau, forwards, wall time, speedup vs the baseline of that prompt,
    and whether the output equals the baseline's token for token."""
    base = {r.prompt_id: r for r in runs if r.method == baseline}
    rows = []
    for r in runs:
        b = base.get(r.prompt_id)
        greedy = float((r.trace.meta.get("settings") or {}).get("temperature", 0.0) or 0.0) == 0
        rows.append({
            "prompt": r.prompt_id,
            "title": r.prompt_title,
            "method": r.method,
            "new_tokens": r.trace.new_tokens,
            "target_forwards": r.trace.target_forwards,
            "tau": round(r.trace.tau, 3),
            "wall_s": round(r.wall_s, 3),
            "tokens_per_s": round(r.trace.new_tokens / r.wall_s, 2) if r.wall_s > 0 else None,
            "speedup_vs_ar": round(b.wall_s / r.wall_s, 3) if b and r.wall_s > 0 else None,
            "identical_to_ar": (r.trace.output_ids == b.trace.output_ids)
            if (b is not None and greedy) else None,
        })
    return pd.DataFrame(rows, columns=["prompt", "title", "method", "new_tokens",
                                       "target_forwards", "tau", "wall_s", "tokens_per_s",
                                       "speedup_vs_ar", "identical_to_ar"])


def compare_summary_table(runs: list[CompareRun], baseline: str = "ar") -> pd.DataFrame:
    """One row per method, summed over the prompt set; speedup = baseline wall / method wall."""
    per = compare_runs_table(runs, baseline)
    if per.empty:
        return pd.DataFrame(columns=["method", "prompts", "new_tokens", "target_forwards", "tau",
                                     "wall_s", "tokens_per_s", "speedup_vs_ar",
                                     "identical_to_ar"])
    base_wall = per.loc[per.method == baseline, "wall_s"].sum()
    rows: list[dict[str, Any]] = []
    for method in dict.fromkeys(r.method for r in runs):
        sub = [r for r in runs if r.method == method]
        p = per[per.method == method]
        n_rounds = sum(r.trace.num_rounds for r in sub)
        tau = sum(rr.accepted + 1 for r in sub for rr in r.trace.rounds) / n_rounds \
            if n_rounds else 0.0
        wall = float(p.wall_s.sum())
        ident = p.identical_to_ar
        rows.append({
            "method": method,
            "prompts": len(sub),
            "new_tokens": int(p.new_tokens.sum()),
            "target_forwards": int(p.target_forwards.sum()),
            "tau": round(tau, 3),
            "wall_s": round(wall, 3),
            "tokens_per_s": round(p.new_tokens.sum() / wall, 2) if wall > 0 else None,
            "speedup_vs_ar": round(base_wall / wall, 3) if wall > 0 and base_wall > 0 else None,
            "identical_to_ar": None if ident.isna().any() else bool(ident.all()),
        })
    return pd.DataFrame(rows)
