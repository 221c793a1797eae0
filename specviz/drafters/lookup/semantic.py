"""Semantic retrieval for prompt lookup (docs/methods/adapld.md, AdaPLD idea 2): when lexical
matching finds no match of two or more tokens, windows of the context similar to the last ``window``
tokens propose what followed them.

:class:`WindowIndex` embeds every ``window``-token sliding window once (lazily, only the new
ones); :func:`semantic_candidates` ranks them by cosine similarity, aligned (windows that end with
the current last token) or free (any window: a paraphrase with no shared token). Embedders:
:func:`target_embed_fn` (the centred mean of the target's own input-embedding rows, no extra
model) and :func:`minilm_embed_fn` (all-MiniLM-L6-v2 on the decoded window text).
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from .index import Candidate, NgramIndex, copy_tokens

EmbedFn = Callable[[list[list[int]]], torch.Tensor]


class WindowIndex:
    """Embeddings of every ``window``-token sliding window of the context, computed once each.

    Window j ends at position ``window + j`` (exclusive), i.e. covers tokens[p - window : p] and
    its copy starts at p. :meth:`update` embeds only windows not embedded yet;
    ``windows_embedded`` counts every embedding ever computed (no window is embedded twice).
    """

    def __init__(self, window: int, embed_fn: EmbedFn):
        self.window = int(window)
        self.embed_fn = embed_fn
        self.vecs: torch.Tensor | None = None
        self.count = 0
        self.windows_embedded = 0
        self.embed_time = 0.0

    def reset(self) -> None:
        self.vecs = None
        self.count = 0

    def update(self, tokens: Sequence[int], upto: int | None = None) -> int:
        """Embed the windows ending at positions up to ``upto`` (default len(tokens))."""
        upto = len(tokens) if upto is None else upto
        w = self.window
        first = w + self.count
        if upto < first:
            return 0
        wins = [list(tokens[p - w:p]) for p in range(first, upto + 1)]
        t0 = time.perf_counter()
        new = self.embed_fn(wins).float().cpu()
        self.embed_time += time.perf_counter() - t0
        m = new.shape[0]
        if self.vecs is None:
            self.vecs = torch.zeros(max(64, 2 * m), new.shape[1])
        elif self.count + m > self.vecs.shape[0]:
            grown = torch.zeros(max(2 * self.vecs.shape[0], self.count + m), self.vecs.shape[1])
            grown[:self.count] = self.vecs[:self.count]
            self.vecs = grown
        self.vecs[self.count:self.count + m] = new
        self.count += m
        self.windows_embedded += m
        return m

    def query(self, tokens: Sequence[int], top_k: int, threshold: float,
              ends: Sequence[int] | None = None) -> list[tuple[int, float]]:
        """Windows most similar to the last ``window`` tokens: [(end position, cosine)], best first.

        Candidates end at p in [window, L - window] (no overlap with the query window), or only at
        the given ``ends``; they are kept at least window/2 apart (non-maximum suppression) and
        only similarities >= ``threshold`` are returned."""
        w = self.window
        L = len(tokens)
        if L < 2 * w or top_k <= 0:
            return []
        self.update(tokens, L)
        q = self.vecs[L - w]
        if ends is None:
            pos = torch.arange(w, L - w + 1)
        else:
            pos = torch.tensor(sorted({int(e) for e in ends if w <= e <= L - w}), dtype=torch.long)
            if pos.numel() == 0:
                return []
        sims = self.vecs[pos - w] @ q
        keep = sims >= threshold
        pos, sims = pos[keep], sims[keep]
        order = torch.argsort(sims, descending=True).tolist()
        gap = max(1, w // 2)
        out: list[tuple[int, float]] = []
        for j in order:
            p = int(pos[j])
            if all(abs(p - q_) >= gap for q_, _ in out):
                out.append((p, float(sims[j])))
                if len(out) >= top_k:
                    break
        return out


_MEANS: dict[tuple, torch.Tensor] = {}


def _embedding_mean(weight: torch.Tensor) -> torch.Tensor:
    """The mean embedding row, float32, computed once per weight tensor (and version): a fresh
    mean over a 49k-row matrix costs ~40 ms, as much as a target forward, on every prompt."""
    key = (weight.data_ptr(), tuple(weight.shape), str(weight.dtype), str(weight.device),
           weight._version)
    mean = _MEANS.get(key)
    if mean is None:
        with torch.inference_mode():
            mean = weight.float().mean(0)
        if len(_MEANS) > 8:
            _MEANS.clear()
        _MEANS[key] = mean
    return mean


def target_embed_fn(target) -> EmbedFn:
    """Window embedding from the target's own input embeddings: centred mean, L2-normalised.
    Computed where the embedding matrix lives (no copy of it); returns float32 CPU rows."""
    weight = target.model.get_input_embeddings().weight.detach()
    mean = _embedding_mean(weight)

    def embed(wins: list[list[int]]) -> torch.Tensor:
        idx = torch.tensor(wins, dtype=torch.long, device=weight.device)
        with torch.inference_mode():
            v = weight[idx].float().mean(1) - mean
            return torch.nn.functional.normalize(v, dim=-1).cpu()

    return embed


def minilm_embed_fn(tokenizer, model=None) -> EmbedFn:
    """Window embedding with all-MiniLM-L6-v2 on the decoded text of each window."""
    from ...embedder import load_minilm

    st = model if model is not None else load_minilm("cpu")

    def embed(wins: list[list[int]]) -> torch.Tensor:
        texts = [tokenizer.decode(w, skip_special_tokens=True) for w in wins]
        with torch.inference_mode():
            v = st.encode(texts, batch_size=64, convert_to_tensor=True,
                          normalize_embeddings=True, show_progress_bar=False)
        return v.float().cpu()

    return embed


def semantic_candidates(windex: WindowIndex, tokens: Sequence[int], length: int, top_k: int,
                        threshold: float, eos: set[int] | frozenset = frozenset(),
                        aligned: bool = True, index: NgramIndex | None = None) -> list[Candidate]:
    """Semantic retrieval: context windows similar to the last ``window`` tokens, and what
    followed them, best first.

    ``aligned=True`` only considers windows that end with the current last token (the unigram
    anchors; ``index`` supplies them), so the copy is aligned with the suffix;
    ``aligned=False`` considers every earlier window (paraphrases with no shared token)."""
    L = len(tokens)
    ends = None
    if aligned:
        if not L:
            return []
        if index is not None and len(index.tokens) == L:
            ends = index.ends([tokens[-1]])
        else:
            last = tokens[-1]
            ends = [e for e in range(1, L) if tokens[e - 1] == last]
        if not ends:
            return []
    out = []
    for p, sim in windex.query(tokens, top_k, threshold, ends):
        cont = copy_tokens(tokens, p, length, eos)
        if cont:
            out.append(Candidate("semantic", cont, (p - windex.window, p), float(sim),
                                 similarity=float(sim)))
    return out
