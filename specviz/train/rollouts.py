"""Target rollouts for drafter training (docs/methods/dflash.md), with the tapped hidden states
saved while the replies are generated -- no second prefill pass.

Prompts are chat-templated (``Target.encode_prompt``), sorted by length and generated in batches
(left padding + attention mask + position ids, one KV cache per batch). The batched prefill gives
the hidden states of the prompt positions; every decode step feeds the tokens just generated and
keeps, of its ``output_hidden_states``, only the tapped layers' rows of those new positions. One
extra one-token step after the last reply token gives that token's states, so every position of
prompt + reply has its features.

On disk (``out/``):

* ``meta.json``: model, tapped ``target_layer_ids``, hidden size, storage dtype, settings;
* ``shard-NNNNN.safetensors`` (one per batch): per rollout ``{name}.tokens`` int32 [T] (prompt +
  reply ids) and ``{name}.hidden`` [T, k*H] (the k tapped layers concatenated in id order --
  exactly the drafter's context features -- float16 by default); sampled rollouts
  (``temperature > 0``) also store ``{name}.p`` float32 [reply length], the target's probability
  p(y_t) of each sampled reply token at that temperature -- what EDR's sampled acceptance
  min(1, q(y_t) / p(y_t)) needs (docs/methods/edr.md);
* ``manifest.jsonl``: one line per rollout: key, id, category, source, split (train / eval by a
  deterministic hash of the key), shard, name, prompt_len, reply_len, stop (eos / max_new_tokens).

The folder is read back by :mod:`specviz.train.rollout_store` (``RolloutSet``).

A run is resumable: prompts whose key is already in the manifest are skipped; a shard is written
before its manifest lines, so an interrupted batch is simply generated again.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch

from ..errors import SettingsError, SpecvizError
from ..kvcache import accepts_logits_to_keep
from .loop import report_batch, step_bar
from .rollout_store import MANIFEST_NAME, next_shard_no, read_manifest, write_or_check_meta

STORE_DTYPES = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}


# --------------------------------------------------------------------------- small helpers
def prompt_key(item) -> str:
    """Stable identity of a prompt across runs: source file name + the loader's id."""
    return f"{getattr(item, 'source', '') or ''}:{item.id}"


def split_of(key: str, holdout: float) -> str:
    """'eval' for a deterministic ~``holdout`` fraction of keys (sha1 of the key), else 'train'."""
    if holdout <= 0:
        return "train"
    h = int.from_bytes(hashlib.sha1(key.encode("utf-8")).digest()[:8], "big") / 2.0 ** 64
    return "eval" if h < holdout else "train"


def parse_layers(spec: str | None, num_layers: int, k: int = 5) -> list[int]:
    """'auto' (or None) -> ``default_target_layer_ids(L, min(k, L))`` -- the ids a new DFlash
    drafter gets by default; else a comma-separated list of target layer ids."""
    from ..drafters.dflash.model import default_target_layer_ids

    if spec is None or str(spec).strip().lower() in ("", "auto"):
        return default_target_layer_ids(num_layers, min(k, num_layers))
    try:
        ids = [int(x) for x in str(spec).split(",") if x.strip()]
    except ValueError:
        raise SettingsError(f"--layers expects 'auto' or comma-separated layer ids, got '{spec}'")
    if not ids:
        raise SettingsError("--layers is empty")
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise SettingsError(f"--layers {bad} out of range for a target with {num_layers} layers")
    if len(set(ids)) != len(ids):
        raise SettingsError("--layers has duplicate ids")
    return ids


def _cache_kwarg(model) -> str:
    from ..kvcache import cache_kwarg as ck

    return ck(model)


# --------------------------------------------------------------------------- generation
@dataclass
class BatchResult:
    replies: list[list[int]]       # generated ids per prompt (EOS included when hit)
    hidden: list[torch.Tensor]     # [len(prompt) + len(reply), k*H] per prompt
    stops: list[str]               # "eos" / "max_new_tokens" / "context"
    probs: list[list[float]] | None = None  # sampled: p(y_t) of each reply token, else None


