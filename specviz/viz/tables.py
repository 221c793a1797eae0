"""Tables (pandas) built from traces: the per-round table and the Compare page's tables."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import pandas as pd

from .. import metrics
from ..analysis.lossless import LosslessVerdict, compare_outputs, lossless_verdict
from ..trace import Round, Trace
from .extras import describe_extras
from .stats import position_acceptance


def join_tokens(ids: Iterable[int], texts: dict[int, str]) -> str:
    """Token ids as one readable string (newlines shown as ↵)."""
    return "".join(texts.get(int(t), f"<{t}>") for t in ids).replace("\n", "↵")


def rounds_table(trace: Trace) -> pd.DataFrame:
    """One row per round: what was drafted, accepted, rejected and committed, and the timings."""
    texts = trace.token_texts
    prompt_len = int(trace.meta.get("prompt_len") or len(trace.prompt_ids))
    rows = []
    for r in trace.rounds:
        first = [i for i, st in enumerate(r.node_status()) if st == "first_rejected"]
        first_rej_p = r.p_draft[first[0]] if first and first[0] < len(r.p_draft) else None
        tt = r.target_token
        rows.append({
            "round": r.index + 1,
            "output_pos": r.start - prompt_len + 1,
            "drafted": len(r.draft),
            "accepted": r.accepted,
            "committed": len(r.committed),
            "target_token_kind": {"nodraft": "no draft", "bonus": "bonus",
                                  "correction": "correction"}[r.kind],
            "accepted_text": join_tokens(r.committed[:r.accepted], texts),
            "target_token": join_tokens([tt], texts) if tt >= 0 else "",
            "rejected_text": join_tokens(r.rejected_suffix, texts),
            "p_first_rejected": "—" if first_rej_p is None else f"{float(first_rej_p):.3f}",
            "drafter_info": describe_extras(r),
            "t_draft_ms": round(r.t_draft * 1000, 1),
            "t_forward_ms": round(r.t_forward * 1000, 1),
            "t_wait_ms": round(r.t_wait * 1000, 1),
            "t_verify_ms": round(r.t_verify * 1000, 1),
        })
    cols = ["round", "output_pos", "drafted", "accepted", "committed", "target_token_kind",
            "accepted_text", "target_token", "rejected_text", "p_first_rejected", "drafter_info",
            "t_draft_ms", "t_forward_ms", "t_wait_ms", "t_verify_ms"]
    return pd.DataFrame(rows, columns=cols)


def _pct(p: float) -> str:
    p = float(p)
    return "<1%" if 0 < p < 0.005 else f"{p:.0%}"


def topk_text(ids, probs, texts: dict[int, str]) -> str:
    """Top-k tokens and their probabilities in one cell (“ the” 52% · “ a” 21%); — if none."""
    try:
        pairs = [(int(t), float(p)) for t, p in zip(ids or [], probs or [])]
    except (TypeError, ValueError):
        return "—"
    if not pairs:
        return "—"
    return " · ".join(f"“{join_tokens([t], texts)}” {_pct(p)}" for t, p in pairs)


def _row(lst, i):
    return lst[i] if isinstance(lst, list) and 0 <= i < len(lst) else None


def _target_topk(r: Round, row: int) -> tuple[list, list]:
    """The target's top-k at verify row ``row``; traces recorded before the top-k was kept give
    the target's top-1 (its argmax)."""
    ids, probs = _row(r.target_topk, row), _row(r.target_topk_prob, row)
    if ids:
        return ids, probs or []
    top, p = _row(r.target_argmax, row), _row(r.target_argmax_prob, row)
    return ([top], [p]) if top is not None and p is not None else ([], [])


TOPK_VERDICTS = {
    "accepted": "accepted",
    "first_rejected": "rejected: the target disagreed",
    "rejected": "rejected (another branch was accepted)",
    "bonus": "bonus: the target's own token",
    "nodraft": "no draft: the target's own token",
}


