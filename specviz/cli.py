"""Command line: ``python -m specviz run | bench | show | prepare | train {rollouts,dflash}``.

``run`` decodes one prompt and prints the text coloured by what happened to each token
(green: accepted draft token, yellow: the target's correction, cyan: bonus token after a fully
accepted draft, red struck-through: the rejected suffix, shown where it was rejected).
Every user error prints one line ``error: ...`` and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .errors import SpecvizError

GREEN, YELLOW, CYAN, RED, DIM, STRIKE, BOLD, RESET = (
    "\x1b[32m", "\x1b[33m", "\x1b[36m", "\x1b[31m", "\x1b[2m", "\x1b[9m", "\x1b[1m", "\x1b[0m")


def parse_params(method: str, pairs: list[str] | None) -> dict:
    """``--param key=value`` pairs of ``method`` → its settings, each typed by the method's
    registry entry (an unknown key lists the valid ones)."""
    from .drafters import method_spec

    return method_spec(method).parse(pairs)


def render_terminal(trace, color: bool = True, show_rejected: bool = True) -> str:
    """The generated text with each token coloured by its fate in its round (the same token
    views the app draws: :func:`specviz.viz.tokens.token_views`)."""
    from .viz.tokens import token_views

    style = {"accepted": GREEN, "rejected": RED + DIM + STRIKE, "bonus": CYAN}
    views = token_views(trace, rejected="all" if show_rejected and color else "none")
    if not color:
        return "".join(v.text for v in views)
    return "".join(f"{style.get(v.kind, YELLOW)}{v.text}{RESET}" for v in views)


def _print_summary(trace, file=None) -> None:
    """One line of headline numbers: :meth:`Trace.summary` (specviz.analysis.metrics)."""
    file = file or sys.stdout
    s = trace.summary()
    print(f"\nmethod={s['method']}  tau={s['tau']:.2f} (tokens/round)  "
          f"target forwards={s['target_forwards']}  "
          f"new tokens={s['new_tokens']}  decode {s['decode_time_s']:.2f}s  "
          f"({s['tokens_per_s']:.1f} tok/s)  stop={trace.meta.get('stop_reason')}", file=file)


def _load_decoding_target(args):
    """The target for decoding commands, with one line on its measured numerics (stderr)."""
    from .models import load_target

    target = load_target(args.model, device=args.device, dtype=args.target_dtype)
    if target.numerics is not None:
        print(f"target numerics: {target.numerics.summary()}", file=sys.stderr)
    if target.kernels is not None:
        print(f"target linears: {target.kernels.summary()}", file=sys.stderr)
    return target


def cmd_prepare(args) -> int:
    from .models import embedded_model_dir

    path = embedded_model_dir()
    print(f"embedded model ready: {path}")
    return 0


def cmd_run(args) -> int:
    from .drafters import make_drafter
    from .engine import DecodeSettings, Session
    from .models import load_target

    prompt = args.prompt
    if args.prompt_file:
        p = Path(args.prompt_file)
        if not p.exists():
            raise SpecvizError(f"prompt file {p} does not exist")
        prompt = p.read_text(encoding="utf-8", errors="replace")
    if prompt is None:
        raise SpecvizError("give a prompt with --prompt TEXT or --prompt-file FILE")
    settings = DecodeSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              top_p=args.top_p, seed=args.seed,
                              chat_template=False if args.no_chat_template else None).validate()
    if not prompt.strip():
        raise SpecvizError("the prompt is empty")
    params = parse_params(args.method, args.param)
    target = _load_decoding_target(args)
    drafter = make_drafter(args.method, target, **params)
    sess = Session(target, drafter, prompt, settings, method=args.method)
    trace = sess.run()
    color = sys.stdout.isatty() and not args.no_color and not os.environ.get("NO_COLOR") \
        or args.color
    print(render_terminal(trace, color=color, show_rejected=not args.hide_rejected))
    _print_summary(trace)
    if args.save:
        path = trace.save(args.save)
        print(f"trace saved to {path}")
    return 0


def cmd_show(args) -> int:
    from .trace import Trace

    trace = Trace.load(args.trace)
    color = sys.stdout.isatty() and not args.no_color or args.color
    print(render_terminal(trace, color=color, show_rejected=not args.hide_rejected))
    _print_summary(trace)
    return 0


def cmd_bench(args) -> int:
    from tqdm.auto import tqdm

    from .bench import check_methods, format_table, load_prompts, run_bench
    from .engine import DecodeSettings
    from .models import load_target

    settings = DecodeSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              top_p=args.top_p, seed=args.seed).validate()
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
    methods = [m.strip().lower() for m in args.methods.split(",") if m.strip()]
    try:
        params = json.loads(args.params) if args.params else {}
    except json.JSONDecodeError as exc:
        raise SpecvizError(f"--params is not valid JSON ({exc})") from None
    if not isinstance(params, dict):
        raise SpecvizError("--params must be a JSON object like '{\"pld\": {\"num_output_tokens\": 5}}'")
    params = check_methods(methods, params)  # the registry's checks, before the model loads
    target = _load_decoding_target(args)
    bar = tqdm(total=len(prompts) * len(set(methods) | {"ar"}), desc="bench", unit="run")

    def progress(done, total, what):
        bar.total = total
        bar.n = done
        bar.set_postfix_str(what)
        bar.refresh()

    result = run_bench(target, methods, prompts, settings, method_params=params, progress=progress,
                       traces_dir=Path(args.out) / "traces" if args.save_traces else None)
    bar.close()
    paths = result.save(args.out)
    print(format_table(result.table()))
    print(result.verdict().message)
    vc = result.meta.get("verify_cost")
    if vc:
        print(f"verify cost on this machine ({vc['kind']}; a one-token step {vc['step_ms']} ms): "
              + ", ".join(f"c({k}) {c:.2f}" for k, c in vc["points"]))
    print("written: " + ", ".join(str(p) for p in paths.values()))
    return 0


def cmd_train_rollouts(args) -> int:
    from .models import load_target
    from .train.rollouts import (STORE_DTYPES, load_items, make_rollouts, parse_layers,
                                  prompt_key)

    if not 0.0 <= args.holdout < 1.0:
        raise SpecvizError("--holdout must be in [0, 1)")
    if args.max_new_tokens < 1 or args.batch_size < 1:
        raise SpecvizError("--max-new-tokens and --batch-size must be at least 1")
    if args.dtype not in STORE_DTYPES:
        raise SpecvizError(f"--dtype must be one of {', '.join(STORE_DTYPES)}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SpecvizError(f"--out {out} is a file, not a folder")
    items = load_items(args.data, limit=args.limit)  # bad --data fails before the model loads
    if args.exclude:  # e.g. the bench prompts: keep them out of the training data
        held = {prompt_key(it) for it in load_items(args.exclude)}
        n0 = len(items)
        items = [it for it in items if prompt_key(it) not in held]
        print(f"--exclude: left out {n0 - len(items)} prompts")
        if not items:
            raise SpecvizError("--exclude left no prompts")
    target = load_target(args.model, device=args.device, dtype="float32")
    tc = getattr(target.model.config, "text_config", None) or target.model.config
    layers = parse_layers(args.layers, int(tc.num_hidden_layers), k=args.num_features)
    print(f"{len(items)} prompts; tapped target layers {layers}; out {out}")
    res = make_rollouts(target, items, out, max_new_tokens=args.max_new_tokens,
                        batch_size=args.batch_size, layer_ids=layers, holdout=args.holdout,
                        store_dtype=args.dtype, temperature=args.temperature, seed=args.seed,
                        chat_template=False if args.no_chat_template else None,
                        max_prompt_tokens=args.max_prompt_tokens, model_name=args.model,
                        show_bar=True)
    print(f"generated {res['generated']} rollouts ({res['new_tokens']} tokens, "
          f"{res['tokens_per_s']:.1f} tok/s), skipped {res['skipped']} (done or too long); "
          f"{res['total']} in {out}/manifest.jsonl")
    return 0


def cmd_train_prompts(args) -> int:
    from tqdm.auto import tqdm

    from .bench import load_prompts
    from .models import load_target
    from .train.magpie import synthesize_instructions, write_prompts

    out = Path(args.out)
    if out.exists() and out.is_dir():
        raise SpecvizError(f"--out {out} is a folder, not a file")
    if args.count < 1 or args.batch_size < 1 or args.max_new_tokens < 1:
        raise SpecvizError("--count, --batch-size and --max-new-tokens must be at least 1")
    if args.temperature <= 0:
        raise SpecvizError("--temperature must be > 0")
    exclude = [it.text for f in args.exclude for it in load_prompts(f)]
    target = load_target(args.model, device=args.device, dtype="float32")
    bar = tqdm(total=args.count, desc="prompts", unit="prompt")

    def progress(n: int, total: int) -> None:
        bar.update(n - bar.n)

    rows = synthesize_instructions(target, args.count, seed=args.seed,
                                   temperature=args.temperature,
                                   max_new_tokens=args.max_new_tokens,
                                   batch_size=args.batch_size, exclude=exclude,
                                   system=args.system, category=args.category,
                                   progress=progress)
    bar.close()
    write_prompts(rows, out)
    print(f"wrote {len(rows)} {args.category} prompts to {out}"
          + ("" if len(rows) >= args.count else f" (asked for {args.count}: too few distinct "
             "turns ended within --max-new-tokens)"))
    return 0


def cmd_train_prefill(args) -> int:
    from .models import load_target
    from .train.prefill import load_pairs, make_prefill_set, rollout_texts
    from .train.rollouts import STORE_DTYPES, load_items, parse_layers, prompt_key

    if args.dtype not in STORE_DTYPES:
        raise SpecvizError(f"--dtype must be one of {', '.join(STORE_DTYPES)}")
    if not args.data and not args.rollouts:
        raise SpecvizError("give --data (texts with reference replies) or --rollouts (greedy "
                           "rollouts to re-tap)")
    pairs = [pr for d in args.data for pr in load_pairs(d, args.limit)]
    pairs += [tt for d in args.rollouts for tt in rollout_texts(d)]
    if args.exclude:  # the bench prompts: never trained on
        held = {prompt_key(it) for it in load_items(args.exclude)}
        n0 = len(pairs)
        pairs = [pr for pr in pairs if pr.key not in held]
        print(f"--exclude: left out {n0 - len(pairs)} texts")
    if not pairs:
        raise SpecvizError("no texts selected (every one excluded or without a reference reply)")
    target = load_target(args.model, device=args.device, dtype="float32")
    tc = getattr(target.model.config, "text_config", None) or target.model.config
    layers = parse_layers(args.layers, int(tc.num_hidden_layers), k=args.num_features)
    print(f"{len(pairs)} texts; tapped target layers {layers}; out {args.out}")
    res = make_prefill_set(target, pairs, args.out, layer_ids=layers,
                           batch_tokens=args.batch_tokens, max_tokens=args.max_tokens,
                           store_dtype=args.dtype, model_name=args.model, show_bar=True)
    print(f"prefilled {res['texts']} texts ({res['tokens']} tokens, {res['tokens_per_s']:.0f} "
          f"tok/s, {res['reply_tokens']} reply anchors); {res['total']} in {args.out}")
    return 0


def cmd_train_store(args) -> int:
    from .drafters.history_store import store_from_rollouts
    from .train.rollouts import read_meta

    meta = read_meta(args.rollouts[0])
    for folder in args.rollouts[1:]:
        if read_meta(folder).get("vocab_size") != meta.get("vocab_size"):
            raise SpecvizError(f"{folder} was made with another vocabulary than "
                               f"{args.rollouts[0]}")
    if args.min_count4 is not None and args.min_count4 < 0:
        raise SpecvizError(f"--min-count4 must be 0 or more, got {args.min_count4}")
    kw = {} if args.min_count4 is None else {"min_count4": args.min_count4}
    store = store_from_rollouts(args.rollouts, {"model": args.model_name or meta.get("model"),
                                                "vocab_size": meta.get("vocab_size")}, **kw)
    path = store.save(args.out)
    print(f"history store: {store.meta['tokens']} reply tokens -> {len(store.bigram)} bigram, "
          f"{len(store.trigram)} trigram and {len(store.fourgram)} four-gram contexts; {path} "
          f"({path.stat().st_size // 1024} KB)")
    return 0


def cmd_train_dflash(args) -> int:
    from .models import load_target
    from .train.dflash_train import TrainConfig, train_dflash
    from .train.rollouts import read_meta

    cfg = TrainConfig(block_size=args.block_size, num_layers=args.layers, steps=args.steps,
                      batch_size=args.batch_size, anchors_per_seq=args.anchors_per_seq,
                      lr=args.lr, warmup=args.warmup, gamma=args.gamma,
                      eval_every=args.eval_every, eval_rollouts=args.eval_rollouts,
                      save_every=args.save_every, seed=args.seed,
                      save_dtype=args.save_dtype, negatives=args.negatives,
                      init=args.init).validate()
    meta = read_meta(args.rollouts)  # missing / not a rollouts folder fails before the model loads
    target = load_target(args.model or meta.get("model") or "default", device=args.device,
                         dtype="float32")
    res = train_dflash(target, args.rollouts, args.out, cfg, resume=args.resume, show_bar=True,
                       prefill=args.prefill)
    ev = res["eval"]
    print(f"{res['steps_run']} steps in {res['seconds']:.0f}s ({res['steps_per_s']:.2f} steps/s); "
          f"loss {res['loss_first'] if res['loss_first'] is None else round(res['loss_first'], 3)}"
          f" -> {res['loss_last'] if res['loss_last'] is None else round(res['loss_last'], 3)}"
          + (f"; simulated tau {ev['tau']:.2f} on {ev['rollouts']} eval rollouts" if ev else ""))
    if not res["eval_rollouts"]:
        print("note: no eval rollouts (none fell in the --holdout split), so no tau estimate")
    print(f"drafter written to {res['out']} (use: --method dflash --param checkpoint={res['out']})")
    return 0


def cmd_train_retrace(args) -> int:
    from .drafters.dflash import bundled_checkpoint, load_dflash_checkpoint
    from .models import load_target
    from .train.retrace_train import ReTraceTrainConfig, train_retrace
    from .train.rollouts import read_meta

    cfg = ReTraceTrainConfig(steps=args.steps, batch_size=args.batch_size,
                             anchors_per_seq=args.anchors_per_seq, lr=args.lr, gamma=args.gamma,
                             eval_every=args.eval_every, eval_sequences=args.eval_sequences,
                             seed=args.seed, backbone_lr=args.backbone_lr).validate()
    for d in list(args.data) + ([args.eval] if args.eval else []):
        read_meta(d)  # a missing / wrong folder fails before the model loads
    target = load_target(args.model, device=args.device, dtype="float32")
    backbone = args.backbone or bundled_checkpoint(target)
    if backbone is None:
        raise SpecvizError("--backbone is needed: no bundled DFlash drafter for this target")
    model = load_dflash_checkpoint(backbone)
    label = "bundled" if not args.backbone else str(args.backbone)
    res = train_retrace(target, model, label, args.data, args.eval, args.out, cfg,
                        resume=args.resume, show_bar=True)
    ev = res["eval"]
    print(f"{res['steps_run']} steps in {res['seconds']:.0f}s; "
          + (f"round r+1 accepted {ev['accepted_fused']:.3f} (ReTrace) vs "
             f"{ev['accepted_backbone']:.3f} (backbone) on {ev['examples']} held-out examples"
             if ev else "no eval"))
    if res.get("best"):
        print(f"best held-out step {res['best']['step']} (round r+1 accepted "
              f"{res['best']['accepted_fused']:.3f}) kept in {res['out']}/best")
    print(f"ReTrace written to {res['out']} (use: --method retrace --param checkpoint={res['out']})")
    return 0


def cmd_eval(args) -> int:
    import csv

    from .analysis.offline_eval import offline_compare, parse_drafters, real_rounds
    from .models import load_target
    from .train.rollouts import RolloutSet, read_meta

    specs = parse_drafters(args.drafters)
    meta = read_meta(args.rollouts)
    rs = RolloutSet(args.rollouts, split=None if args.split == "all" else args.split)
    if not len(rs):
        raise SpecvizError(f"{args.rollouts} has no rollouts in split '{args.split}' "
                           "(use --split all)")
    name = args.model or meta.get("model") or "default"
    if str(name).endswith("(embedded)"):  # rollouts made through the library name it so
        name = "default"
    target = load_target(name, device=args.device, dtype="float32")
    from tqdm.auto import tqdm

    n = len(rs) if args.limit is None else min(args.limit, len(rs))
    bar = tqdm(total=n, desc="offline EDR", unit="rollout")
    res = offline_compare(target, rs, specs, limit=n, progress=lambda d, t: bar.update(1))
    bar.close()
    if args.real:
        res["real"] = real_rounds(target, rs, specs, args.real)
        for lab, r in res["real"].items():
            off = [row[f"edr:{lab}"] for row in res["rows"][:r["rollouts"]]]
            if rs.temperature > 0:   # each real run is a new random rollout: compare means
                r["equals_offline"] = None
                r["mean_rounds_real"] = sum(r["rounds"]) / max(1, len(r["rounds"]))
                r["mean_rounds_offline"] = sum(off) / max(1, len(off))
            else:
                r["equals_offline"] = sum(abs(a - b) < 1e-6 for a, b in zip(r["rounds"], off))
            r["seconds_extrapolated"] = r["seconds"] * n / max(1, r["rollouts"])
        real_s = sum(r["seconds_extrapolated"] for r in res["real"].values())
        res["speedup_offline_vs_real"] = real_s / max(1e-9, sum(res["seconds_offline"].values()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps({k: v for k, v in res.items() if k != "rows"},
                                              indent=2) + "\n")
    with open(out / "eval.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(res["rows"][0]))
        w.writeheader()
        w.writerows(res["rows"])
    labels = [s.label for s in specs]
    wid = max(len(lab) for lab in labels) + 6
    print(f"{'category':<16}{'rollouts':>9}" + "".join(f"{lab + ' tau':>{wid}}" for lab in labels))
    for cat, ent in res["summary"].items():
        print(f"{cat:<16}{ent['rollouts']:>9}" + "".join(
            f"{ent['drafters'][lab]['tau']:>{wid}.3f}" for lab in labels))
    for pair, b in res["summary"]["all"]["paired"].items():
        lo, hi = b["rounds_change_ci"]
        print(f"{pair}: expected rounds {b['rounds_change']:+.1%} (95% CI {lo:+.1%} .. {hi:+.1%})")
    print(f"offline: {sum(res['seconds_offline'].values()):.1f}s"
          + (f"; real runs (extrapolated to {n}): {real_s:.1f}s, "
             f"{res['speedup_offline_vs_real']:.1f}x slower" if args.real else ""))
    print(f"written to {out}/eval.json and {out}/eval.csv")
    return 0


def cmd_train_finetune(args) -> int:
    from .drafters.dflash import bundled_checkpoint, load_dflash_checkpoint
    from .models import load_target
    from .train.edr_train import EDRTrainConfig, finetune
    from .train.rollouts import read_meta

    cfg = EDRTrainConfig(objective=args.objective, steps=args.steps, batch_size=args.batch_size,
                         num_starts=args.num_starts, lr=args.lr, eval_every=args.eval_every,
                         eval_rollouts=args.eval_rollouts, seed=args.seed).validate()
    read_meta(args.rollouts)
    target = load_target(args.model, device=args.device, dtype="float32")
    init = args.init or bundled_checkpoint(target)
    if init is None:
        raise SpecvizError("--init is needed: no bundled DFlash drafter for this target")
    model = load_dflash_checkpoint(init)
    if args.markov_rank:   # DSpark: the same backbone + a zero-initialised Markov head
        from .drafters.dspark import add_markov_head

        add_markov_head(model, args.markov_rank, seed=args.seed)
    res = finetune(target, model, args.rollouts, args.eval, args.out, cfg, show_bar=True)
    ev = res["evals"]
    if ev:
        print(f"held-out expected rounds {ev[0]['expected_rounds']:.1f} -> "
              f"{ev[-1]['expected_rounds']:.1f} (tau {ev[0]['tau']:.3f} -> {ev[-1]['tau']:.3f})")
    print(f"drafter written to {res['out']}")
    return 0


def cmd_align(args) -> int:
    import csv

    from .analysis.alignment import table_rows
    from .analysis.suffix_bound import bound_rows
    from .trace import Trace

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
    return 0


def _common(p) -> None:
    p.add_argument("--model", default="default",
                   help="'default' (embedded SmolLM2-135M-Instruct), a HF id or a local folder")
    p.add_argument("--device", default=None, help="cpu / cuda (default: cuda if present)")
    p.add_argument("--target-dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="auto: on a CPU, bfloat16 where it is measured faster and its logits are "
                        "width-invariant (lossless), else float32; bfloat16 on a GPU")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)


def _display(p) -> None:
    p.add_argument("--color", action="store_true", help="force colours")
    p.add_argument("--no-color", action="store_true")
    p.add_argument("--hide-rejected", action="store_true", help="do not print rejected suffixes")


def _add_run(sub, methods: str, epilog: str) -> None:
    p = sub.add_parser("run", help="decode one prompt and show accepted/rejected tokens",
                       epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    p.add_argument("--method", default="pld", help=f"one of: {methods} (default pld)")
    p.add_argument("--prompt")
    p.add_argument("--prompt-file")
    p.add_argument("--param", action="append",
                   help="method setting key=value (repeatable; the method's settings are listed "
                        "below)")
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--save", help="write the trace JSON here")
    _display(p)
    p.set_defaults(func=cmd_run)


def _add_show_and_bench(sub, methods: str, epilog: str) -> None:
    p = sub.add_parser("show", help="print a saved trace")
    p.add_argument("trace")
    _display(p)
    p.set_defaults(func=cmd_show)
    p = sub.add_parser("bench", help="run methods side by side with the AR baseline",
                       epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
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
    p.add_argument("--out", default="bench-out")
    p.add_argument("--save-traces", action="store_true",
                   help="also save every run's trace under OUT/traces/METHOD/CATEGORY/")
    p.set_defaults(func=cmd_bench)


def _add_train_rollouts(tsub) -> None:
    p = tsub.add_parser("rollouts", help="target replies + tapped hidden states for training")
    p.add_argument("--model", default="default",
                   help="'default' (embedded SmolLM2-135M-Instruct), a HF id or a local folder")
    p.add_argument("--device", default=None)
    p.add_argument("--data", action="append", required=True,
                   help="prompt file (GSM8K, Spec-Bench, MBPP, Alpaca jsonl, .txt); FILE:N keeps "
                   "N prompts per category; repeatable")
    p.add_argument("--limit", type=int, default=None, help="first N prompts per category")
    p.add_argument("--out", default="rollouts")
    p.add_argument("--exclude", action="append", default=[],
                   help="FILE[:N] prompts to leave out (e.g. the bench's), repeatable")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--layers", default="auto",
                   help="tapped target layer ids, e.g. 1,8,15,22,27; 'auto' = the DFlash default")
    p.add_argument("--num-features", type=int, default=5, help="k layers for --layers auto")
    p.add_argument("--holdout", type=float, default=0.05, help="fraction held aside as eval")
    p.add_argument("--dtype", default="float16", help="storage dtype of hidden states")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy replies")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-prompt-tokens", type=int, default=None)
    p.add_argument("--no-chat-template", action="store_true")
    p.set_defaults(func=cmd_train_rollouts)


def _add_train_prompts(tsub) -> None:
    p = tsub.add_parser("prompts", help="dialogue prompts the target writes itself (Magpie: "
                        "its chat template up to a user turn, sampled)")
    p.add_argument("--model", default="default")
    p.add_argument("--device", default=None)
    p.add_argument("--count", type=int, default=1000, help="distinct prompts wanted")
    p.add_argument("--out", default="magpie.jsonl", help="prompt file (.jsonl) to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=48, help="longest user turn kept")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--exclude", action="append", default=[],
                   help="prompt file whose texts are never written (e.g. the training prompts, "
                   "when making a held-out set); repeatable")
    p.add_argument("--system", default=None,
                   help="system turn that steers the requests' domain (prompts only; replies "
                   "use the plain template), e.g. 'You help with grade-school math problems.'")
    p.add_argument("--category", default="dialogue", help="category written on each row")
    p.set_defaults(func=cmd_train_prompts)


def _add_train_prefill(tsub) -> None:
    p = tsub.add_parser("prefill", help="exact prefill labels + tapped hidden states over "
                        "reference texts (fast training data)")
    p.add_argument("--model", default="default")
    p.add_argument("--device", default=None)
    p.add_argument("--data", action="append", default=[],
                   help="GSM8K / MBPP / Alpaca / Spec-Bench jsonl with reference replies; FILE:N "
                   "keeps the first N prompts per category; repeatable")
    p.add_argument("--rollouts", action="append", default=[],
                   help="a greedy rollouts folder to re-tap at these layers (its token ids as "
                   "stored, e.g. the history store's one-layer rollouts); repeatable")
    p.add_argument("--limit", type=int, default=None, help="first N prompts per category")
    p.add_argument("--exclude", action="append", default=[],
                   help="FILE[:N] prompts to leave out (e.g. the bench's), repeatable")
    p.add_argument("--out", default="prefill")
    p.add_argument("--batch-tokens", type=int, default=4096, help="tokens per forward")
    p.add_argument("--max-tokens", type=int, default=768, help="cut longer texts here")
    p.add_argument("--layers", default="auto")
    p.add_argument("--num-features", type=int, default=5)
    p.add_argument("--dtype", default="float16", help="storage dtype of hidden states")
    p.set_defaults(func=cmd_train_prefill)


def _add_train_store(tsub) -> None:
    p = tsub.add_parser("store", help="count AdaPLD's history store (the target's most frequent "
                        "next token per 1-3 token context) from greedy rollouts")
    p.add_argument("--rollouts", nargs="+", required=True, help="greedy rollout folders")
    p.add_argument("--out", required=True, help="the .npz file to write")
    p.add_argument("--min-count4", type=int, default=None,
                   help="keep a three-token context seen at least this often (0: none; "
                        "default: history_store.MIN_COUNT4)")
    p.add_argument("--model-name", default=None, help="model name recorded in the store")
    p.set_defaults(func=cmd_train_store)


def _add_train_dflash(tsub) -> None:
    p = tsub.add_parser("dflash", help="train a DFlash drafter on rollouts")
    p.add_argument("--rollouts", required=True,
                   help="rollouts folder: its train split is trained on, its eval split gives "
                   "the simulated held-out tau")
    p.add_argument("--prefill", action="append", default=[],
                   help="more training data, all its rows: a prefill-labelled folder (`train "
                   "prefill`) or another rollouts folder (`train rollouts`); repeatable")
    p.add_argument("--out", required=True)
    p.add_argument("--model", default=None, help="target (default: the rollouts' model)")
    p.add_argument("--device", default=None)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--layers", type=int, default=2, help="drafter decoder layers")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=8, help="rollouts per step")
    p.add_argument("--anchors-per-seq", type=int, default=16)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup", type=float, default=0.04, help="fraction of steps")
    p.add_argument("--gamma", type=float, default=4.0, help="slot weight decay (7 for B=16)")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-rollouts", type=int, default=32)
    p.add_argument("--save-every", type=int, default=None)
    p.add_argument("--save-dtype", default="float32")
    p.add_argument("--init", default="random",
                   help="random, target (the target's top layers) or a DFlash checkpoint folder "
                        "to continue training (same block size and layers)")
    p.add_argument("--negatives", type=int, default=4096,
                   help="sampled softmax: every reply token + N random other words per step "
                        "(-1 = full vocabulary, slower)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.set_defaults(func=cmd_train_dflash)


def _add_train_retrace(tsub) -> None:
    p = tsub.add_parser("retrace", help="train a ReTrace fusion on a DFlash backbone (frozen, "
                        "or fine-tuned jointly with --backbone-lr)")
    p.add_argument("--data", action="append", required=True,
                   help="rollouts (train split) or prefill folder; repeatable")
    p.add_argument("--eval", default=None, help="rollouts folder whose eval split is held out")
    p.add_argument("--backbone", default=None, help="DFlash checkpoint (default: the bundled)")
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="default")
    p.add_argument("--device", default=None)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=4, help="sequences per step")
    p.add_argument("--anchors-per-seq", type=int, default=12)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--gamma", type=float, default=4.0)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-sequences", type=int, default=24)
    p.add_argument("--backbone-lr", type=float, default=0.0,
                   help="> 0: fine-tune the backbone jointly at this learning rate (saved in "
                        "the checkpoint's backbone/ folder); 0 = frozen backbone (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.set_defaults(func=cmd_train_retrace)


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="offline paired comparison of drafters on cached rollouts "
                       "(exact expected decoding rounds, no speculative decoding)")
    p.add_argument("--drafters", required=True,
                   help="comma-separated METHOD or METHOD:CHECKPOINT (pld, dflash, "
                   "dflash:runs/x); the first is the reference of the paired differences")
    p.add_argument("--rollouts", required=True, help="a rollouts folder (train rollouts)")
    p.add_argument("--split", default="eval", choices=["eval", "train", "all"])
    p.add_argument("--limit", type=int, default=None, help="first N rollouts")
    p.add_argument("--real", type=int, default=0,
                   help="also run real greedy speculative decoding on the first N rollouts "
                   "(time and exactness check)")
    p.add_argument("--model", default=None, help="target (default: the rollouts' model)")
    p.add_argument("--device", default=None)
    p.add_argument("--out", default="eval-out")
    p.set_defaults(func=cmd_eval)


def _add_train_finetune(tsub) -> None:
    p = tsub.add_parser("finetune", help="fine-tune a DFlash drafter with EDR (exact TD "
                        "gradient), decay-CE or the survival surrogate")
    p.add_argument("--objective", default="edr", choices=["edr", "decay_ce", "survival"])
    p.add_argument("--init", default=None, help="DFlash checkpoint to start from (default: "
                   "the bundled drafter)")
    p.add_argument("--rollouts", required=True, help="greedy rollouts (train split)")
    p.add_argument("--eval", default=None, help="rollouts whose eval split is held out")
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="default")
    p.add_argument("--device", default=None)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--num-starts", type=int, default=48,
                   help="round starts per rollout (edr: drawn by occupancy)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-rollouts", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--markov-rank", type=int, default=0,
                   help="> 0: add a DSpark Markov head of this rank (starts as the DFlash "
                        "drafter; use the result with --method dspark)")
    p.set_defaults(func=cmd_train_finetune)


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
    _add_eval(sub)
    _add_align(sub)
    tsub = sub.add_parser("train", help="make rollouts / train a drafter (METHODS §1)"
                          ).add_subparsers(dest="train_cmd", required=True)
    _add_train_rollouts(tsub)
    _add_train_prompts(tsub)
    _add_train_prefill(tsub)
    _add_train_store(tsub)
    _add_train_dflash(tsub)
    _add_train_retrace(tsub)
    _add_train_finetune(tsub)
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
