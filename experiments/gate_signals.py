"""Which free signal predicts that a DFlash round's first slot is accepted? (Could a gate decide
before the drafter forward?)

    python experiments/gate_signals.py TRACES/METHOD

Reads the saved traces of a chain DFlash run that drafted every round (``bench --save-traces``
with ``{"tree": 0, "cut": "off"}``) and prints the ROC AUC, for "slot 1 accepted", of (a) the
drafter's own slot-1 confidence (known only after its forward) and (b) signals known before it:
the target's probability of the token it committed last round (its bonus token), and how many
tokens that round accepted. Then acceptance by confidence bucket against the mean confidence
(calibration), per category.
"""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from scipy.stats import mannwhitneyu

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specviz.trace import Trace  # noqa: E402


def auc(scores: list[float], labels: list[int]) -> float:
    """ROC AUC = Mann-Whitney U / (positives x negatives)."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    return float(mannwhitneyu(pos, neg).statistic) / (len(pos) * len(neg))


def rows(folder: Path):
    for f in sorted(folder.glob("*/*.json")):
        tr = Trace.load(f)
        prev = None
        for r in tr.rounds:
            conf = (r.extras or {}).get("confidence") or []
            if conf and prev is not None:
                yield {"cat": f.parent.name, "conf": float(conf[0]), "bonus_p": prev[0],
                       "prev_acc": prev[1], "ok": int(r.accepted > 0)}
            row = r.target_row if r.target_argmax_prob else None
            prev = None if row is None else (float(r.target_argmax_prob[row]), int(r.accepted))


def main(folder: str) -> None:
    data = list(rows(Path(folder)))
    if not data:
        sys.exit(f"no drafted chain rounds under {folder}/CATEGORY/*.json")
    y = [d["ok"] for d in data]
    print(f"{len(data)} drafted rounds, slot 1 accepted in {sum(y) / len(y):.1%}")
    for key, what in (("conf", "drafter slot-1 confidence (after its forward)"),
                      ("bonus_p", "target's p of last round's bonus token (before)"),
                      ("prev_acc", "last round's accepted count (before)")):
        print(f"  AUC {auc([d[key] for d in data], y):.3f}  {what}")
    by = defaultdict(list)
    for d in data:
        by[d["cat"]].append(d)
    print("\ncategory         rounds  mean conf  accepted   (conf > 0.5: n, mean conf, accepted)")
    for cat, ds in sorted(by.items()):
        hi = [d for d in ds if d["conf"] > 0.5]
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        print(f"{cat:<16}{len(ds):>7}{mean([d['conf'] for d in ds]):>11.2f}"
              f"{mean([d['ok'] for d in ds]):>10.2f}   ({len(hi)}, {mean([d['conf'] for d in hi]):.2f},"
              f" {mean([d['ok'] for d in hi]):.2f})")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
