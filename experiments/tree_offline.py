"""How much does verifying a DFlash block as a token tree gain? Exact offline estimate.

For every state n of every cached greedy rollout (runs/eval-rollouts by default: the 88
held-out replies), the bundled drafter's block at that state (one batched drafter forward per
96 states), its slots' top-4 words, and the best-first tree of N nodes
(specviz.drafters.dflash.block_tree, raw probabilities: ``cut="off"``); the accepted length is the
deepest node on the rollout's path -- exact under greedy verification. N = 0 is the chain
(the block's argmax, all slots). Rounds follow n -> n + accepted + 1, so tau = tokens / rounds
is the tau of a real greedy run with ``cut="off", tree=N`` on those prompts.

    python experiments/tree_offline.py [ROLLOUTS] [N ...]     # default N: 0 4 7 10 16 30
"""
import os
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # OpenMP waiting as `python -m specviz`
os.environ.setdefault("GOMP_SPINCOUNT", "20000")     # sets it, before torch loads
import torch  # noqa: E402

from specviz.drafters import make_drafter  # noqa: E402
from specviz.drafters.dflash.block_tree import TREE_TOPK, best_first  # noqa: E402
from specviz.drafters.dflash.offline import (block_embeddings, forward_blocks,  # noqa: E402
                                             sequence_context)
from specviz.models import load_target  # noqa: E402
from specviz.train.rollout_store import RolloutSet  # noqa: E402

CHUNK = 96


def deepest_match(nodes, ids, y, n) -> int:
    """Depth of the deepest node whose path is y[n], y[n+1], ... (greedy acceptance)."""
    ok, best = {}, 0
    for i, node in enumerate(nodes):
        good = (node.parent < 0 or ok[node.parent]) and ids[node.slot - 1][node.rank] == \
            y[n + node.slot - 1]
        ok[i] = good
        if good:
            best = max(best, node.slot)
    return best


def chain_match(ids, y, n, k) -> int:
    a = 0
    while a < k and ids[a][0] == y[n + a]:
        a += 1
    return a


@torch.no_grad()
def accepted_lengths(model, target, tokens, hidden, P, budgets) -> dict[int, list[int]]:
    T = int(tokens.shape[0])
    L, B = T - P, model.block_size
    head = target.model.get_output_embeddings()
    ctx_kv = sequence_context(model, hidden, T - 1)
    y = tokens[P:].tolist()
    acc = {N: [0] * L for N in budgets}
    for s in range(0, L, CHUNK):
        anchors = torch.arange(P - 1 + s, P - 1 + min(L, s + CHUNK))
        h = forward_blocks(model, block_embeddings(model, target, tokens[anchors], B), anchors,
                           ctx_kv)[:, 1:B]
        probs = torch.softmax(model.draft_scores(h, head, None).float(), -1)
        tp, ti = probs.topk(TREE_TOPK, -1)
        if model.draft_vocab is not None:
            ti = model.draft_vocab[ti]
        tp, ti = tp.tolist(), ti.tolist()
        for j, n in enumerate(range(s, min(L, s + CHUNK))):
            k = max(0, min(B - 1, L - n - 1))     # the budget: a round never passes the end
            if k == 0:
                continue
            for N in budgets:
                acc[N][n] = chain_match(ti[j], y, n, k) if N == 0 else \
                    deepest_match(best_first(tp[j][:k], N), ti[j], y, n)
    return acc


def main(folder: str = "runs/eval-rollouts", *budgets: str) -> None:
    budgets = [int(b) for b in budgets] or [0, 4, 7, 10, 16, 30]
    torch.manual_seed(0)
    target = load_target("default")
    rs = RolloutSet(folder)
    model = make_drafter("dflash", target, cut="off").model
    agg = defaultdict(lambda: defaultdict(float))
    for i in range(len(rs)):
        tokens, hidden, P = rs.load(i)
        acc = accepted_lengths(model, target, tokens, hidden, P, budgets)
        L = int(tokens.shape[0]) - P
        for cat in (rs.rows[i].get("category"), "all"):
            agg[cat]["tokens"] += L
            for N, a in acc.items():
                n = 0
                while n < L:
                    n += a[n] + 1
                    agg[cat][N] += 1
    print("| category | tokens | " + " | ".join("chain" if N == 0 else f"tree {N}"
                                                 for N in budgets) + " |")
    print("|---" * (len(budgets) + 2) + "|")
    for cat in sorted(agg, key=lambda c: (c == "all", c)):
        d = agg[cat]
        print(f"| {cat} | {int(d['tokens'])} | " + " | ".join(
            f"{d['tokens'] / d[N]:.3f}" for N in budgets) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:])
