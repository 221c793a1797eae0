"""Prompt-set loaders and the side-by-side benchmark runner (the metrics of :mod:`specviz.metrics`).

Every method runs on the same prompts in one process, interleaved prompt by prompt with the
plain autoregressive baseline (AR), so the speedup is measured in the same run on the same
machine state. Per method and category (definitions: :mod:`specviz.metrics`): tau
(committed tokens per round), target forward passes, tokens/s, wall-clock speedup vs AR, and
(greedy) whether the output equals AR's token for token.
"""
from __future__ import annotations

import csv
import json
import re
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from . import metrics
from .analysis.lossless import LosslessReport, LosslessVerdict, lossless_verdict
from .errors import SpecvizError
from .provenance import provenance


@dataclass
class PromptItem:
    id: str
    category: str
    text: str
    source: str = ""


def _row_to_prompt(row: dict, i: int, source: str) -> PromptItem | None:
    """Recognise the public formats: Spec-Bench, GSM8K, MBPP, Alpaca seed tasks, specviz examples.
    """
    if "turns" in row:  # Spec-Bench question.jsonl
        turns = row["turns"] or []
        if not turns:
            return None
        return PromptItem(str(row.get("question_id", i)), str(row.get("category", "spec_bench")),
                          str(turns[0]), source)
    if "question" in row and "answer" in row:  # GSM8K
        return PromptItem(f"gsm8k-{i}", "gsm8k", str(row["question"]), source)
    if "text" in row and ("code" in row or "test_list" in row):  # MBPP
        tests = row.get("test_list") or []
        text = str(row["text"])
        if tests:
            text += "\nYour code should pass this test:\n" + str(tests[0])
        return PromptItem(f"mbpp-{row.get('task_id', i)}", "mbpp", text, source)
    if "instruction" in row:  # Alpaca seed tasks
        text = str(row["instruction"])
        inst = row.get("instances") or []
        if inst and isinstance(inst[0], dict) and str(inst[0].get("input", "")).strip():
            text += "\n\n" + str(inst[0]["input"])
        return PromptItem(str(row.get("id", f"alpaca-{i}")), "alpaca", text, source)
    if "prompt" in row:  # specviz examples/prompts.jsonl or any {"prompt": ...} file
        return PromptItem(str(row.get("id", i)), str(row.get("category", "prompts")),
                          str(row["prompt"]), source)
    return None


def jsonl_rows(path: Path, text: str | None = None):
    """(raw row, PromptItem) of every line of a prompts .jsonl file; a bad line raises a
    SpecvizError naming the file and line."""
    if text is None:
        text = path.read_text(encoding="utf-8", errors="replace")
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecvizError(f"{path}:{i + 1} is not valid JSON ({exc.msg})") from exc
        item = _row_to_prompt(row, i, path.name) if isinstance(row, dict) else None
        if item is None:
            raise SpecvizError(f"{path}:{i + 1}: unrecognised prompt format "
                               "(expected Spec-Bench, GSM8K, MBPP, Alpaca or {'prompt': ...})")
        yield row, item


def load_prompts(path: str | Path, limit: int | None = None,
                 categories: Iterable[str] | None = None) -> list[PromptItem]:
    """Load prompts from a .jsonl file (formats above) or a plain-text file (one prompt per
    line; category = file stem). ``limit`` keeps the first N prompts of EACH category."""
    path = Path(path)
    if not path.exists():
        raise SpecvizError(f"prompt file {path} does not exist")
    if limit is not None and limit <= 0:
        raise SpecvizError("--limit must be at least 1")
    items: list[PromptItem] = []
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix in (".jsonl", ".json"):
        items = [item for _, item in jsonl_rows(path, text)]
    else:
        items = [PromptItem(f"{path.stem}-{i}", path.stem, line.strip(), path.name)
                 for i, line in enumerate(text.splitlines()) if line.strip()]
    wanted = set(categories) if categories else None
    counts: dict[str, int] = defaultdict(int)
    out = []
    for it in items:
        if wanted and it.category not in wanted:
            continue
        if limit is not None and counts[it.category] >= limit:
            continue
        counts[it.category] += 1
        out.append(it)
    if not out:
        raise SpecvizError(f"no prompts selected from {path}")
    return out


@dataclass
class BenchRow:
    prompt_id: str
    category: str
    method: str
    rounds: int
    new_tokens: int
    accepted: int
    tau: float
    wall_s: float          # prefill + decode
    decode_s: float
    identical_to_ar: bool | None = None
    near_tie: bool | None = None


