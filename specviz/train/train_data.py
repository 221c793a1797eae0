"""A DFlash training set: a rollouts folder's train split plus prefill-labelled text folders.

Rollouts (:mod:`.rollouts`) are the target's own greedy replies; prefill-labelled folders
(:mod:`.prefill` item 1) are any text with the target's greedy next token stored at
every position, trained on their exact-prefix labels; both may carry the target's top-k soft
labels (:mod:`.soft_labels`). All of them must come from the same target and tapped layers.
:func:`reply_vocab` is every word a training label can be: the drafter's draft vocabulary.
"""
from __future__ import annotations

import torch

from ..errors import SpecvizError
from .rollout_store import RolloutSet


def reply_vocab(rollouts) -> torch.Tensor:
    """Sorted ids of every possible CE label of ``rollouts``: the reply tokens of a greedy
    rollout, the greedy next tokens of a prefill-labelled text's reply positions."""
    seen = set()
    for i in range(len(rollouts)):
        t, _, p = rollouts.load(i)
        g = rollouts.greedy(i)
        seen.update((t[p:] if g is None else g[max(0, p - 1):]).tolist())
    return torch.tensor(sorted(seen), dtype=torch.long)


class TrainData:
    """The train split of a rollouts folder plus any prefill-labelled folders, as one list."""

    def __init__(self, rollouts_dir, extra: list | tuple = ()):
        self.sets = [RolloutSet(rollouts_dir, split="train")]
        meta = self.sets[0].meta
        for d in extra:
            rs = RolloutSet(d)
            for k in ("target_layer_ids", "hidden_size", "num_target_layers"):
                if rs.meta.get(k) != meta.get(k):
                    raise SpecvizError(f"{d} was made with {k}={rs.meta.get(k)}, the rollouts "
                                       f"with {meta.get(k)}: use data from the same target/layers")
            self.sets.append(rs)
        self.index = [(s, i) for s in self.sets for i in range(len(s))]

    def __len__(self) -> int:
        return len(self.index)

    def load(self, j: int):
        s, i = self.index[j]
        return s.load(i)

    def greedy(self, j: int):
        s, i = self.index[j]
        return s.greedy(i)

    def soft(self, j: int):
        """The target's top-k soft labels of sequence ``j`` (:mod:`.soft_labels`), or None."""
        from .soft_labels import read_soft

        s, i = self.index[j]
        return read_soft(s, i)

    def check_soft(self) -> None:
        """Every folder has soft labels (else one clear error naming the command)."""
        from .soft_labels import META_NAME

        for s in self.sets:
            if len(s) and not (s.folder / META_NAME).is_file():
                raise SpecvizError(f"{s.folder} has no soft labels: run `python -m specviz train "
                                   f"soft-labels --rollouts {s.folder}` (or --soft-weight 0)")
