"""AdaPLD development harness: offline replay of drafter variants against cached greedy outputs.

Dev prompts only (none the README's benches use): Spec-Bench rows 20-27 of each category,
GSM8K rows 3000-3019, MBPP rows 400-419, code-editing prompts from MBPP rows 600-639 (rows
700-719 became a bench slice, so they are no longer dev prompts).

    python experiments/adapld_dev.py gen  runs/adapld_dev          # AR outputs (~10 min)
    python experiments/adapld_dev.py from-traces runs/adapld_dev BENCH_OUT ...  # or: the AR traces
        # of `specviz bench --save-traces` runs on dev prompts (+ a fresh calibration)
    python experiments/adapld_dev.py eval runs/adapld_dev pld adapld adapld_lex \
        'adapld:semantic=off' ...

Simulated speed = AR cost / method cost per category, cost = sum over rounds of
step * c(tokens in the verify forward) + draft time (+ the drafter's begin time), with c the
verify-cost curve measured on this machine (saved once in OUT/cost.json so every variant is
judged on the same clock). Greedy verification makes tau exact; the clock is a model.
"""
from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install
from specviz.analysis.replay import Rollout, replay  # noqa: E402
from specviz.bench import load_prompts  # noqa: E402
from specviz.costs import CostModel, calibrate, pin_model  # noqa: E402
from specviz.drafters import make_drafter, method_spec  # noqa: E402
from specviz.editset import load_edit_prompts  # noqa: E402
from specviz.engine import DecodeSettings, Session  # noqa: E402
from specviz.models import load_target  # noqa: E402

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def dev_prompts():
    sb = load_prompts(DATA / "spec_bench_dev.jsonl", limit=28)
    by_cat = defaultdict(list)
    for it in sb:
        by_cat[it.category].append(it)
    items = [it for cat in by_cat.values() for it in cat[20:28]]
    gsm = load_prompts(DATA / "gsm8k_train.jsonl")
    items += gsm[3000:3020]
    mbpp = load_prompts(DATA / "mbpp.jsonl")
    items += mbpp[400:420]
    items += load_edit_prompts(DATA / "mbpp.jsonl", 40, 0, 600)
    return items


def gen(out: Path, max_new: int = 64) -> None:
    out.mkdir(parents=True, exist_ok=True)
    target = load_target("default")
    rows = []
    for i, it in enumerate(dev_prompts()):
        s = Session(target, make_drafter("ar", target), it.text,
                    DecodeSettings(max_new_tokens=max_new), method="ar")
        s.run()
        rows.append({"id": it.id, "category": it.category, "tokens": s.tokens,
                     "prompt_len": len(s.prompt_ids)})
        print(i, it.category, len(s.generated), flush=True)
    (out / "rollouts.json").write_text(json.dumps(rows))
    cost = calibrate(target)
    (out / "cost.json").write_text(json.dumps(cost.to_dict()))


def from_traces(out: Path, benches: list[str]) -> None:
    """rollouts.json from the AR traces saved by ``specviz bench --save-traces`` (dev prompts
    only), and cost.json from a calibration on this machine now."""
    from specviz.trace import Trace
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for b in benches:
        for f in sorted(Path(b, "traces", "ar").glob("*/*")):
            t = Trace.load(f)
            toks = list(t.prompt_ids) + [x for r in t.rounds for x in r.committed]
            rows.append({"id": f.stem, "category": f.parent.name, "tokens": toks,
                         "prompt_len": len(t.prompt_ids)})
    (out / "rollouts.json").write_text(json.dumps(rows))
    cost = calibrate(load_target("default"))
    (out / "cost.json").write_text(json.dumps(cost.to_dict()))
    print(len(rows), "rollouts;", "curve", [(k, round(cost.relative(k), 2)) for k in (1, 2, 8, 16)])


def parse_variant(v: str) -> tuple[str, dict]:
    """``method:key=value,key=value`` -> (method, typed settings), as ``--param`` parses them."""
    method, _, rest = v.partition(":")
    return method, method_spec(method).parse([kv for kv in rest.split(",") if kv])


def trace_cost(rounds, cost: CostModel) -> float:
    """Seconds a replayed run would take on the clock ``cost``: every round's verify forward
    (step * c(tokens in it)) plus its measured drafting time."""
    return sum(cost.step_time * cost.relative(len(x.draft) + 1) + x.t_draft for x in rounds)


def evaluate(out: Path, variants: list[str]) -> None:
    rows = json.loads((out / "rollouts.json").read_text())
    cost = CostModel.from_dict(json.loads((out / "cost.json").read_text()))
    step = cost.step_time
    target = load_target("default")
    pin_model(target, cost)   # every variant on the same saved clock
    cats = sorted({r["category"] for r in rows})
    print("curve", [(k, round(cost.relative(k), 2)) for k in (1, 2, 4, 8, 16, 32, 64)],
          "step", round(step * 1e3, 1), "ms")
    print(f"{'variant':44s}" + "".join(f"{c[:10]:>17s}" for c in cats + ["all"]))
    for v in variants:
        method, params = parse_variant(v)
        agg = defaultdict(lambda: [0, 0, 0.0, 0.0])  # tokens, rounds, ar cost, cost
        spent = [0.0, 0.0]  # begin, draft seconds
        for r in rows:
            d = make_drafter(method, target, **params)
            began = [0.0]

            def begin(*a, _begin=d.begin, **k):   # the drafter's start-up cost counts too
                t = time.perf_counter()
                _begin(*a, **k)
                began[0] += time.perf_counter() - t
            d.begin = begin
            tr = replay(d, Rollout(r["tokens"], r["prompt_len"]), target, token_texts=False)
            n = sum(len(x.committed) for x in tr.rounds)
            drafting = sum(x.t_draft for x in tr.rounds)
            c = began[0] + trace_cost(tr.rounds, cost)
            spent[0] += began[0]
            spent[1] += drafting
            for key in (r["category"], "all"):
                a = agg[key]
                a[0] += n
                a[1] += len(tr.rounds)
                a[2] += n * step
                a[3] += c
        cells = "".join(f"{agg[c][0] / max(1, agg[c][1]):7.2f} /{agg[c][2] / max(1e-9, agg[c][3]):5.2f}x  "
                        for c in cats + ["all"])
        print(f"{v:44s}{cells}  begin {spent[0]:.1f}s draft {spent[1]:.1f}s", flush=True)


if __name__ == "__main__":
    cmd, out = sys.argv[1], Path(sys.argv[2])
    if cmd == "gen":
        gen(out)
    elif cmd == "from-traces":
        from_traces(out, sys.argv[3:])
    else:
        evaluate(out, sys.argv[3:])