def bench_row(item: PromptItem, method: str, rounds: list, output_ids: list[int],
              wall_s: float) -> BenchRow:
    """The row of one (prompt, method) run from its rounds and generated tokens."""
    return BenchRow(prompt_id=item.id, category=item.category, method=method,
                    rounds=metrics.target_forwards(rounds), new_tokens=len(output_ids),
                    accepted=sum(r.accepted for r in rounds),
                    tau=metrics.tau(len(output_ids), len(rounds)),
                    wall_s=wall_s, decode_s=sum(r.t_draft + r.t_verify for r in rounds))


@dataclass
class BenchResult:
    rows: list[BenchRow] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def table(self) -> list[dict]:
        """Aggregate per (method, category) plus an 'all' row per method."""
        groups: dict[tuple[str, str], list[BenchRow]] = defaultdict(list)
        for r in self.rows:
            groups[(r.method, r.category)].append(r)
            groups[(r.method, "all")].append(r)
        ar_wall = {cat: sum(r.wall_s for r in rs) for (m, cat), rs in groups.items() if m == "ar"}
        out = []
        methods = list(dict.fromkeys(r.method for r in self.rows))
        cats = list(dict.fromkeys(r.category for r in self.rows)) + ["all"]
        for m in methods:
            for cat in cats:
                rs = groups.get((m, cat))
                if not rs:
                    continue
                out.append(_table_row(m, cat, rs, ar_wall.get(cat)))
        return out

    def verdict(self) -> LosslessVerdict:
        """Lossless verdict over every non-AR run (greedy; near-ties as checked by run_bench)."""
        greedy = float((self.meta.get("settings") or {}).get("temperature", 0.0) or 0.0) == 0
        return lossless_verdict(
            (LosslessReport(r.identical_to_ar, near_tie=bool(r.near_tie))
             for r in self.rows if r.identical_to_ar is not None), greedy=greedy)

    def save(self, out_dir: str | Path) -> dict[str, Path]:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"table_csv": out / "bench_table.csv", "rows_csv": out / "bench_rows.csv",
                 "json": out / "bench.json"}
        table = self.table()
        _write_csv(paths["table_csv"], table)
        _write_csv(paths["rows_csv"], [asdict(r) for r in self.rows])
        paths["json"].write_text(json.dumps({"meta": self.meta, "table": table,
                                             "rows": [asdict(r) for r in self.rows]}, indent=1))
        return paths


def _table_row(method: str, category: str, rs: list[BenchRow], ar_wall: float | None) -> dict:
    """One aggregate row of :meth:`BenchResult.table` (metrics: specviz.metrics)."""
    toks = sum(r.new_tokens for r in rs)
    forwards = sum(r.rounds for r in rs)
    wall = sum(r.wall_s for r in rs)
    tps = metrics.tokens_per_s(toks, sum(r.decode_s for r in rs))
    speed = metrics.speedup(ar_wall, wall)
    verdict = lossless_verdict(r.identical_to_ar for r in rs)
    return {
        "method": method, "category": category, "prompts": len(rs),
        "tau": round(metrics.tau(toks, forwards), 3),
        "target_forwards": forwards,
        "new_tokens": toks,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tps, 2) if tps is not None else 0.0,
        "speedup_vs_ar": round(speed, 3) if speed is not None else None,
        "identical_to_ar": verdict.count,
    }


def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        path.write_text("")
        return
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)


def format_table(table: list[dict]) -> str:
    """Plain-text (markdown) rendering of :meth:`BenchResult.table`."""
    if not table:
        return "(empty)"
    cols = list(table[0].keys())
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in table:
        lines.append("| " + " | ".join("" if row[c] is None else str(row[c]) for c in cols) + " |")
    return "\n".join(lines)


def check_methods(methods: list[str], method_params: dict | None = None) -> dict[str, dict]:
    """Fail fast, before any model is loaded: every method (and every method given settings)
    is registered and the settings of those that run are valid. Returns the run methods'
    settings, typed by the registry."""
    from .drafters import method_spec
    from .errors import SettingsError

    method_params = method_params or {}
    if not isinstance(method_params, dict) or \
            not all(isinstance(v, dict) for v in method_params.values()):
        raise SettingsError("method settings must map each method to its settings, like "
                           "{\"pld\": {\"num_output_tokens\": 5}}")
    for m in method_params:
        method_spec(m)
    return {m: method_spec(m).check(method_params.get(m, {})) for m in dict.fromkeys(methods)}