@torch.inference_mode()
def left_padded(prompts: list[list[int]], pad: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, position ids) [b, L] of ``prompts`` left-padded with ``pad``."""
    b, L = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((b, L), pad, dtype=torch.long)
    mask = torch.zeros((b, L), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):] = torch.tensor(p)
        mask[i, L - len(p):] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@dataclass
class _Picker:
    """Each row's next token: argmax, or sampled at ``temperature`` with ``generator`` (then the
    picked tokens' probabilities are kept, one tensor per step)."""

    temperature: float = 0.0
    generator: torch.Generator | None = None
    picked_p: list = field(default_factory=list)

    @property
    def sampled(self) -> bool:
        return bool(self.temperature and self.temperature > 0)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        if not self.sampled:
            return logits.argmax(-1).cpu()
        probs = torch.softmax(logits / self.temperature, -1).cpu()
        tok = torch.multinomial(probs, 1, generator=self.generator)
        self.picked_p.append(probs.gather(-1, tok).squeeze(-1))
        return tok.squeeze(-1)

    def probs(self, replies: list[list[int]]) -> list[list[float]] | None:
        """p(token) of every reply token (step s picked every row's s-th token); None: greedy."""
        if not self.sampled:
            return None
        return [[float(self.picked_p[s][i]) for s in range(len(r))] for i, r in enumerate(replies)]


def _commit(nxt: torch.Tensor, replies: list[list[int]], done: list[bool], stops: list[str],
            budgets: list[int], eos, max_new_tokens: int) -> None:
    """Append each running row's new token; a row stops at EOS or at its budget."""
    for i in range(len(replies)):
        if done[i]:
            continue
        t = int(nxt[i])
        replies[i].append(t)
        if t in eos:
            done[i], stops[i] = True, "eos"
        elif len(replies[i]) >= budgets[i]:
            done[i] = True
            stops[i] = "max_new_tokens" if budgets[i] == max_new_tokens else "context"


class _TappedForward:
    """The batch's KV-cached forwards (one ``DynamicCache``): each returns the last position's
    logits (only those are read: the next token) and the tapped layers' features [b, t, k*H] on
    CPU in the storage dtype (HF index = layer id + 1). Keeps the mask and positions for steps."""

    def __init__(self, target, layer_ids: list[int], store_dtype: torch.dtype,
                 mask: torch.Tensor, pos: torch.Tensor):
        from transformers import DynamicCache

        self.model, self.dev, self.store_dtype = target.model, target.device, store_dtype
        self.cache = DynamicCache(config=self.model.config)
        self.ck = _cache_kwarg(self.model)
        self.last_only = {"logits_to_keep": 1} if accepts_logits_to_keep(self.model) else {}
        self.taps = [i + 1 for i in layer_ids]
        self.mask, self.pos = mask, pos[:, -1]    # of the batch's latest position

    def __call__(self, inp, msk, p) -> tuple[torch.Tensor, torch.Tensor]:
        """(last-position logits [b, V], features [b, t, k*H]) of one forward."""
        out = self.model(input_ids=inp.to(self.dev), attention_mask=msk.to(self.dev),
                         position_ids=p.to(self.dev), use_cache=True, output_hidden_states=True,
                         **{self.ck: self.cache}, **self.last_only)
        feats = torch.cat([out.hidden_states[i] for i in self.taps], -1)
        return out.logits[:, -1], feats.to("cpu", self.store_dtype)

    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed one token per row [b, 1] at each row's next position."""
        b = tokens.shape[0]
        self.mask = torch.cat([self.mask, torch.ones((b, 1), dtype=torch.long)], -1)
        self.pos = self.pos + 1
        return self(tokens, self.mask, self.pos.view(b, 1))


class _Rows:
    """Per-prompt decoding state: reply so far, stopped or not and why, token budget, and the
    feature chunks (the prompt's rows, then one row per fed reply token)."""

    def __init__(self, lens: list[int], budgets: list[int], chunks: list[list[torch.Tensor]]):
        self.lens, self.budgets, self.chunks = lens, budgets, chunks
        self.replies: list[list[int]] = [[] for _ in lens]
        self.done = [bud <= 0 for bud in budgets]
        self.stops = ["context" if d else "max_new_tokens" for d in self.done]

    def fresh(self) -> list[int]:
        """Rows whose latest reply token has no features yet."""
        return [i for i in range(len(self.lens)) if self.replies[i] and
                sum(c.shape[0] for c in self.chunks[i]) < self.lens[i] + len(self.replies[i])]


