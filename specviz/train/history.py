"""AdaPLD's history store (docs/methods/adapld.md) built from cached target rollouts: the
n-gram counts of the target's own earlier replies and how they opened, for
:mod:`specviz.drafters.lookup.history_store` (``python -m specviz train store``)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..drafters.lookup.history_store import MIN_COUNT4, HistoryStore, build
from ..drafters.lookup.openings import build_openings
from .rollout_store import RolloutSet


def store_from_rollouts(folders: Sequence[str | Path], meta: dict | None = None,
                        min_count4: int = MIN_COUNT4, openings: bool = True) -> HistoryStore:
    """A store from the replies of cached greedy rollout folders, each preceded by the prompt's
    last two tokens (the chat template's end: what a reply starts with is counted too), and the
    index of how each reply opened (``openings``). Prefill-labelled texts and sampled rollouts
    are skipped: their text is not the target's greedy reply."""
    pairs = []
    for folder in folders:
        rs = RolloutSet(folder)
        if rs.temperature > 0:
            continue
        for i, row in enumerate(rs.rows):
            if row.get("kind") == "prefill":
                continue
            toks = rs.tokens(i).tolist()
            p = int(row["prompt_len"])
            pairs.append((toks[:p], toks[p:]))
    return build((prompt[-2:] + reply for prompt, reply in pairs),
                 dict(meta or {}, sources=[str(f) for f in folders]), min_count4,
                 build_openings(pairs) if openings else None)
