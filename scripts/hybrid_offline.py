"""How much could DFlash + prompt lookup gain? Exact offline estimate on cached greedy rollouts.

For every state n of every rollout (runs/eval-rollouts by default: the 88 held-out replies), the
accepted length of the bundled DFlash drafter's block (cut="off") and of PLD's draft, both exact
under greedy verification against the rollout (specviz.analysis.offline_eval). A round that
verifies both drafts in one tree keeps the longer accepted path, so the hybrid's rounds follow
max(a_dflash(n), a_pld(n)). Prints tau = tokens / rounds per category for PLD, DFlash and max.
(AdaPLD, which the `dflash_adapld` method uses, is not Markov in n and cannot be replayed so.)

    PYTHONPATH=. python scripts/hybrid_offline.py [ROLLOUTS]
"""
import sys
from collections import defaultdict

import specviz  # noqa: F401  (before torch: thread settings)
import torch

from specviz.analysis.edr import greedy_acceptance
from specviz.analysis.offline_eval import drafts_for, parse_drafters
from specviz.drafters import make_drafter
from specviz.models import load_target
from specviz.train.rollouts import RolloutSet


def leading(row) -> int:
    n = 0
    for v in row:
        if v < 0.5:
            break
        n += 1
    return n


def rounds(acc: list[int], L: int) -> int:
    n = r = 0
    while n < L:
        n += acc[n] + 1
        r += 1
    return r


def main(folder: str = "runs/eval-rollouts") -> None:
    torch.manual_seed(0)
    target = load_target("default")
    rs = RolloutSet(folder)
    specs = parse_drafters("pld,dflash")
    drafters = {s.label: make_drafter(s.method, target, **s.params) for s in specs}
    agg = defaultdict(lambda: defaultdict(int))
    for i in range(len(rs)):
        t, _, p = rs.load(i)
        y = t[p:].tolist()
        if not y:
            continue
        acc = {s.label: [leading(a) for a in greedy_acceptance(
            drafts_for(s, drafters[s.label], target, rs, i), y).tolist()] for s in specs}
        acc["max"] = [max(a, b) for a, b in zip(acc["pld"], acc["dflash"])]
        for cat in (rs.rows[i].get("category"), "all"):
            for k, v in acc.items():
                agg[cat][k] += rounds(v, len(y))
            agg[cat]["tokens"] += len(y)
    print("| category | tokens | PLD tau | DFlash tau | max of both |\n|---|---|---|---|---|")
    for cat in sorted(agg, key=lambda c: (c == "all", c)):
        d = agg[cat]
        print(f"| {cat} | {d['tokens']} | " + " | ".join(
            f"{d['tokens'] / d[k]:.3f}" for k in ("pld", "dflash", "max")) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:])