def _decode(fwd: _TappedForward, pick: _Picker, rows: _Rows, nxt: torch.Tensor, pad: int,
            eos, max_new_tokens: int) -> None:
    """Commit each step's tokens and feed them back, keeping the new positions' features; one
    extra one-token step after the last reply token gives that token's states."""
    while True:
        _commit(nxt, rows.replies, rows.done, rows.stops, rows.budgets, eos, max_new_tokens)
        fresh = rows.fresh()
        if not fresh:
            break
        # feed each row's latest token (finished rows: their last token again, ignored)
        step = torch.tensor([[r[-1] if r else pad] for r in rows.replies], dtype=torch.long)
        logits, f = fwd.step(step)
        for i in fresh:
            rows.chunks[i].append(f[i, -1:])
        if all(rows.done):
            break
        nxt = pick(logits)


def generate_batch(target, prompts: list[list[int]], max_new_tokens: int, layer_ids: list[int],
                   store_dtype: torch.dtype = torch.float16, temperature: float = 0.0,
                   generator: torch.Generator | None = None) -> BatchResult:
    """Replies of ``target`` to ``prompts`` (token id lists) in one left-padded batch, with the
    tapped hidden states of every prompt + reply position (HF index = layer id + 1)."""
    lens = [len(p) for p in prompts]
    if not prompts or min(lens) == 0:
        raise SpecvizError("generate_batch needs non-empty prompts")
    L = max(lens)
    pad = int(min(target.eos_token_ids)) if target.eos_token_ids else 0
    budgets = [max(0, min(max_new_tokens, target.max_context - n)) for n in lens]
    ids, mask, pos = left_padded(prompts, pad)
    fwd = _TappedForward(target, layer_ids, store_dtype, mask, pos)
    pick = _Picker(temperature, generator)
    logits, pf = fwd(ids, mask, pos)            # the batched prompt forward
    rows = _Rows(lens, budgets, [[pf[i, L - n:]] for i, n in enumerate(lens)])
    _decode(fwd, pick, rows, pick(logits), pad, target.eos_token_ids, max_new_tokens)
    return BatchResult(replies=rows.replies, hidden=[torch.cat(c, 0) for c in rows.chunks],
                       stops=rows.stops, probs=pick.probs(rows.replies))


# --------------------------------------------------------------------------- storing
def _check_settings(max_new_tokens: int, batch_size: int, holdout: float,
                    store_dtype: str) -> None:
    """SettingsError (naming the CLI flag) for a setting out of range."""
    if max_new_tokens < 1:
        raise SettingsError("--max-new-tokens must be at least 1")
    if batch_size < 1:
        raise SettingsError("--batch-size must be at least 1")
    if not 0.0 <= holdout < 1.0:
        raise SettingsError("--holdout must be in [0, 1)")
    if store_dtype not in STORE_DTYPES:
        raise SettingsError(f"--dtype must be one of {', '.join(STORE_DTYPES)}")


def _target_dims(target) -> tuple[int, int]:
    """(number of layers, hidden size) of the target's text model."""
    tc = target.text_config
    return int(tc.num_hidden_layers), int(tc.hidden_size)


def _out_folder(out: str | Path) -> Path:
    """``out`` as a folder, created if missing; SpecvizError when it is a file."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SpecvizError(f"--out {out} is a file, not a folder")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _pending_prompts(target, items: list, out: Path, chat_template: bool | None,
                     max_prompt_tokens: int | None) -> list[tuple]:
    """(item, key, prompt ids) of the items still to generate, shortest first (similar lengths
    per batch: little padding): keys already in the manifest, repeated keys and prompts over
    ``max_prompt_tokens`` or leaving no room in the context are skipped."""
    done_keys = {r["key"] for r in read_manifest(out)}
    todo, seen = [], set()
    for it in items:
        key = prompt_key(it)
        if key in done_keys or key in seen:
            continue
        seen.add(key)
        ids = target.encode_prompt(it.text, chat_template)
        if max_prompt_tokens and len(ids) > max_prompt_tokens:
            continue
        if len(ids) >= target.max_context - 1:
            continue
        todo.append((it, key, ids))
    todo.sort(key=lambda x: len(x[2]))
    return todo


def _write_shard(out: Path, shard: str, batch: list[tuple], res: BatchResult,
                 holdout: float) -> int:
    """Write one generated batch as ``shard`` (``r{j}.tokens`` / ``.hidden`` / sampled: ``.p``),
    then append its manifest lines -- an interrupted batch leaves no lines, so it is simply
    generated again. Returns the batch's reply tokens."""
    from safetensors.torch import save_file

    tensors, lines = {}, []
    for j, ((it, key, ids), reply, hid, stop) in enumerate(zip(batch, res.replies, res.hidden,
                                                              res.stops)):
        name = f"r{j}"
        toks = torch.tensor(ids + reply, dtype=torch.int32)
        assert hid.shape[0] == toks.shape[0], (hid.shape, toks.shape)
        tensors[name + ".tokens"] = toks
        tensors[name + ".hidden"] = hid.contiguous()
        if res.probs is not None:
            tensors[name + ".p"] = torch.tensor(res.probs[j], dtype=torch.float32)
        lines.append({"key": key, "id": str(it.id), "category": getattr(it, "category", ""),
                      "source": getattr(it, "source", ""), "split": split_of(key, holdout),
                      "shard": shard, "name": name, "prompt_len": len(ids),
                      "reply_len": len(reply), "stop": stop})
    save_file(tensors, str(out / shard), metadata={"format": "pt"})
    with open(out / MANIFEST_NAME, "a", encoding="utf-8") as fh:
        for line in lines:
            fh.write(json.dumps(line) + "\n")
    return sum(line["reply_len"] for line in lines)


