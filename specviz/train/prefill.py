"""Prefill-labelled training data for DFlash (docs/methods/dflash.md): exact target labels at
prefill speed.

Generating rollouts runs at decode speed (~49 tok/s on a 2-core CPU). One batched forward over an
existing text (prompt + a reference reply: GSM8K answers, MBPP code, Alpaca outputs, Spec-Bench
references) runs at prefill speed and gives, at every position t, the target's greedy next token
``greedy[t] = argmax p(. | text[:t+1])`` and the tapped hidden states. These labels are *exact*:

For an anchor a (the block's first slot holds text[a]; the drafter sees context < a), slot k's
label is the target's greedy token k after the anchor, which is ``greedy[a+k-1]`` exactly as long as
the text already followed the greedy path on the slots before it, i.e.
``text[a+j] == greedy[a+j-1]`` for j = 1..k-1. Slot 1 is always exact; the first disagreement
masks every later slot of that block (:func:`exact_prefix_labels`). For a greedy rollout the text
IS the greedy path, so every slot is labelled and the labels equal ``text[a+k]``.

Stored in the rollouts layout (:mod:`specviz.train.rollouts`: ``meta.json``, safetensors shards,
``manifest.jsonl``) plus ``{name}.greedy`` int32 [T] per sequence, so training, replay and
``RolloutSet`` read both kinds of folder. Manifest rows carry ``"kind": "prefill"``; their
``split`` is always "train" (the held-out tau is measured on greedy rollouts, where it is exact).

Re-tapping (:func:`rollout_texts`): greedy rollouts stored with other tapped layers (e.g. the
history store's, which keep one layer) are prefilled the same way, token ids as stored; where
the stored reply is the target's greedy path every slot is labelled, and where it is not (a
rollout made in another dtype) the exact-prefix rule still applies.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..errors import SettingsError, SpecvizError
from .loop import report_batch, step_bar
from .rollout_store import (MANIFEST_NAME, RolloutSet, next_shard_no, read_manifest,
                            write_or_check_meta)
from .rollouts import STORE_DTYPES, parse_layers, prompt_key

_CALC = re.compile(r"<<[^<>]*>>")


@dataclass
class TextPair:
    key: str           # prompt_key of the prompt (same as the rollouts' / bench's)
    category: str
    prompt: str
    reply: str


@dataclass
class TokenText:
    """A stored token sequence to prefill as it is (a greedy rollout being re-tapped)."""
    key: str
    category: str
    ids: list[int]
    prompt_len: int


# --------------------------------------------------------------------------- the texts
def reference_reply(row: dict) -> str | None:
    """The reference reply of a row of the public sets (None when the row has none).
    GSM8K's calculator annotations ``<<48/2=24>>`` are removed (no model writes them)."""
    if "turns" in row:
        ref = row.get("reference") or []
        return str(ref[0]) if ref and str(ref[0]).strip() else None
    if "question" in row and "answer" in row:
        return _CALC.sub("", str(row["answer"])).replace("#### ", "The answer is ")
    if "text" in row and "code" in row:
        return str(row["code"]).replace("\r\n", "\n")
    if "instruction" in row:
        inst = row.get("instances") or []
        out = inst[0].get("output") if inst and isinstance(inst[0], dict) else None
        return str(out) if out and str(out).strip() else None
    return None


def load_pairs(spec: str, limit: int | None = None) -> list[TextPair]:
    """``FILE[:N]`` -> (prompt, reference reply) pairs of the rows that have a reference; the
    first N prompts of each category (as ``bench.load_prompts`` counts them)."""
    from ..bench import jsonl_rows

    head, _, tail = str(spec).rpartition(":")
    path, lim = (head, int(tail)) if head and tail.isdigit() else (spec, limit)
    p = Path(path)
    if not p.is_file():
        raise SpecvizError(f"data file {p} does not exist")
    pairs, counts = [], {}
    for row, item in jsonl_rows(p):
        if lim is not None and counts.get(item.category, 0) >= lim:
            continue
        counts[item.category] = counts.get(item.category, 0) + 1
        reply = reference_reply(row)
        if reply:
            pairs.append(TextPair(prompt_key(item), item.category, item.text, reply))
    return pairs


def rollout_texts(folder: str | Path) -> list[TokenText]:
    """The sequences of a rollouts folder (every split) as :class:`TokenText` to re-tap."""
    rs = RolloutSet(folder)
    if not len(rs):
        raise SpecvizError(f"{folder} holds no rollouts (no manifest rows)")
    out = []
    for i, r in enumerate(rs.rows):
        toks, _, plen = rs.load(i)
        out.append(TokenText(r["key"], r.get("category", ""), toks.tolist(), plen))
    return out


