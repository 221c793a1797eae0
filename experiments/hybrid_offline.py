"""How much could DFlash + prompt lookup gain? Exact offline estimate on cached greedy rollouts.

For every state n of every rollout (runs/eval-rollouts by default: the 88 held-out replies), the
accepted length of the bundled DFlash drafter's block (cut="off") and of PLD's draft, both exact
under greedy verification against the rollout (specviz.analysis.offline_eval). A round that
verifies both drafts in one tree keeps the longer accepted path, so the hybrid's rounds follow
max(a_dflash(n), a_pld(n)). Prints tau = tokens / rounds per category for PLD, DFlash and max.
(AdaPLD, which the `dflash_adapld` method uses, is not Markov in n and cannot be replayed so.)

    python experiments/hybrid_offline.py [ROLLOUTS]
"""
import os
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # OpenMP waiting as `python -m specviz`
os.environ.setdefault("GOMP_SPINCOUNT", "20000")     # sets it, before torch loads
import torch  # noqa: E402

from specviz.analysis.edr import evaluate, greedy_acceptance  # noqa: E402
from specviz.analysis.offline_eval import drafts_for, parse_drafters  # noqa: E402
from specviz.drafters import make_drafter  # noqa: E402
from specviz.models import load_target  # noqa: E402
from specviz.train.rollout_store import RolloutSet  # noqa: E402


def prefix_acceptance(a: torch.Tensor, K: int) -> torch.Tensor:
    """a [L, k] 0/1 slot acceptance -> [L, K] with 1 exactly on the accepted prefix (so the
    element-wise max of two drafters' is the longer accepted path of a round verifying both)."""
    a = torch.nn.functional.pad(a, (0, K - a.shape[1]))
    return a.cumprod(-1)


def main(folder: str = "runs/eval-rollouts") -> None:
    torch.manual_seed(0)
    target = load_target("default")
    rs = RolloutSet(folder)
    specs = parse_drafters("pld,dflash")
    drafters = {s.label: make_drafter(s.method, target, **s.params) for s in specs}
    agg = defaultdict(lambda: defaultdict(float))
    for i in range(len(rs)):
        t, _, p = rs.load(i)
        y = t[p:].tolist()
        if not y:
            continue
        a = {s.label: greedy_acceptance(drafts_for(s, drafters[s.label], target, rs, i), y)
             for s in specs}
        K = max(x.shape[1] for x in a.values())
        a = {k: prefix_acceptance(x, K) for k, x in a.items()}
        a["max"] = torch.maximum(a["pld"], a["dflash"])
        for cat in (rs.rows[i].get("category"), "all"):
            for k, x in a.items():   # 0/1 acceptance: the expected rounds are the rounds
                agg[cat][k] += evaluate(x).edr
            agg[cat]["tokens"] += len(y)
    print("| category | tokens | PLD tau | DFlash tau | max of both |\n|---|---|---|---|---|")
    for cat in sorted(agg, key=lambda c: (c == "all", c)):
        d = agg[cat]
        print(f"| {cat} | {int(d['tokens'])} | " + " | ".join(
            f"{d['tokens'] / d[k]:.3f}" for k in ("pld", "dflash", "max")) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:])
