"""Instructions the target writes itself: dialogue prompts for drafter training.

Magpie (Xu et al., 2024, "Magpie: Alignment Data Synthesis from Scratch by Prompting Aligned
LLMs with Nothing"): an instruct model fed its chat template up to the *content* of a user turn
continues with a user request of the kind it was aligned on. Sampling that turn many times gives
as many dialogue prompts as a CPU can afford, in the target's own distribution, with no data file
-- the bundled DFlash drafter had ~150 dialogue prompts (the Alpaca seed tasks) behind it, its
weakest slice. The replies are then generated greedily by ``train rollouts`` like any prompt
file (exact labels for the target), so only the prompts are sampled.

Steering (Magpie's own domain control): ``system`` replaces the template's default system turn
in the *prefix only* (e.g. "You answer grade-school math word problems."), so the sampled
requests lean to that domain; the replies are still generated with the plain template, exactly
as a user's prompt would be, so the labels stay those of the target as served.

Conventions: a prompt is kept when the sampled turn ended with an end-of-turn token (not cut by
the length budget), is 3-80 words after stripping, holds no chat-template marker, and is new
(case- and space-insensitive). Seeded: the same seed, model and settings give the same file.
Rows are written as ``{"id", "category": "dialogue", "prompt", "source": "magpie"}``, a format
``specviz.bench.load_prompts`` reads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Iterable

import torch

from ..errors import SettingsError, SpecvizError

SENTINEL = "\u2063SPECVIZ_USER_TURN\u2063"
CATEGORY = "dialogue"


def user_turn_prefix(tokenizer, system: str | None = None) -> list[int]:
    """Token ids of the chat template up to where a user turn's content begins: after the same
    system turn ``Target.encode_prompt`` adds, or after ``system`` (steering) when given."""
    if not getattr(tokenizer, "chat_template", None):
        raise SpecvizError("Magpie prompts need an instruct model with a chat template")
    messages = [{"role": "user", "content": SENTINEL}]
    if system is not None:
        if not system.strip():
            raise SettingsError("--system must not be empty (leave it out for the default)")
        messages.insert(0, {"role": "system", "content": system.strip()})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    if SENTINEL not in text:
        raise SpecvizError("the chat template does not show the user turn's content")
    head = text[:text.index(SENTINEL)]
    return [int(x) for x in tokenizer(head, add_special_tokens=False)["input_ids"]]


def clean_instruction(text: str, min_words: int = 3, max_words: int = 80) -> str | None:
    """The sampled turn as a prompt, or None when it is too short, too long or holds markup."""
    text = text.strip()
    if "<|" in text or "|>" in text:
        return None
    n = len(text.split())
    if n < min_words or n > max_words:
        return None
    return text


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).strip()


def synthesize_instructions(target, count: int, seed: int = 0, temperature: float = 1.0,
                            max_new_tokens: int = 64, batch_size: int = 32,
                            max_batches: int | None = None, exclude: Iterable[str] = (),
                            system: str | None = None, category: str = CATEGORY,
                            progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """``count`` distinct user requests sampled from ``target`` after its user-turn prefix.
    Stops early (with fewer) after ``max_batches`` batches (default: 4 x the batches needed).
    Texts in ``exclude`` (e.g. another set's prompts: a held-out set) are never returned;
    ``system`` steers the domain (module docstring); rows carry ``category``."""
    from .rollouts import generate_batch

    if count < 1:
        raise SettingsError("--count must be at least 1")
    if not temperature or temperature <= 0:
        raise SettingsError("--temperature must be > 0 (a greedy turn is the same every time)")
    if batch_size < 1 or max_new_tokens < 1:
        raise SettingsError("--batch-size and --max-new-tokens must be at least 1")
    prefix = user_turn_prefix(target.tokenizer, system)
    gen = torch.Generator().manual_seed(int(seed))
    limit = max_batches if max_batches is not None else 4 * (-(-count // batch_size))
    rows: list[dict] = []
    seen: set[str] = {_norm(t) for t in exclude}
    for _ in range(limit):
        res = generate_batch(target, [prefix] * batch_size, max_new_tokens, layer_ids=[0],
                             temperature=temperature, generator=gen)
        for reply, stop in zip(res.replies, res.stops):
            if stop != "eos":
                continue
            body = [t for t in reply if t not in target.eos_token_ids]
            text = clean_instruction(target.tokenizer.decode(body, skip_special_tokens=True))
            if text is None or _norm(text) in seen:
                continue
            seen.add(_norm(text))
            rows.append({"id": f"magpie-{seed}-{len(rows)}", "category": category,
                         "prompt": text, "source": "magpie"})
            if len(rows) >= count:
                break
        if progress:
            progress(len(rows), count)
        if len(rows) >= count:
            break
    return rows


def write_prompts(rows: list[dict], path: str | Path) -> Path:
    """Write ``rows`` as JSON lines (a prompt file for ``train rollouts --data``)."""
    path = Path(path)
    if path.exists() and path.is_dir():
        raise SpecvizError(f"--out {path} is a folder, not a file")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                    encoding="utf-8")
    return path
