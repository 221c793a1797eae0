"""Command line pieces shared by the decoding commands (``run``, ``show``, ``bench``,
``served``): the coloured terminal view of a trace, its summary line, the target loader and the
shared options. Entry point and error rule: :mod:`specviz.cli`."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .errors import SpecvizError

GREEN, YELLOW, CYAN, RED, DIM, STRIKE, BOLD, RESET = (
    "\x1b[32m", "\x1b[33m", "\x1b[36m", "\x1b[31m", "\x1b[2m", "\x1b[9m", "\x1b[1m", "\x1b[0m")


def render_terminal(trace, color: bool = True, show_rejected: bool = True) -> str:
    """The generated text with each token coloured by its fate in its round (the same token
    views the app draws: :func:`specviz.viz.tokens.token_views`)."""
    from .viz.tokens import token_views

    style = {"accepted": GREEN, "rejected": RED + DIM + STRIKE, "bonus": CYAN}
    views = token_views(trace, rejected="all" if show_rejected and color else "none")
    if not color:
        return "".join(v.text for v in views)
    return "".join(f"{style.get(v.kind, YELLOW)}{v.text}{RESET}" for v in views)


def print_summary(trace, file=None) -> None:
    """One line of headline numbers: :meth:`Trace.summary` (specviz.metrics)."""
    file = file or sys.stdout
    s = trace.summary()
    print(f"\nmethod={s['method']}  tau={s['tau']:.2f} (tokens/round)  "
          f"target forwards={s['target_forwards']}  "
          f"new tokens={s['new_tokens']}  decode {s['decode_time_s']:.2f}s  "
          f"({s['tokens_per_s']:.1f} tok/s)  stop={trace.meta.get('stop_reason')}", file=file)


def load_decoding_target(args):
    """The target for decoding commands, with one line on its measured numerics (stderr)."""
    from .models import load_target

    target = load_target(args.model, device=args.device, dtype=args.target_dtype)
    if target.numerics is not None:
        print(f"target numerics: {target.numerics.summary()}", file=sys.stderr)
    if target.kernels is not None:
        print(f"target linears: {target.kernels.summary()}", file=sys.stderr)
    return target


def pin_revision(method_params: dict[str, dict], revision: str | None) -> dict[str, dict]:
    """``--revision REV``: every method's ``checkpoint`` given as a hub id becomes ``ID@REV``
    (published drafters are retrained under the same id). A SpecvizError when no method has a
    hub-id checkpoint to pin, or one already pins its own."""
    if not revision:
        return method_params
    from .drafters.dflash.checkpoint import HUB_ID

    out, pinned = {}, 0
    for method, params in method_params.items():
        ck = str((params or {}).get("checkpoint") or "")
        if "@" in ck:
            raise SpecvizError(f"--revision: {method}'s checkpoint {ck} already names a revision")
        if HUB_ID.fullmatch(ck) and not Path(ck).expanduser().exists():
            params = {**params, "checkpoint": f"{ck}@{revision}"}
            pinned += 1
        out[method] = params
    if not pinned:
        raise SpecvizError("--revision pins a drafter checkpoint given as a hub id: add "
                           "--param checkpoint=ORG/NAME")
    return out


def revision_arg(p) -> None:
    p.add_argument("--revision", default=None,
                   help="hub revision (branch, tag or commit) of a drafter checkpoint given as a "
                        "hub id; the same as checkpoint=ORG/NAME@REVISION")


def common_args(p) -> None:
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


def display_args(p) -> None:
    p.add_argument("--color", action="store_true", help="force colours")
    p.add_argument("--no-color", action="store_true")
    p.add_argument("--hide-rejected", action="store_true", help="do not print rejected suffixes")


def read_prompt(args) -> str:
    """The prompt of ``--prompt`` or ``--prompt-file`` (one ``error:`` line when missing or
    empty)."""
    prompt = args.prompt
    if args.prompt_file:
        p = Path(args.prompt_file)
        if not p.is_file():
            raise SpecvizError(f"prompt file {p} does not exist")
        prompt = p.read_text(encoding="utf-8", errors="replace")
    if prompt is None:
        raise SpecvizError("give a prompt with --prompt TEXT or --prompt-file FILE")
    if not prompt.strip():
        raise SpecvizError("the prompt is empty")
    return prompt


def run_settings(args):
    """The decoding settings of a one-prompt command (``run``, ``served``), checked."""
    from .engine import DecodeSettings

    return DecodeSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                          top_p=args.top_p, seed=args.seed,
                          chat_template=False if args.no_chat_template else None).validate()


def print_run(args, trace) -> None:
    """The coloured text (colours on a terminal unless --no-color / NO_COLOR, or --color) and
    the summary line."""
    color = sys.stdout.isatty() and not args.no_color and not os.environ.get("NO_COLOR") \
        or args.color
    print(render_terminal(trace, color=color, show_rejected=not args.hide_rejected))
    print_summary(trace)