# --------------------------------------------------------------------------- the labels
def exact_prefix_labels(tokens: torch.Tensor, greedy: torch.Tensor, anchors: torch.Tensor,
                        block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels [K, B-1], valid [K, B-1]) for blocks anchored at ``anchors``.

    Slot k (1..B-1) of the block at a: label ``greedy[a+k-1]``; valid iff a+k-1 < T and the text
    followed the greedy path before it (``tokens[a+j] == greedy[a+j-1]`` for j < k)."""
    T = int(tokens.shape[0])
    k = torch.arange(1, block_size).view(1, -1)
    pos = anchors.view(-1, 1) + k - 1                                     # [K, B-1]
    inside = pos < T
    posc = pos.clamp(max=T - 1)
    labels = greedy[posc]
    # follows[t] = text[t+1] == greedy[t]  (t = 0..T-2); slot k needs follows[a..a+k-2]
    follows = torch.zeros(T, dtype=torch.bool)
    follows[:-1] = tokens[1:] == greedy[:-1]
    prev_ok = torch.ones_like(inside)
    prev_ok[:, 1:] = follows[posc[:, :-1]] & inside[:, :-1]
    valid = inside & torch.cumprod(prev_ok.long(), 1).bool()
    return labels, valid


def rollout_labels(tokens: torch.Tensor, anchors: torch.Tensor,
                   block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels of a greedy rollout (the text is the greedy path): ``tokens[a+k]`` while a+k < T."""
    T = int(tokens.shape[0])
    tpos = anchors.view(-1, 1) + torch.arange(1, block_size).view(1, -1)
    return tokens[tpos.clamp(max=T - 1)], tpos < T


