"""Soft labels for DFlash training (docs/methods/dflash.md): the target's top-k.

A greedy rollout gives one hard label per slot (the target's argmax). The same verify position
also has the target's whole next-token distribution p(. | text[:t+1]); its top-k words and
probabilities are a richer, still exact, training signal per token of text (knowledge
distillation: the drafter learns which words the target *almost* chose). Computing it costs one
batched forward over the stored token ids (prefill speed, no decoding), once per folder.

Layout: beside each rollouts shard ``shard-N.safetensors`` a sidecar ``soft-shard-N.safetensors``
with ``{name}.topk_ids`` int32 [T, k] and ``{name}.topk_p`` float16 [T, k]: row t is the
target's distribution of token t + 1 (the row of the verify forward that judges it), best first.
``soft.json`` records k and the model. Sidecars are written whole (temporary file, then rename),
so an interrupted run resumes at the first shard without one.

Loss (:func:`soft_ce`): for slot k of the block at anchor a, the row a + k - 1 -- exactly the
rows whose hard labels are valid (a greedy rollout's every slot; a prefill text's exact prefix,
:func:`specviz.train.prefill.exact_prefix_labels`). Target mass on words outside the step's
softmax support (the draft vocabulary plus sampled negatives) is dropped and the rest
renormalised: the drafter can only ever draft words of its vocabulary. ``train dflash
--soft-weight lam`` trains on (1 - lam) * hard CE + lam * soft CE (= KL(p_topk || q) + const).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ..errors import SettingsError, SpecvizError
from .loop import step_bar
from .prefill import right_padded, token_batches
from .rollout_store import RolloutSet

META_NAME = "soft.json"
HEAD_CHUNK = 512   # rows of the 49k-word LM head at a time (memory: 512 x V floats)


def sidecar_name(shard: str) -> str:
    return f"soft-{shard}"


@torch.inference_mode()
def topk_rows(target, seqs: list[list[int]], k: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One right-padded forward over ``seqs``: per sequence the target's top-``k`` next-token
    (ids int32 [T, k], probs float16 [T, k]) at every position."""
    ids, mask = right_padded(seqs, target.device)
    base = target.model.get_decoder() if hasattr(target.model, "get_decoder") else target.model.model
    h = base(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    head = target.model.get_output_embeddings()
    out = []
    for i, s in enumerate(seqs):
        rows_id, rows_p = [], []
        for c in range(0, len(s), HEAD_CHUNK):
            logp = torch.log_softmax(head(h[i, c:min(len(s), c + HEAD_CHUNK)]).float(), -1)
            top = logp.topk(k, -1)
            rows_id.append(top.indices.to("cpu", torch.int32))
            rows_p.append(top.values.exp().to("cpu", torch.float16))
        out.append((torch.cat(rows_id), torch.cat(rows_p)))
    return out


def _check_meta(folder: Path, meta: dict) -> None:
    path = folder / META_NAME
    if path.is_file():
        old = json.loads(path.read_text())
        if old != meta:
            raise SpecvizError(f"{folder} already holds soft labels made with {old}; asked for "
                               f"{meta}: delete its soft-*.safetensors and {META_NAME} first")
    else:
        path.write_text(json.dumps(meta))


def _check_settings(k: int, batch_tokens: int) -> None:
    """SettingsError (naming the CLI flag) for a setting out of range."""
    if not 1 <= int(k) <= 64:
        raise SettingsError("--topk must be between 1 and 64")
    if batch_tokens < 1:
        raise SettingsError("--batch-tokens must be at least 1")


def _open_rollouts(folder: Path) -> RolloutSet:
    """The rollouts of ``folder``; SpecvizError when it holds none."""
    rs = RolloutSet(folder)
    if not len(rs):
        raise SpecvizError(f"{folder} holds no rollouts (no manifest rows)")
    return rs


def _pending_shards(rs: RolloutSet, folder: Path) -> tuple[dict[str, list[int]], list[str]]:
    """(rollout indices per shard, the shards without a sidecar yet -- an interrupted run
    resumes at the first of them)."""
    by_shard: dict[str, list[int]] = {}
    for i, r in enumerate(rs.rows):
        by_shard.setdefault(r["shard"], []).append(i)
    return by_shard, [s for s in by_shard if not (folder / sidecar_name(s)).is_file()]


def _shard_topk(target, rs: RolloutSet, rows: list[int], k: int,
                batch_tokens: int) -> tuple[dict, int, int, int]:
    """(sidecar tensors ``{name}.topk_ids`` / ``.topk_p``, tokens, reply tokens whose stored
    token is the target's argmax, reply tokens) of the rollouts ``rows`` of one shard."""
    seqs = [rs.tokens(i).tolist() for i in rows]
    tensors, ntok, agree, judged = {}, 0, 0, 0
    for part in token_batches([len(q) for q in seqs], batch_tokens):
        for j, (ids, p) in zip(part, topk_rows(target, [seqs[j] for j in part], k)):
            name = rs.rows[rows[j]]["name"]
            tensors[f"{name}.topk_ids"], tensors[f"{name}.topk_p"] = ids, p
            plen = int(rs.rows[rows[j]]["prompt_len"])
            nxt = torch.tensor(seqs[j][plen:])
            agree += int((ids[plen - 1:-1, 0].long() == nxt).sum())
            judged += len(nxt)
            ntok += len(seqs[j])
    return tensors, ntok, agree, judged


def _write_sidecar(folder: Path, shard: str, tensors: dict) -> None:
    """Write the shard's sidecar whole: a temporary file, then a rename."""
    from safetensors.torch import save_file

    tmp = folder / (sidecar_name(shard) + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, folder / sidecar_name(shard))


def make_soft_labels(target, folder: str | Path, k: int = 8, batch_tokens: int = 4096,
                     model_name: str | None = None, show_bar: bool = False,
                     progress: Callable[[int, int], None] | None = None) -> dict:
    """Write the top-``k`` sidecar of every shard of the rollouts ``folder`` that has none yet;
    returns counts, tokens/s and how often the target's argmax equals the stored next token
    (1.0 for greedy rollouts of this target, up to near-ties of batched numerics)."""
    _check_settings(k, batch_tokens)
    folder = Path(folder)
    rs = _open_rollouts(folder)
    _check_meta(folder, {"topk": int(k), "model": model_name or target.name})
    by_shard, todo = _pending_shards(rs, folder)
    bar = step_bar(show_bar, len(todo), f"soft labels {folder.name}", unit="shard")
    t0, ntok, agree, judged = time.perf_counter(), 0, 0, 0
    for n, shard in enumerate(todo):
        tensors, t, a, j = _shard_topk(target, rs, by_shard[shard], k, batch_tokens)
        ntok, agree, judged = ntok + t, agree + a, judged + j
        _write_sidecar(folder, shard, tensors)
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{ntok / max(time.perf_counter() - t0, 1e-9):.0f} tok/s")
        if progress:
            progress(n + 1, len(todo))
    if bar is not None:
        bar.close()
    el = time.perf_counter() - t0
    return {"shards": len(todo), "tokens": ntok, "seconds": el,
            "tokens_per_s": ntok / el if el > 0 and ntok else 0.0,
            "argmax_agree": agree / judged if judged else None, "out": str(folder)}


def read_soft(rs: RolloutSet, i: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(top-k ids long [T, k], probs float [T, k]) of rollout ``i``; None without a sidecar."""
    from safetensors import safe_open

    r = rs.rows[i]
    path = rs.folder / sidecar_name(r["shard"])
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            ids = f.get_tensor(r["name"] + ".topk_ids").long()
            p = f.get_tensor(r["name"] + ".topk_p").float()
    except Exception as exc:
        raise SpecvizError(f"soft labels {path} cannot be read ({exc}): delete the file and "
                           "rerun `python -m specviz train soft-labels`") from exc
    n = int(rs.tokens(i).shape[0])
    if ids.shape[0] != n or ids.shape != p.shape:
        raise SpecvizError(f"soft labels of {r.get('key')} in {path} do not match the rollout "
                           f"({ids.shape[0]} rows for {n} tokens)")
    return ids, p


def slot_soft_targets(soft: tuple[torch.Tensor, torch.Tensor], anchors: torch.Tensor,
                      block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [K, B-1, k], probs [K, B-1, k]) for the slots of blocks at ``anchors``: slot k
    reads row a + k - 1 (rows past the end are clamped; the hard labels' mask drops them)."""
    ids, p = soft
    T = int(ids.shape[0])
    pos = (anchors.view(-1, 1) + torch.arange(0, block_size - 1).view(1, -1)).clamp(max=T - 1)
    return ids[pos], p[pos]


def soft_ce(logits: torch.Tensor, ids: torch.Tensor, p: torch.Tensor,
            vocab: torch.Tensor | None) -> torch.Tensor:
    """-sum_v p(v) log q(v) per slot [K, B-1]: ``logits`` [K, B-1, V'] over the step's support
    ``vocab`` (sorted ids; None = the full vocabulary), target top-k ``ids`` / ``p`` renormalised
    over the words inside the support."""
    if vocab is None:
        idx, inside = ids, torch.ones_like(ids, dtype=torch.bool)
    else:
        vocab = vocab.to(ids.device)
        idx = torch.searchsorted(vocab, ids).clamp(max=vocab.numel() - 1)
        inside = vocab[idx] == ids
    w = p * inside
    w = w / w.sum(-1, keepdim=True).clamp_min(1e-9)
    logq = F.log_softmax(logits, -1).gather(-1, idx.to(logits.device))
    return -(w.to(logq.device) * logq).sum(-1)
