"""The target-feature context cache shared by hidden-state drafters (docs/methods/dflash.md: DFlash,
and any later drafter conditioned on the target hidden states).

A drafter conditioned on the target's hidden states keeps, for every committed position except
the last committed token (that one is the next block's anchor), tensors derived from the
target's *tapped* layers: DFlash keeps each drafter layer's context K/V. The prefill fills the
cache once; after each round only the newly committed rows of the verify forward are appended
(``VerifyFeedback.kept_rows``), and a rejected round never leaves rows behind (``crop``). In
offline replay the same rows come from a stored rollout instead of a live forward.

Conventions: ``hidden_states`` is HF's ``output_hidden_states`` tuple (index = layer id + 1);
``layers`` are those indices; features are concatenated on the last dim -> [1, n, k*H].
"""
from __future__ import annotations

from typing import Sequence

import torch


def tapped_features(hidden_states, layers: Sequence[int],
                    rows: Sequence[int] | None = None) -> torch.Tensor:
    """[1, n, k*H]: the tapped layers of a target forward, concatenated, at ``rows`` (all
    rows when None)."""
    if hidden_states is None:
        raise RuntimeError("this drafter needs the target's hidden states (hidden_state_layers)")
    feats = torch.cat([hidden_states[i] for i in layers], dim=-1)
    if rows is not None:
        feats = feats[:, torch.as_tensor(list(rows), dtype=torch.long, device=feats.device)]
    return feats


class ContextCache:
    """Tensors with one entry per committed context position along ``seq_dim``.

    Stored in buffers with spare room (capacity doubles when full), so appending a round's few
    rows writes them in place instead of copying the whole cache every round; ``tensors`` are
    views of the first ``len(self)`` positions, valid until the next ``append`` / ``crop``."""

    def __init__(self, seq_dim: int = 2):
        self.seq_dim = seq_dim
        self._store: list[torch.Tensor] = []
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [t.narrow(self.seq_dim, 0, self._n) for t in self._store]

    @property
    def capacity(self) -> int:
        return int(self._store[0].shape[self.seq_dim]) if self._store else 0

    def reset(self) -> None:
        self._store, self._n = [], 0

    def crop(self, n: int) -> None:
        """Keep the first ``n`` positions."""
        self._n = max(0, min(self._n, int(n)))

    def append(self, new: Sequence[torch.Tensor]) -> None:
        """Append the next positions (one tensor per cached stream, same order every time)."""
        new = list(new)
        t = int(new[0].shape[self.seq_dim])
        if self._n + t > self.capacity:
            self._grow(new, max(2 * self.capacity, self._n + t, 64))
        for buf, x in zip(self._store, new):
            buf.narrow(self.seq_dim, self._n, t).copy_(x)
        self._n += t

    def _grow(self, like: Sequence[torch.Tensor], capacity: int) -> None:
        store = []
        for i, x in enumerate(like):
            shape = list(x.shape)
            shape[self.seq_dim] = capacity
            buf = x.new_empty(shape)
            if self._store and self._n:
                buf.narrow(self.seq_dim, 0, self._n).copy_(self._store[i].narrow(self.seq_dim, 0, self._n))
            store.append(buf)
        self._store = store


class LazyContextKV:
    """A drafter's per-layer context K/V, filled lazily: committed rows are queued as tapped
    features (:func:`tapped_features`) and projected to K/V in one batch (``project(features,
    positions)`` -> one (K, V) per drafter layer) only when the next block needs them, so a
    round in which the drafter does not run (DFlash's forward gate) costs it nothing."""

    def __init__(self, layers: Sequence[int], project, device, dtype):
        self.layers, self.project = list(layers), project
        self.device, self.dtype = device, dtype
        self._ctx = ContextCache(seq_dim=2)
        self.reset()

    def __len__(self) -> int:
        return len(self._ctx) + sum(int(f.shape[1]) for f in self._pending)

    def reset(self) -> None:
        self._ctx.reset()
        self._pending: list[torch.Tensor] = []
        self._pending_start = 0

    def crop(self, n: int) -> None:
        """Keep the first ``n`` context positions (K/V and queued features)."""
        done = len(self._ctx)
        if n <= done:
            self._ctx.crop(n)
            self._pending = []
            return
        keep, left = [], n - done
        for f in self._pending:
            if left <= 0:
                break
            keep.append(f[:, :left])
            left -= int(f.shape[1])
        self._pending = keep

    def append(self, hidden_states, rows: Sequence[int] | None, start_pos: int) -> None:
        """Queue the tapped features of ``rows`` of a target forward's hidden states, the first
        at absolute position ``start_pos`` (rows are consecutive committed positions)."""
        if start_pos != len(self):
            raise RuntimeError(f"the drafter's context holds {len(self)} positions; rows for "
                               f"position {start_pos} cannot follow")
        feats = tapped_features(hidden_states, self.layers, rows)
        if feats.shape[1] == 0:
            return
        if not self._pending:
            self._pending_start = start_pos
        self._pending.append(feats.to(device=self.device, dtype=self.dtype))

    def flush(self) -> None:
        """The queued rows' context K/V, in one drafter projection."""
        if not self._pending:
            return
        feats = torch.cat(self._pending, 1) if len(self._pending) > 1 else self._pending[0]
        start, self._pending = self._pending_start, []
        pos = torch.arange(start, start + feats.shape[1])
        with torch.inference_mode():
            new = self.project(feats, pos)
            self._ctx.append([t for kv in new for t in kv])

    def kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every drafter layer's (K, V) over the whole context (empty list: no context yet)."""
        self.flush()
        t = self._ctx.tensors
        return [(t[2 * i], t[2 * i + 1]) for i in range(len(t) // 2)]