def block_labels(tokens: torch.Tensor, greedy: torch.Tensor | None, anchors: torch.Tensor,
                 block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The labels of either kind of stored sequence: a greedy rollout (``greedy`` None) or a
    prefill-labelled text."""
    if greedy is None:
        return rollout_labels(tokens, anchors, block_size)
    return exact_prefix_labels(tokens, greedy, anchors, block_size)


# --------------------------------------------------------------------------- the forward
def token_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices of ``lengths`` sorted by length, cut into batches of about ``batch_tokens``
    padded tokens (similar lengths together: little padding)."""
    order = sorted(range(len(lengths)), key=lambda j: lengths[j])
    out, s = [], 0
    while s < len(order):
        n = max(1, batch_tokens // lengths[order[min(len(order) - 1, s + 1)]])
        out.append(order[s:s + n])
        s += n
    return out


def right_padded(seqs: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids [b, L], attention mask [b, L]) of ``seqs`` padded on the right with zeros
    (a causal forward's rows 0..len-1 of each sequence are then exactly its own)."""
    b, L = len(seqs), max(len(s) for s in seqs)
    ids = torch.zeros((b, L), dtype=torch.long)
    mask = torch.zeros((b, L), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    return ids.to(device), mask.to(device)


@torch.inference_mode()
def prefill_batch(target, seqs: list[list[int]], layer_ids: list[int],
                  store_dtype: torch.dtype = torch.float16) -> tuple[list, list]:
    """One right-padded forward over ``seqs``: per sequence the tapped hidden states [T, k*H]
    (HF index = layer id + 1) and the greedy next token at every position [T]."""
    ids, mask = right_padded(seqs, target.device)
    out = target.model(input_ids=ids, attention_mask=mask, use_cache=False,
                       output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i + 1] for i in layer_ids], -1).to("cpu", store_dtype)
    greedy = out.logits.argmax(-1).to("cpu", torch.int32)
    return ([feats[i, :len(s)].contiguous() for i, s in enumerate(seqs)],
            [greedy[i, :len(s)].contiguous() for i, s in enumerate(seqs)])


def encode_pair(target, pair: TextPair | TokenText) -> tuple[list[int], int]:
    """(prompt + reply + end-of-turn ids, prompt length) with the chat template; a
    :class:`TokenText` as stored."""
    if isinstance(pair, TokenText):
        return list(pair.ids), pair.prompt_len
    p = target.encode_prompt(pair.prompt)
    r = target.tokenizer(pair.reply, add_special_tokens=False)["input_ids"]
    eos = sorted(target.eos_token_ids)[:1] if target.eos_token_ids else []
    return p + [int(x) for x in r] + eos, len(p)


# --------------------------------------------------------------------------- the store
def _check_settings(store_dtype: str, batch_tokens: int, max_tokens: int) -> None:
    """SettingsError (naming the CLI flag) for a setting out of range."""
    if store_dtype not in STORE_DTYPES:
        raise SettingsError(f"--dtype must be one of {', '.join(STORE_DTYPES)}")
    if batch_tokens < 1 or max_tokens < 8:
        raise SettingsError("--batch-tokens must be >= 1 and --max-tokens >= 8")


def _write_meta(target, out: Path, layer_ids, store_dtype: str,
                model_name: str | None) -> list[int]:
    """Create ``out`` and write (or check) its ``meta.json``; returns the tapped layer ids
    (default: the DFlash default of :func:`parse_layers`)."""
    tc = target.text_config
    L, H = int(tc.num_hidden_layers), int(tc.hidden_size)
    layer_ids = list(layer_ids) if layer_ids is not None else parse_layers(None, L)
    out.mkdir(parents=True, exist_ok=True)
    write_or_check_meta(out, {"model": model_name or target.name, "target_layer_ids": layer_ids,
                      "num_target_layers": L, "hidden_size": H, "dtype": store_dtype,
                      "vocab_size": int(target.model.get_input_embeddings().num_embeddings),
                      "holdout": 0.0})
    return layer_ids


def _pending_texts(target, pairs: list[TextPair | TokenText], out: Path,
                   max_tokens: int) -> list[tuple]:
    """(pair, ids cut at ``max_tokens``, prompt length) of the pairs still to prefill: keys
    already stored, repeated keys and prompts leaving under 2 tokens of room are skipped."""
    done = {r["key"] for r in read_manifest(out)}
    todo = []
    for pr in pairs:
        if pr.key in done:
            continue
        done.add(pr.key)
        ids, plen = encode_pair(target, pr)
        if plen + 2 > max_tokens:
            continue
        todo.append((pr, ids[:max_tokens], plen))
    return todo


def _write_shard(out: Path, shard: str, batch: list[tuple], hid: list,
                 greedy: list) -> tuple[int, int]:
    """Write one prefilled batch as ``shard`` (``r{j}.tokens`` / ``.hidden`` / ``.greedy``),
    then append its manifest lines; returns its (tokens, reply tokens)."""
    from safetensors.torch import save_file

    tensors, lines, ntok, nexact = {}, [], 0, 0
    for j, ((pr, ids, plen), h, g) in enumerate(zip(batch, hid, greedy)):
        toks = torch.tensor(ids, dtype=torch.int32)
        tensors[f"r{j}.tokens"], tensors[f"r{j}.hidden"], tensors[f"r{j}.greedy"] = toks, h, g
        follows = int((toks[plen:] == g[plen - 1:-1]).sum())
        lines.append({"key": pr.key, "id": pr.key.split(":", 1)[-1], "category": pr.category,
                      "source": pr.key.split(":", 1)[0], "split": "train", "shard": shard,
                      "name": f"r{j}", "prompt_len": plen, "reply_len": len(ids) - plen,
                      "stop": "text" if isinstance(pr, TextPair) else "rollout",
                      "kind": "prefill", "greedy_agree": follows})
        ntok += len(ids)
        nexact += len(ids) - plen
    save_file(tensors, str(out / shard), metadata={"format": "pt"})
    with open(out / MANIFEST_NAME, "a", encoding="utf-8") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in lines)
    return ntok, nexact


def make_prefill_set(target, pairs: list[TextPair | TokenText], out: str | Path, layer_ids=None,
                     batch_tokens: int = 4096, max_tokens: int = 768,
                     store_dtype: str = "float16", model_name: str | None = None,
                     show_bar: bool = False,
                     progress: Callable[[int, int, int], None] | None = None) -> dict:
    """Prefill ``pairs`` (skipping keys already stored) into ``out``; returns counts and
    tokens/s. Sequences longer than ``max_tokens`` are cut there; batches hold about
    ``batch_tokens`` tokens (similar lengths together)."""
    _check_settings(store_dtype, batch_tokens, max_tokens)
    out = Path(out)
    layer_ids = _write_meta(target, out, layer_ids, store_dtype, model_name)
    todo = _pending_texts(target, pairs, out, max_tokens)
    shard_no = next_shard_no(out)
    bar = step_bar(show_bar, len(todo), "prefill", unit="text")
    t0, ntok, nexact, s = time.perf_counter(), 0, 0, 0
    for part in token_batches([len(x[1]) for x in todo], batch_tokens):
        batch = [todo[j] for j in part]
        s += len(batch)
        hid, greedy = prefill_batch(target, [b[1] for b in batch], layer_ids,
                                    STORE_DTYPES[store_dtype])
        n, r = _write_shard(out, f"shard-{shard_no:05d}.safetensors", batch, hid, greedy)
        shard_no, ntok, nexact = shard_no + 1, ntok + n, nexact + r
        report_batch(bar, progress, len(batch), min(s, len(todo)), len(todo), ntok, t0,
                     rate_format=".0f")
    if bar is not None:
        bar.close()
    el = time.perf_counter() - t0
    return {"texts": len(todo), "tokens": ntok, "reply_tokens": nexact, "seconds": el,
            "tokens_per_s": ntok / el if el > 0 and ntok else 0.0,
            "total": len(read_manifest(out)), "out": str(out)}
