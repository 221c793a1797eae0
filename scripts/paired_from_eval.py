"""Paired bootstrap of expected rounds between any two drafters of an `eval.csv` (written by
`python -m specviz eval`), per category and overall: `python scripts/paired_from_eval.py
results/edr_sampled/eval_t1/eval.csv "dflash:runs/ft1-decay_ce" "dflash:runs/ft1-edr" ...`
(pairs of labels: baseline, candidate)."""
import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install
from specviz.analysis.offline_eval import bootstrap_ci  # noqa: E402


def main(path: str, labels: list[str]) -> dict:
    rows = list(csv.DictReader(open(path)))
    out = {}
    for base, cand in zip(labels[::2], labels[1::2]):
        res = {}
        for cat in sorted({r["category"] for r in rows}) + ["all"]:
            sub = [r for r in rows if cat == "all" or r["category"] == cat]
            b = bootstrap_ci([float(r[f"edr:{base}"]) for r in sub],
                             [float(r[f"edr:{cand}"]) for r in sub], [int(r["tokens"]) for r in sub])
            res[cat] = {"rounds_change": round(b["rounds_change"], 4),
                        "ci": [round(x, 4) for x in b["rounds_change_ci"]], "rollouts": len(sub)}
        out[f"{cand} vs {base}"] = res
        a = res["all"]
        print(f"{cand} vs {base}: expected rounds {a['rounds_change']:+.1%} "
              f"(95% CI {a['ci'][0]:+.1%} .. {a['ci'][1]:+.1%}); by category: "
              + ", ".join(f"{c} {v['rounds_change']:+.1%}" for c, v in res.items() if c != "all"), file=sys.stderr)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:]), indent=1))
