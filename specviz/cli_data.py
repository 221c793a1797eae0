"""Command line, training data: ``python -m specviz train
{rollouts,prompts,prefill,soft-labels,store}`` -- greedy rollouts with tapped target hidden
states, Magpie prompts, exact prefill labels, the target's top-k soft labels and the history
store (docs/methods/dflash.md, docs/methods/adapld.md). Entry point and
error rule (one ``error:`` line): :mod:`specviz.cli`.
"""
from __future__ import annotations

from pathlib import Path

from .errors import SpecvizError


def cmd_train_rollouts(args) -> int:
    from .models import load_target
    from .train.rollouts import STORE_DTYPES, load_items, make_rollouts, parse_layers, prompt_key

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
    tc = target.text_config
    layers = parse_layers(args.layers, int(tc.num_hidden_layers), k=args.num_features)
    print(f"{len(items)} prompts; tapped target layers {layers}; out {out}")
    if args.engine == "vllm":
        return _rollouts_with_vllm(args, target, items, layers, out)
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


def _rollouts_with_vllm(args, target, items, layers, out: Path) -> int:
    """``--engine vllm``: replies from vLLM's batched engine, labels from one specviz prefill
    (:mod:`specviz.served.rollouts`)."""
    from .models import embedded_model_dir
    from .served.rollouts import vllm_token_texts
    from .train.prefill import make_prefill_set
    from .train.rollout_store import read_manifest

    if args.holdout:
        print("--engine vllm writes a prefill-labelled set (every row 'train'); measure "
              "held-out tau on a greedy rollouts folder of its own")
    model = str(embedded_model_dir()) if args.model == "default" else args.model
    done = {r["key"] for r in read_manifest(out)}
    texts, rep = vllm_token_texts(target, items, model, args.max_new_tokens, args.temperature,
                                  args.seed, False if args.no_chat_template else None, done,
                                  args.max_prompt_tokens, args.endpoint)
    print(f"vLLM generated {rep.new_tokens} tokens for {len(texts)} prompts in "
          f"{rep.generate_s:.1f} s ({rep.tokens_per_s:.1f} tok/s; engine start {rep.load_s:.0f} s)")
    res = make_prefill_set(target, texts, out, layer_ids=layers, store_dtype=args.dtype,
                           model_name=args.model, max_tokens=max(768, max(
                               (len(t.ids) for t in texts), default=0)), show_bar=True)
    print(f"prefilled {res['texts']} rollouts ({res['tokens']} tokens, "
          f"{res['tokens_per_s']:.0f} tok/s); {res['total']} in {out}/manifest.jsonl")
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
    tc = target.text_config
    layers = parse_layers(args.layers, int(tc.num_hidden_layers), k=args.num_features)
    print(f"{len(pairs)} texts; tapped target layers {layers}; out {args.out}")
    res = make_prefill_set(target, pairs, args.out, layer_ids=layers,
                           batch_tokens=args.batch_tokens, max_tokens=args.max_tokens,
                           store_dtype=args.dtype, model_name=args.model, show_bar=True)
    print(f"prefilled {res['texts']} texts ({res['tokens']} tokens, {res['tokens_per_s']:.0f} "
          f"tok/s, {res['reply_tokens']} reply anchors); {res['total']} in {args.out}")
    return 0


def cmd_train_soft_labels(args) -> int:
    from .models import load_target
    from .train.rollout_store import read_meta
    from .train.soft_labels import make_soft_labels

    metas = [read_meta(d) for d in args.rollouts]   # not a rollouts folder: fails before loading
    if not 1 <= args.topk <= 64:
        raise SpecvizError(f"--topk must be between 1 and 64, got {args.topk}")
    model = args.model or metas[0].get("model") or "default"
    target = load_target(model, device=args.device, dtype="float32")
    for d in args.rollouts:
        res = make_soft_labels(target, d, k=args.topk, batch_tokens=args.batch_tokens,
                               model_name=model, show_bar=True)
        agree = "" if res["argmax_agree"] is None else \
            f"; target argmax = stored next token at {100 * res['argmax_agree']:.2f} %"
        print(f"{d}: top-{args.topk} soft labels for {res['shards']} new shards ({res['tokens']} "
              f"tokens, {res['tokens_per_s']:.0f} tok/s){agree}")
    print("use: python -m specviz train dflash ... --soft-weight 0.5")
    return 0


def cmd_train_store(args) -> int:
    from .train.history import store_from_rollouts
    from .train.rollout_store import read_meta

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


def add_train_rollouts(tsub) -> None:
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
    p.add_argument("--engine", choices=("specviz", "vllm"), default="specviz",
                   help="vllm: replies from vLLM's batched engine (.venv-vllm), hidden states "
                        "and exact labels from one specviz prefill over prompt + reply")
    p.add_argument("--endpoint", default=None,
                   help="with --engine vllm: a running vLLM server's URL instead of vLLM's "
                        "offline engine")
    p.set_defaults(func=cmd_train_rollouts)


def add_train_prompts(tsub) -> None:
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


def add_train_prefill(tsub) -> None:
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


def add_train_soft_labels(tsub) -> None:
    p = tsub.add_parser("soft-labels", help="the target's top-k next-token probabilities beside "
                        "rollouts (soft labels for train dflash --soft-weight)")
    p.add_argument("--rollouts", action="append", required=True,
                   help="rollouts or prefill folder; repeatable")
    p.add_argument("--model", default=None, help="target (default: the rollouts' model)")
    p.add_argument("--device", default=None)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--batch-tokens", type=int, default=4096, help="tokens per forward")
    p.set_defaults(func=cmd_train_soft_labels)


def add_train_store(tsub) -> None:
    p = tsub.add_parser("store", help="count AdaPLD's history store (the target's most frequent "
                        "next token per 1-3 token context) from greedy rollouts")
    p.add_argument("--rollouts", nargs="+", required=True, help="greedy rollout folders")
    p.add_argument("--out", required=True, help="the .npz file to write")
    p.add_argument("--min-count4", type=int, default=None,
                   help="keep a three-token context seen at least this often (0: none; "
                        "default: history_store.MIN_COUNT4)")
    p.add_argument("--model-name", default=None, help="model name recorded in the store")
    p.set_defaults(func=cmd_train_store)
