"""The target-feature context cache shared by hidden-state drafters (METHODS §1: DFlash, and
any later drafter conditioned on the target hidden states).

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
