"""Command line, served runs: ``python -m specviz serve-vllm | served`` (docs/served.md).

``serve-vllm`` starts vLLM's OpenAI server on the embedded model (or a folder) with ngram
speculation and per-request detailed metrics; ``served`` sends one prompt to an endpoint and
prints it coloured exactly as ``run`` does, with the rebuild's agreement; ``bench --endpoint``
lives with ``bench`` (:mod:`specviz.cli`). Entry point and error rule: :mod:`specviz.cli`.
"""
from __future__ import annotations

from pathlib import Path

from .errors import SpecvizError


def ngram_config(args, max_model_len: int | None = None):
    """The ngram settings of ``--num-speculative-tokens --prompt-lookup-min/max``, checked."""
    from .served.ngram_rule import NgramConfig

    k, lo, hi = args.num_speculative_tokens, args.prompt_lookup_min, args.prompt_lookup_max
    if not 1 <= k <= 64:
        raise SpecvizError("--num-speculative-tokens must be between 1 and 64")
    if not 1 <= lo <= hi <= 16:
        raise SpecvizError("--prompt-lookup-min/max must satisfy 1 <= min <= max <= 16")
    return NgramConfig(k, lo, hi, max_model_len or 4096)


def cmd_serve_vllm(args) -> int:
    from .served.server import main_serve

    model = args.model
    if model == "default":
        from .models import embedded_model_dir

        model = str(embedded_model_dir())
    elif not Path(model).is_dir() and "/" not in model:
        raise SpecvizError(f"--model {model!r} is neither a folder nor a HF id")
    spec = None if args.speculative == "none" else ngram_config(args)
    return main_serve(model, args.port, spec, args.log, args.kv_cache_gib)


def cmd_served(args) -> int:
    from .cli_common import load_decoding_target, print_run, read_prompt, run_settings
    from .served.run import agreement, check_endpoint, served_trace

    settings = run_settings(args)
    prompt = read_prompt(args)
    target = load_decoding_target(args)
    ep = check_endpoint(args.endpoint, target.tokenizer)
    trace = served_trace(target, ep, prompt, settings, args.spec_method,
                         ngram_config(args, ep.info.max_model_len))
    print_run(args, trace)
    print(agreement(trace)[1])
    if args.save:
        print(f"trace saved to {trace.save(args.save)}")
    return 0


def _ngram_args(p) -> None:
    p.add_argument("--num-speculative-tokens", type=int, default=10)
    p.add_argument("--prompt-lookup-min", type=int, default=1)
    p.add_argument("--prompt-lookup-max", type=int, default=2)


def add_serve_vllm(sub) -> None:
    from .served.server import DEFAULT_PORT

    p = sub.add_parser("serve-vllm", help="start a local vLLM server (ngram speculation, "
                       "per-request detailed metrics) on the embedded model")
    p.add_argument("--model", default="default", help="'default' (embedded model) or a folder")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--speculative", choices=("ngram", "none"), default="ngram",
                   help="none: plain decoding (the vLLM AR baseline)")
    _ngram_args(p)
    p.add_argument("--kv-cache-gib", type=int, default=1, help="vLLM's CPU KV cache, GiB")
    p.add_argument("--log", default=None, help="append vLLM's log to this file")
    p.set_defaults(func=cmd_serve_vllm)


def add_served(sub) -> None:
    from .cli_common import common_args, display_args
    from .served.client import DEFAULT_ENDPOINT

    p = sub.add_parser("served", help="one prompt through a vLLM endpoint, shown as a trace")
    common_args(p)
    p.add_argument("--endpoint", default=DEFAULT_ENDPOINT, help="http://HOST:PORT of the server")
    p.add_argument("--spec-method", default="ngram",
                   help="the server's speculative method: ngram (drafts rebuilt) or eagle, "
                        "eagle3, dflash, mtp, draft_model, suffix (counts only)")
    _ngram_args(p)
    p.add_argument("--prompt")
    p.add_argument("--prompt-file")
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--save", help="write the trace JSON here")
    display_args(p)
    p.set_defaults(func=cmd_served)


def add_bench_endpoints(p) -> None:
    """``bench``'s served options: endpoints beside the local methods, their throughput."""
    p.add_argument("--endpoint", action="append", default=[],
                   help="[LABEL=]URL of a vLLM server run on the same prompts beside the local "
                        "methods (repeatable; e.g. vllm-ngram=http://127.0.0.1:8123)")
    p.add_argument("--spec-method", default="ngram",
                   help="the endpoints' speculative method (ngram: drafts rebuilt)")
    _ngram_args(p)
    p.add_argument("--concurrency", default="1,4,16",
                   help="served throughput at these numbers of requests in flight ('' skips)")


def endpoint_runs(args, target, settings):
    """The bench's served hook for ``--endpoint`` (every endpoint checked now), or None."""
    if not getattr(args, "endpoint", None):
        return None
    from .served.bench import EndpointRuns, parse_endpoints, parse_levels
    from .served.run import check_endpoint

    parse_levels(args.concurrency)   # a bad --concurrency fails before the long run
    eps = {label: check_endpoint(url, target.tokenizer)
           for label, url in parse_endpoints(args.endpoint).items()}
    cfg = ngram_config(args, min(e.info.max_model_len or 4096 for e in eps.values()))
    return EndpointRuns(target, eps, settings, args.spec_method, cfg)


def served_throughput(args, target, served, prompts, settings, result) -> None:
    """Throughput of every endpoint at each ``--concurrency`` level, into the bench result."""
    from tqdm.auto import tqdm

    from .served.bench import parse_levels, throughput_rows

    levels = parse_levels(args.concurrency)
    if not levels:
        return
    bar = tqdm(total=len(prompts) * len(levels) * len(served.endpoints), desc="throughput",
               unit="request")
    result.meta["throughput"] = throughput_rows(target, served.endpoints, prompts, settings,
                                                levels, bar)
    bar.close()
