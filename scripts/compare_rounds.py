"""Do two benches have the same rounds? Compare two ``bench_rows.csv`` files row by row.

A change that should not alter decoding (a refactor, a faster kernel) must reproduce every
(prompt, method) row's rounds (target forwards) and new tokens exactly; wall times may differ.
Use timing-independent settings on both sides (``--target-dtype float32``; AdaPLD
``cost=cpu``; DFlash-family ``cut=off``), since those choices otherwise follow the measured
machine.

    python scripts/compare_rounds.py BEFORE/bench_rows.csv AFTER/bench_rows.csv

Prints the count of equal rows and every row that differs; exits 1 when any differs.
"""
from __future__ import annotations

import csv
import sys


def read_rows(path: str) -> dict[tuple[str, str], tuple[int, int]]:
    """(prompt id, method) -> (rounds, new tokens)."""
    with open(path, newline="", encoding="utf-8") as f:
        return {(r["prompt_id"], r["method"]): (int(r["rounds"]), int(r["new_tokens"]))
                for r in csv.DictReader(f)}


def compare(before: dict, after: dict) -> list[str]:
    """One line per (prompt, method) row that is missing on a side or differs."""
    out = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if a != b:
            out.append(f"{key[0]} {key[1]}: before {a}, after {b} (rounds, new tokens)")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: python scripts/compare_rounds.py BEFORE.csv AFTER.csv", file=sys.stderr)
        return 2
    before, after = read_rows(argv[0]), read_rows(argv[1])
    diff = compare(before, after)
    print(f"{len(set(before) | set(after)) - len(diff)}/{len(set(before) | set(after))} "
          "(prompt, method) rows with the same rounds and new tokens; rounds "
          f"{sum(r for r, _ in before.values())} before, {sum(r for r, _ in after.values())} after")
    for line in diff:
        print(line)
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
