"""Command line: ``python -m specviz run | bench | show | align | prepare | train ... | eval``.

This module holds the entry point (:func:`main`, :func:`build_parser`) and the decoding side
(run, show, bench, align, prepare); the ``train`` data commands are in :mod:`specviz.cli_data`,
training and ``eval`` in :mod:`specviz.cli_train`.

``run`` decodes one prompt and prints the text coloured by what happened to each token
(green: accepted draft token, yellow: the target's correction, cyan: bonus token after a fully
accepted draft, red struck-through: the rejected suffix, shown where it was rejected).
Every user error prints one line ``error: ...`` and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cli_data import (add_train_prefill, add_train_prompts, add_train_rollouts,
                       add_train_soft_labels, add_train_store)
from .cli_served import (add_bench_endpoints, add_serve_vllm, add_served, endpoint_runs,
                         served_throughput)
from .cli_train import (add_eval, add_train_dflash, add_train_finetune, add_train_gate_probe,
                        add_train_retrace)
from .cli_common import (common_args, display_args, load_decoding_target, pin_revision,
                         print_run, print_summary, read_prompt, render_terminal, revision_arg,
                         run_settings)
from .errors import SpecvizError

def parse_params(method: str, pairs: list[str] | None) -> dict:
    """``--param key=value`` pairs of ``method`` → its settings, each typed by the method's
    registry entry (an unknown key lists the valid ones)."""
    from .drafters import method_spec

    return method_spec(method).parse(pairs)


def cmd_prepare(args) -> int:
    from .models import embedded_model_dir

    path = embedded_model_dir()
    print(f"embedded model ready: {path}")
    return 0


def cmd_run(args) -> int:
    from .drafters import make_drafter
    from .engine import Session

    settings = run_settings(args)
    prompt = read_prompt(args)
    params = parse_params(args.method, args.param)
    params = pin_revision({args.method: params}, args.revision)[args.method]
    target = load_decoding_target(args)
    drafter = make_drafter(args.method, target, **params)
    sess = Session(target, drafter, prompt, settings, method=args.method)
    trace = sess.run()
    print_run(args, trace)
    if args.save:
        path = trace.save(args.save)
        print(f"trace saved to {path}")
    return 0


def cmd_show(args) -> int:
    from .trace import Trace

    trace = Trace.load(args.trace)
    color = sys.stdout.isatty() and not args.no_color or args.color
    print(render_terminal(trace, color=color, show_rejected=not args.hide_rejected))
    print_summary(trace)
    return 0


def cmd_bench(args) -> int:
    """``specviz bench``: each method (and plain decoding) on each prompt; table and files."""
    from .bench import check_methods, run_bench
    from .engine import DecodeSettings

    settings = DecodeSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              top_p=args.top_p, seed=args.seed).validate()
    prompts = _bench_prompts(args)
    methods = [m.strip().lower() for m in args.methods.split(",") if m.strip()]
    # the registry's checks, before the model loads
    params = pin_revision(check_methods(methods, _bench_params(args)), args.revision)
    target = load_decoding_target(args)
    served = endpoint_runs(args, target, settings)   # checked before the long run; None: none
    runs = len(set(methods) | {"ar"}) + len(served.labels if served else [])
    bar, progress = _progress_bar(len(prompts) * runs)
    result = run_bench(target, methods, prompts, settings, method_params=params, progress=progress,
                       traces_dir=Path(args.out) / "traces" if args.save_traces else None,
                       extra_runs=served)
    bar.close()
    if served:
        served_throughput(args, target, served, prompts, settings, result)
    _print_bench(result, result.save(args.out))
    return 0


def _bench_prompts(args) -> list:
    """The bench's prompts from ``--data``: files (``FILE:N`` overrides ``--limit`` for that
    file) and ``edit:MBPP_FILE[:N[:START]]`` -> the code-editing prompt set."""
    from .bench import load_prompts

    prompts = []
    for d in args.data:
        if d.startswith("edit:"):  # edit:MBPP_FILE[:N[:START]] -> the code-editing prompt set
            from .editset import load_edit_spec

            prompts += load_edit_spec(d)
            continue
        limit = args.limit
        head, _, tail = d.rpartition(":")
        if head and tail.isdigit():  # FILE:N overrides --limit for that file
            d, limit = head, int(tail)
        prompts += load_prompts(d, limit=limit,
                                categories=args.categories.split(",") if args.categories else None)
    return prompts


def _bench_params(args) -> dict:
    """``--params``: a JSON object of per-method settings (SpecvizError otherwise)."""
    try:
        params = json.loads(args.params) if args.params else {}
    except json.JSONDecodeError as exc:
        raise SpecvizError(f"--params is not valid JSON ({exc})") from None
    if not isinstance(params, dict):
        raise SpecvizError("--params must be a JSON object like '{\"pld\": {\"num_output_tokens\": 5}}'")
    return params


def _progress_bar(runs: int):
    """(a tqdm bar over the bench's runs, the ``progress(done, total, what)`` that moves it)."""
    from tqdm.auto import tqdm

    bar = tqdm(total=runs, desc="bench", unit="run")

    def progress(done, total, what):
        bar.total = total
        bar.n = done
        bar.set_postfix_str(what)
        bar.refresh()

    return bar, progress


def _print_bench(result, paths: dict) -> None:
    """The bench's table, verdict, measured verify cost and the files written."""
    from .bench import format_table

    print(format_table(result.table()))
    print(result.verdict().message)
    print("accepted length (tokens committed per round): share of rounds")
    for m, hist in (result.meta.get("accepted_length_histogram") or {}).items():
        n = sum(hist.values()) or 1
        print(f"  {m:<14}" + "  ".join(f"{k}:{v / n:.0%}" for k, v in
                                        sorted(hist.items(), key=lambda kv: int(kv[0]))))
    if result.meta.get("throughput"):
        print("served throughput (every prompt once, N requests in flight)")
        print(format_table(result.meta["throughput"]))
    vc = result.meta.get("verify_cost")
    if vc:
        print(f"verify cost on this machine ({vc['kind']}; a one-token step {vc['step_ms']} ms): "
              + ", ".join(f"c({k}) {c:.2f}" for k, c in vc["points"]))
    print("written: " + ", ".join(str(p) for p in paths.values()))


def cmd_align(args) -> int:
    import csv

    from .analysis.alignment import table_rows
    from .analysis.suffix_bound import bound_rows
    from .provenance import provenance
    from .trace import Trace

    prov = provenance()
    root = Path(args.traces)
    if not root.is_dir():
        raise SpecvizError(f"{root} is not a folder of traces (bench --save-traces writes one)")
    traces: dict = {}
    for f in sorted(root.glob("*/*/*.json")):
        method, cat = f.parent.parent.name, f.parent.name
        traces.setdefault(method, {}).setdefault(cat, []).append(Trace.load(f))
    if not traces:
        raise SpecvizError(f"no traces under {root}/METHOD/CATEGORY/*.json")
    rows = table_rows(traces)
    fmt = lambda x: "—" if x is None else f"{x:.1%}"  # noqa: E731
    print(f"{'method':<10}{'slot':<22}{'rejected':>9}{'exact':>8}{'best off':>9}{'top-k':>8}"
          f"{'partner':>9}")
    for r in rows:
        print(f"{r['method']:<10}{str(r['slot']):<22}{r['rejected']:>9}{fmt(r['exact']):>8}"
              f"{fmt(r['best_offset']):>9}{fmt(r['topk']):>8}{fmt(r['partner']):>9}")
    every = bound_rows(traces)
    bound = [r for r in every if r["carried"]] or every
    print("\nWhat the rejected suffix could add in the next round, from its first miss on "
          "(tokens per offset; first-order tau bound)")
    offs = [k for k in bound[0] if k.startswith("gain_")]
    print(f"{'method':<14}{'category':<16}{'rounds':>7}{'tau':>7}{'carried':>8}"
          + "".join(f"{k[5:]:>7}" for k in offs) + f"{'tau bound':>10}")
    num = lambda x: "—" if x is None else f"{x:.3f}"  # noqa: E731
    for r in bound:
        print(f"{r['method']:<14}{r['category']:<16}{r['rounds']:>7}{num(r['tau']):>7}"
              f"{r['carried']:>8}" + "".join(f"{r[k]:>7}" for k in offs)
              + f"{num(r['tau_bound']):>10}")
    for path, table in ((args.out, rows), (args.bound_out, bound)):
        if path:
            with open(path, "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=list(table[0]))
                w.writeheader()
                w.writerows(table)
            # a CSV holds no metadata: where and how it was made goes beside it
            side = Path(path).with_suffix(".provenance.json")
            side.write_text(json.dumps(prov, indent=1) + "\n")
    return 0


def _add_run(sub, methods: str, epilog: str) -> None:
    p = sub.add_parser("run", help="decode one prompt and show accepted/rejected tokens",
                       epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(p)
    p.add_argument("--method", default="pld", help=f"one of: {methods} (default pld)")
    p.add_argument("--prompt")
    p.add_argument("--prompt-file")
    p.add_argument("--param", action="append",
                   help="method setting key=value (repeatable; the method's settings are listed "
                        "below)")
    revision_arg(p)
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--save", help="write the trace JSON here")
    display_args(p)
    p.set_defaults(func=cmd_run)


def _add_show_and_bench(sub, methods: str, epilog: str) -> None:
    p = sub.add_parser("show", help="print a saved trace")
    p.add_argument("trace")
    display_args(p)
    p.set_defaults(func=cmd_show)
    p = sub.add_parser("bench", help="run methods side by side with the AR baseline",
                       epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(p)
    p.add_argument("--methods", default="ar,pld",
                   help=f"comma-separated, from: {methods} (AR always runs); METHOD@LABEL runs "
                   "a method again under another name with its own --params, e.g. "
                   "dflash,dflash@new")
    p.add_argument("--data", action="append", required=True,
                   help="prompt file (Spec-Bench, GSM8K, MBPP, Alpaca jsonl, examples, or .txt); "
                   "FILE:N keeps N prompts per category of that file; edit:MBPP_FILE[:N[:START]] "
                   "builds N code-editing prompts from MBPP rows START on; repeatable")
    p.add_argument("--limit", type=int, default=None, help="first N prompts per category")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep")
    p.add_argument("--params", default=None,
                   help="JSON: per-method settings, e.g. '{\"pld\": {\"num_output_tokens\": 5}}'")
    revision_arg(p)
    p.add_argument("--out", default="bench-out")
    p.add_argument("--save-traces", action="store_true",
                   help="also save every run's trace under OUT/traces/METHOD/CATEGORY/")
    add_bench_endpoints(p)
    p.set_defaults(func=cmd_bench)


def _add_align(sub) -> None:
    p = sub.add_parser("align", help="rejected-suffix alignment table of saved bench traces")
    p.add_argument("traces", help="a folder METHOD/CATEGORY/*.json (bench --save-traces)")
    p.add_argument("--out", default=None, help="also write the table as CSV here")
    p.add_argument("--bound-out", default=None,
                   help="also write the rejected-suffix branch bound (second table) as CSV here")
    p.set_defaults(func=cmd_align)


def build_parser() -> argparse.ArgumentParser:
    from .drafters import METHODS
    from .drafters.docs import methods_text

    ap = argparse.ArgumentParser(prog="python -m specviz",
                                 description="Speculative decoding, step by step.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    methods, epilog = ", ".join(METHODS), methods_text()
    _add_run(sub, methods, epilog)
    _add_show_and_bench(sub, methods, epilog)
    add_eval(sub)
    _add_align(sub)
    tsub = sub.add_parser("train", help="make rollouts / train a drafter (docs/methods/dflash.md)"
                          ).add_subparsers(dest="train_cmd", required=True)
    add_train_rollouts(tsub)
    add_train_prompts(tsub)
    add_train_prefill(tsub)
    add_train_soft_labels(tsub)
    add_train_store(tsub)
    add_train_dflash(tsub)
    add_train_retrace(tsub)
    add_train_gate_probe(tsub)
    add_train_finetune(tsub)
    add_serve_vllm(sub)
    add_served(sub)
    sub.add_parser("prepare", help="convert and cache the embedded model").set_defaults(
        func=cmd_prepare)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecvizError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