def iter_side_by_side(target, methods: list[str], prompts: list[PromptItem], settings,
                      method_params: dict[str, dict] | None = None, baseline: str = "ar",
                      on_tokens: Callable[[int, int, str, PromptItem, int], None] | None = None):
    """Run ``baseline`` then every method on each prompt (interleaved, so each method is timed
    under the same machine state as its baseline). Yields ``(item, method, session, wall_s)``;
    ``on_tokens(generated, max_new_tokens, method, item, runs_done)`` reports progress."""
    from .costs import cost_curve
    from .drafters import make_drafter
    from .engine import Session

    order = [baseline] + [m for m in dict.fromkeys(m.strip().lower() for m in methods)
                          if m and m != baseline]
    method_params = check_methods(order, method_params)
    for m in order:  # fail fast on what only a built drafter checks (checkpoints, cross-checks)
        make_drafter(m, target, **method_params.get(m, {}))
    # the verify-cost model (<= 1.5 s, once per process) is measured before the first timed run,
    # so no method's first prompt pays for it
    cost_curve("auto", target)
    done = 0
    for item in prompts:
        for m in order:
            drafter = make_drafter(m, target, **method_params.get(m, {}))
            cb = (lambda g, n, m=m, item=item, done=done: on_tokens(g, n, m, item, done)) \
                if on_tokens else None
            if cb:
                cb(0, settings.max_new_tokens)
            t0 = time.perf_counter()
            sess = Session(target, drafter, item.text, settings, method=m)
            sess.run(progress=cb)
            wall = time.perf_counter() - t0
            done += 1
            yield item, m, sess, wall


def run_bench(target, methods: list[str], prompts: list[PromptItem], settings,
              method_params: dict[str, dict] | None = None,
              progress: Callable[[int, int, str], None] | None = None,
              check_near_ties: bool = True, traces_dir: str | Path | None = None,
              extra_runs: Callable[[PromptItem], Iterable[tuple[str, object, float]]] | None
              = None) -> BenchResult:
    """Run AR plus every method on every prompt (interleaved), returning per-prompt rows;
    ``traces_dir``: also save every run's trace as ``{method}/{category}/{prompt id}.json``
    (for the alignment analysis and the app's trace pages). ``extra_runs(item)`` yields
    ``(method, trace, wall_s)`` of runs made elsewhere on the same prompt (a served endpoint,
    :mod:`specviz.served.bench`; its ``labels`` attribute names them), right after that
    prompt's local runs; they are compared with AR and recorded like the local ones."""
    from .analysis.lossless import compare_outputs

    order = ["ar"] + [m for m in dict.fromkeys(m.strip().lower() for m in methods) if m and m != "ar"]
    result = BenchResult(meta={"model": target.name, "methods": order,
                               "settings": asdict(settings), "prompts": len(prompts),
                               "device": target.device,
                               "dtype": str(target.dtype).replace("torch.", ""),
                               "numerics": getattr(target.numerics, "summary", lambda: None)(),
                               "kernels": getattr(target.kernels, "summary", lambda: None)(),
                               "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                               "provenance": provenance()})
    extra = list(getattr(extra_runs, "labels", []))   # the served runs' method names
    result.meta["methods"] = order + extra
    total = (len(order) + len(extra)) * len(prompts)
    ar_ids: list[int] = []

    def record(item, m, rounds, prompt_ids, out_ids, wall, make_trace):
        nonlocal ar_ids
        row = bench_row(item, m, rounds, out_ids, wall)
        if m == "ar":
            ar_ids = out_ids
        elif settings.greedy:
            row.identical_to_ar = out_ids == ar_ids
            if check_near_ties and not row.identical_to_ar:
                row.near_tie = compare_outputs(target, prompt_ids, ar_ids, out_ids).near_tie
        result.rows.append(row)
        hist = result.meta.setdefault("accepted_length_histogram", {}).setdefault(m, {})
        for r in rounds:
            hist[str(len(r.committed))] = hist.get(str(len(r.committed)), 0) + 1
        if traces_dir is not None:
            folder = Path(traces_dir) / m / (item.category or "prompts")
            folder.mkdir(parents=True, exist_ok=True)
            make_trace().save(folder / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', str(item.id))}.json")
        if progress:
            progress(len(result.rows), total, f"{m} on {item.id}")

    for item, m, sess, wall in iter_side_by_side(target, order, prompts, settings, method_params):
        record(item, m, sess.rounds, sess.prompt_ids, sess.generated, wall, sess.trace)
        if extra_runs is not None and m == order[-1]:
            for label, trace, xwall in extra_runs(item):
                record(item, label, trace.rounds, trace.prompt_ids, trace.output_ids, xwall,
                       lambda trace=trace: trace)
    from .costs import cached_model

    curve = cached_model(target)   # measured before the first run, refined by every round
    if curve is not None:
        result.meta["verify_cost"] = {"points": [[k, round(c, 3)] for k, c in curve.points()],
                                      "step_ms": round(curve.step_time * 1e3, 2),
                                      "kind": curve.kind}
    return result