def make_rollouts(target, items: list, out: str | Path, max_new_tokens: int = 256,
                  batch_size: int = 16, layer_ids: list[int] | None = None,
                  holdout: float = 0.05, store_dtype: str = "float16", temperature: float = 0.0,
                  seed: int = 0, chat_template: bool | None = None,
                  max_prompt_tokens: int | None = None, model_name: str | None = None,
                  progress: Callable[[int, int, int], None] | None = None,
                  show_bar: bool = False) -> dict:
    """Generate and store rollouts for ``items`` (PromptItem-like: id, category, text, source),
    skipping keys already in the manifest. Returns a summary dict (counts, tokens, seconds)."""
    _check_settings(max_new_tokens, batch_size, holdout, store_dtype)
    L, H = _target_dims(target)
    layer_ids = list(layer_ids) if layer_ids is not None else parse_layers(None, L)
    out = _out_folder(out)
    write_or_check_meta(out, {
        "model": model_name or target.name, "target_layer_ids": layer_ids,
        "num_target_layers": L, "hidden_size": H, "dtype": store_dtype,
        "max_new_tokens": max_new_tokens, "temperature": float(temperature),
        "chat_template": chat_template, "holdout": holdout,
        "vocab_size": int(target.model.get_input_embeddings().num_embeddings)})
    todo = _pending_prompts(target, items, out, chat_template, max_prompt_tokens)
    next_shard = next_shard_no(out)
    gen = torch.Generator().manual_seed(int(seed))
    bar = step_bar(show_bar, len(todo), "rollouts", unit="prompt")
    t0, new_tokens, n_done = time.perf_counter(), 0, 0
    for s in range(0, len(todo), batch_size):
        batch = todo[s:s + batch_size]
        res = generate_batch(target, [b[2] for b in batch], max_new_tokens, layer_ids,
                             store_dtype=STORE_DTYPES[store_dtype], temperature=temperature,
                             generator=gen)
        shard = f"shard-{next_shard + s // batch_size:05d}.safetensors"
        new_tokens += _write_shard(out, shard, batch, res, holdout)
        n_done += len(batch)
        report_batch(bar, progress, len(batch), n_done, len(todo), new_tokens, t0)
    if bar is not None:
        bar.close()
    el = time.perf_counter() - t0
    return {"generated": n_done, "skipped": len(items) - len(todo), "new_tokens": new_tokens,
            "seconds": el, "tokens_per_s": new_tokens / el if el > 0 and new_tokens else 0.0,
            "total": len(read_manifest(out)), "out": str(out)}


def load_items(data: Iterable[str], limit: int | None = None):
    """``--data FILE[:N]`` entries -> PromptItems via :func:`specviz.bench.load_prompts`;
    ``edit:MBPP_FILE[:N[:START]]`` -> the code-editing prompts of :mod:`specviz.editset`."""
    from ..bench import load_prompts
    from ..editset import load_edit_spec

    items = []
    for d in data:
        if str(d).startswith("edit:"):
            items += load_edit_spec(str(d))
            continue
        lim = limit
        head, _, tail = str(d).rpartition(":")
        if head and tail.isdigit():
            d, lim = head, int(tail)
        items += load_prompts(d, limit=lim)
    if not items:
        raise SpecvizError("no prompts selected")
    return items