def topk_table(trace: Trace, i: int) -> pd.DataFrame:
    """Round ``i`` slot by slot: every draft token the target judged (on a correct prefix) with
    the drafter's top-k there (DFlash records it; — for lookup drafts, which copy one token)
    and the target's top-k with probabilities; then the slot of the target's bonus token (or
    its one token in a round without a draft)."""
    cols = ["slot", "drafted", "verdict", "p_target", "drafter_topk", "target_topk"]
    if not 0 <= i < len(trace.rounds):
        return pd.DataFrame(columns=cols)
    r, texts = trace.rounds[i], trace.token_texts
    sampling = not _greedy(trace)
    ex = r.extras or {}
    q_ids, q_p = ex.get("topk"), ex.get("topk_p")
    depths = r.tree.depths
    rows = []
    for node, status in enumerate(r.node_status(sampling=sampling)):
        if status == "not_reached":
            continue
        p = _row(r.p_draft, node)
        chain_slot = node if not r.is_tree else -1
        rows.append({
            "slot": depths[node], "drafted": join_tokens([r.draft[node]], texts),
            "verdict": TOPK_VERDICTS[status], "p_target": "—" if p is None else _pct(p),
            "drafter_topk": topk_text(_row(q_ids, chain_slot), _row(q_p, chain_slot), texts),
            "target_topk": topk_text(*_target_topk(r, r.node_row(node)), texts),
        })
    if r.kind in ("bonus", "nodraft") and r.target_token >= 0:
        rows.append({"slot": r.accepted + 1, "drafted": "—", "verdict": TOPK_VERDICTS[r.kind],
                     "p_target": "—", "drafter_topk": "—",
                     "target_topk": topk_text(*_target_topk(r, r.target_row), texts)})
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


def _greedy(trace: Trace) -> bool:
    return float((trace.meta.get("settings") or {}).get("temperature", 0.0) or 0.0) == 0


def _round(x: float | None, nd: int) -> float | None:
    return None if x is None else round(x, nd)


