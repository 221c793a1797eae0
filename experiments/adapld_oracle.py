"""Upper bounds for copy drafting on cached greedy outputs: how far can lookup go?

    python experiments/adapld_oracle.py runs/adapld_dev [category]

For each category of OUT/rollouts.json (made by ``experiments/adapld_dev.py gen``), tau of
greedy rounds (accepted + 1 per round, drafts up to 64 tokens) when every round drafts:

* ``oracle``   the copy from anywhere in the context that stays *correct* longest (it knows
               the future: the bound for any copy drafter, including blind resyncs);
* ``aligned``  the best of the distinct copies that follow earlier occurrences of the last
               token (what a token tree of every lexical candidate could reach at most);
* ``longest``  one chain: the occurrence with the longest backward match (up to 32 tokens).

Copies may overlap the text they produce (an LZ77 copy).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

D = 64


def forward(y: list[int], n: int, s: int) -> int:
    """Accepted tokens of a copy from ``s`` at position ``n`` (y known: the overlap is y)."""
    k = 0
    while k < D and n + k < len(y) - 1 and y[s + k] == y[n + k]:
        k += 1
    return k


def aligned_sources(y: list[int], n: int) -> list[tuple[int, int]]:
    """(backward match length, start) of every s with y[s-1] == y[n-1], longest match first,
    one per distinct next token."""
    out = []
    for s in range(n - 1, 0, -1):
        if y[s - 1] != y[n - 1]:
            continue
        m = 1
        while m < 32 and s - 1 - m >= 0 and y[s - 1 - m] == y[n - 1 - m]:
            m += 1
        out.append((m, s))
    out.sort(key=lambda t: (-t[0], -t[1]))
    seen, distinct = set(), []
    for m, s in out:
        if y[s] not in seen:
            seen.add(y[s])
            distinct.append((m, s))
    return distinct


def tau(rows, policy) -> float:
    tok = rnd = 0
    for r in rows:
        y, n = r["tokens"], r["prompt_len"]
        while n < len(y):
            k = policy(y, n)
            n += k + 1
            tok += k + 1
            rnd += 1
    return tok / max(1, rnd)


POLICIES = {
    "oracle": lambda y, n: max([forward(y, n, s) for s in range(n)] or [0]),
    "aligned": lambda y, n: max([forward(y, n, s) for _, s in aligned_sources(y, n)] or [0]),
    "longest": lambda y, n: next((forward(y, n, s) for _, s in aligned_sources(y, n)), 0),
}


def main(out: str, category: str | None = None) -> None:
    rows = json.loads((Path(out) / "rollouts.json").read_text())
    cats = [category] if category else sorted({r["category"] for r in rows})
    print(f"{'category':16s}" + "".join(f"{p:>10s}" for p in POLICIES))
    for c in cats:
        sub = [r for r in rows if r["category"] == c]
        print(f"{c:16s}" + "".join(f"{tau(sub, f):10.2f}" for f in POLICIES.values()), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
