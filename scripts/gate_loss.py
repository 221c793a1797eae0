"""Where a DFlash run loses time against AR, by kind of round.

    python -m specviz bench --methods dflash --save-traces --out OUT ...   # any bench
    python scripts/gate_loss.py OUT/traces

Reads a bench's saved traces (``bench --save-traces``: TRACES/ar/CAT/ID.json and
TRACES/dflash/CAT/ID.json, same prompts) and prints per category the decode-time speedup and,
for each kind of DFlash round -- paused (a plain step), cut0 (the drafter ran, the cut kept
nothing), probe, drafted -- its time beyond AR's per-token cost, in % of AR's time. Then an
offline estimate of one gate variant: skip the drafter in the round after a cut0 round (a
round that would have been cut0 saves its drafter time; a drafted round is replaced by a plain
step, its extra tokens costed at the run's mean time per token).
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

KINDS = ("paused", "cut0", "probe", "drafted")


def kind(r: dict) -> str:
    cut = r.get("extras", {}).get("cut") or {}
    if not cut:
        return "other"
    if cut.get("paused"):
        return "paused"
    if cut.get("kept") == 0:
        return "cut0"
    return "probe" if cut.get("probe") else "drafted"


def seconds(r: dict) -> float:
    return r["t_draft"] + r["t_verify"]


def prompt_loss(ar: dict, df: dict, a: dict) -> None:
    """Add one prompt's figures to the category's sums ``a``."""
    step = sum(seconds(r) for r in ar["rounds"]) / len(ar["rounds"])
    rs = df["rounds"]
    per_token = sum(seconds(r) for r in rs) / sum(len(r["committed"]) for r in rs)
    a["ar"] += sum(seconds(r) for r in ar["rounds"])
    a["dflash"] += sum(seconds(r) for r in rs)
    for r in rs:
        a[kind(r)] += seconds(r) - step * len(r["committed"])
    for prev, r in zip(rs, rs[1:]):
        if kind(prev) == "cut0" and kind(r) == "cut0":
            a["skip"] += r["t_draft"]
        elif kind(prev) == "cut0" and kind(r) in ("drafted", "probe"):
            a["skip"] += seconds(r) - (step + (len(r["committed"]) - 1) * per_token)


def main(folder: str) -> None:
    base = Path(folder)
    cats: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    for f in sorted((base / "dflash").glob("*/*.json")):
        rel = f.relative_to(base / "dflash")
        ar = base / "ar" / rel
        if ar.exists():
            prompt_loss(json.loads(ar.read_text()), json.loads(f.read_text()), cats[rel.parts[0]])
    for cat, a in sorted(cats.items()):
        parts = "  ".join(f"{k} {100 * a[k] / a['ar']:+.1f}%" for k in KINDS)
        print(f"{cat:15s} decode speedup {a['ar'] / a['dflash']:.3f}  {parts}  "
              f"skip-after-cut0 saves {100 * a['skip'] / a['dflash']:+.2f}%")


if __name__ == "__main__":
    main(sys.argv[1])