def compare_runs_table(runs: list[CompareRun], baseline: str = "ar") -> pd.DataFrame:
    """Per prompt and method: tau, forwards, wall time, speedup vs the baseline of that prompt,
    and whether the output equals the baseline's token for token (specviz.metrics)."""
    base = {r.prompt_id: r for r in runs if r.method == baseline}
    rows = []
    for r in runs:
        b = base.get(r.prompt_id)
        greedy = _greedy(r.trace)
        rows.append({
            "prompt": r.prompt_id,
            "title": r.prompt_title,
            "method": r.method,
            "new_tokens": r.trace.new_tokens,
            "target_forwards": r.trace.target_forwards,
            "tau": round(r.trace.tau, 3),
            "wall_s": round(r.wall_s, 3),
            "tokens_per_s": _round(metrics.tokens_per_s(r.trace.new_tokens, r.wall_s), 2),
            "speedup_vs_ar": _round(metrics.speedup(b.wall_s if b else None, r.wall_s), 3),
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
    base_wall = sum(r.wall_s for r in runs if r.method == baseline)
    rows: list[dict[str, Any]] = []
    for method in dict.fromkeys(r.method for r in runs):
        sub = [r for r in runs if r.method == method]
        ident = per[per.method == method].identical_to_ar
        toks = sum(r.trace.new_tokens for r in sub)
        forwards = sum(r.trace.target_forwards for r in sub)
        wall = sum(r.wall_s for r in sub)
        rows.append({
            "method": method,
            "prompts": len(sub),
            "new_tokens": toks,
            "target_forwards": forwards,
            "tau": round(metrics.tau(toks, forwards), 3),
            "wall_s": round(wall, 3),
            "tokens_per_s": _round(metrics.tokens_per_s(toks, wall), 2),
            "speedup_vs_ar": _round(metrics.speedup(base_wall, wall), 3),
            "identical_to_ar": None if ident.isna().any() else bool(ident.all()),
        })
    return pd.DataFrame(rows)


def compare_verdict(runs: list[CompareRun], target=None,
                    baseline: str = "ar") -> LosslessVerdict:
    """Lossless verdict of the Compare page: every other run vs the baseline run of its prompt
    (greedy only). With ``target``, a differing run's first divergence is checked for a top-2
    near-tie of the target's logits (one forward per differing run)."""
    base = {r.prompt_id: r for r in runs if r.method == baseline}
    reports = [compare_outputs(target, r.trace.prompt_ids, base[r.prompt_id].trace.output_ids,
                               r.trace.output_ids)
               for r in runs if r.method != baseline and r.prompt_id in base]
    return lossless_verdict(reports, greedy=all(_greedy(r.trace) for r in runs))


def selector_table(trace: Trace, i: int) -> pd.DataFrame:
    """DFlash2's candidate selector in round ``i``, slot by slot: the K candidates (best unary
    logit first, the one the walk chose marked ▶), the chosen token and its verdict; empty for
    rounds of other drafters."""
    cols = ["slot", "candidates", "chosen", "verdict"]
    if not 0 <= i < len(trace.rounds):
        return pd.DataFrame(columns=cols)
    r, texts = trace.rounds[i], trace.token_texts
    sel = (r.extras or {}).get("selector") or {}
    status = r.node_status(sampling=not _greedy(trace))
    rows = []
    for slot, (cands, unary, pick) in enumerate(zip(sel.get("candidates", []),
                                                    sel.get("unary", []), sel.get("path", []))):
        shown = [("▶ " if j == pick else "") + f"{join_tokens([c], texts)} ({u:.2f})"
                 for j, (c, u) in enumerate(zip(cands, unary))]
        rows.append({"slot": slot + 1, "candidates": " · ".join(shown),
                     "chosen": join_tokens([cands[pick]], texts),
                     "verdict": TOPK_VERDICTS.get(status[slot], status[slot])
                     if slot < len(status) else "—"})
    return pd.DataFrame(rows, columns=cols)


def domino_table(trace: Trace, i: int) -> pd.DataFrame:
    """Domino's correction head in round ``i``, slot by slot: the backbone's own word, the word
    drafted after the GRU correction, whether the correction changed it, and the verdict;
    empty for rounds of other drafters."""
    cols = ["slot", "backbone", "drafted", "corrected", "verdict"]
    if not 0 <= i < len(trace.rounds):
        return pd.DataFrame(columns=cols)
    r, texts = trace.rounds[i], trace.token_texts
    info = (r.extras or {}).get("domino") or {}
    status = r.node_status(sampling=not _greedy(trace))
    rows = [{"slot": slot + 1, "backbone": join_tokens([b], texts),
             "drafted": join_tokens([d], texts), "corrected": "yes" if c else "no",
             "verdict": TOPK_VERDICTS.get(status[slot], status[slot])
             if slot < len(status) else "—"}
            for slot, (b, d, c) in enumerate(zip(info.get("backbone", []), r.draft,
                                                 info.get("corrected", [])))]
    return pd.DataFrame(rows, columns=cols)


CHAIN_VIEWS = {   # extras key -> (title, caption, table) of a drafter that drafts left to right
    "selector": ("DFlash2 candidate selector: top-K per slot and the chosen path",
                 "DFlash2 scores each slot's top-K words (unary logit in brackets) and picks the "
                 "block left to right by edge scores between neighbouring candidates: ▶ marks "
                 "the candidate the walk chose, which need not be the slot's best unary word.",
                 selector_table),
    "domino": ("Domino correction: the backbone's word and the drafted one per slot",
               "Domino's backbone drafts every slot at once; a GRU over the words drafted so far "
               "adds a logit correction from the second word on. 'corrected' marks the slots "
               "where that changed the backbone's word.", domino_table)}
