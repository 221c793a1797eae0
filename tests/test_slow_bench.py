"""The long benchmark (``bash scripts/test.sh -m slow``; not in the default run): every method
against plain decoding on the project's example prompts, as ``python -m specviz bench`` runs it,
on the embedded model. It checks what must hold on any machine -- greedy outputs identical to
AR's (or a genuine near-tie), fewer target forwards than AR, drafts that are accepted -- and
leaves the measured table (tau, forwards, wall speedup vs AR in the same run) and every trace in
test-artifacts/slow-bench/ for a reader; wall-clock figures depend on the machine and are
reported, not asserted."""
from __future__ import annotations

from pathlib import Path

import pytest

from specviz.bench import format_table, load_prompts, run_bench
from specviz.engine import DecodeSettings

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "test-artifacts" / "slow-bench"
METHODS = ["pld", "adapld", "dflash", "dspark", "retrace", "dflash_adapld"]

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_every_method_against_ar_on_the_example_prompts(embedded_target):
    prompts = load_prompts(ROOT / "examples" / "prompts.jsonl", limit=4)  # 4 per category
    assert len(prompts) >= 20
    res = run_bench(embedded_target, METHODS, prompts, DecodeSettings(max_new_tokens=64),
                    traces_dir=OUT / "traces")
    res.save(OUT)
    table = res.table()
    print("\n" + format_table(table))
    verdict = res.verdict()
    assert verdict.compared == len(METHODS) * len(prompts) and verdict.ok, verdict
    every = {r["method"]: r for r in table if r["category"] == "all"}
    ar = every["ar"]
    assert ar["tau"] == 1.0 and ar["target_forwards"] == ar["new_tokens"]
    for m in METHODS:
        row = every[m]
        assert row["new_tokens"] == ar["new_tokens"], m      # the same text, token for token
        assert row["target_forwards"] < ar["target_forwards"], m
        assert row["tau"] > 1.1, (m, row["tau"])             # its drafts were accepted
        assert row["speedup_vs_ar"] is not None and row["speedup_vs_ar"] > 0, m
    # verifying DFlash's block and AdaPLD's lookup in one forward accepts at least as much per
    # round as either drafter alone can on the same text (the longer accepted path wins)
    assert every["dflash_adapld"]["tau"] >= 0.95 * max(every["dflash"]["tau"],
                                                      every["adapld"]["tau"])
    assert (OUT / "bench_table.csv").exists() and any((OUT / "traces" / "dflash").rglob("*.json"))
