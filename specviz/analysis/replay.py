"""Offline replay: a drafter against a fixed target reply (docs/methods/edr.md).

Under greedy verification a round's outcome depends only on the draft and on the target's
greedy reply y to the committed prefix, so a cached rollout (prompt + y, plus the
target's tapped hidden states at every position for hidden-state drafters) replaces the target:
the accepted path is the longest branch that agrees with y, the target's token is the next y,
and the features the verify pass would have handed the drafter are the rollout's rows. No target
forward runs. The result is an ordinary :class:`~specviz.trace.Trace`, equal round for round to
a real greedy Session with ``max_new_tokens = len(y)`` (tested), so every view, metric and
analysis (alignment, EDR) reads replays and live runs alike.

Rows of a replayed round that the target never judged on a correct prefix are unknown:
``target_argmax`` holds -1 there and ``p_draft`` is empty (replay has no probabilities).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch

from ..drafters.base import Draft, DraftContext, Drafter, VerifyFeedback, clip_draft
from ..errors import SpecvizError
from ..numerics import first_branch_only
from ..trace import Round, Trace
from ..tree import TokenTree
from ..verify import Verdict

UNKNOWN = -1


@dataclass
class Rollout:
    """A fixed target reply: ``tokens`` = prompt + the target's greedy reply;
    ``features`` [T, k*H] the target's tapped hidden states at every position (HF
    ``hidden_states`` indices ``layers``), needed only by hidden-state drafters."""

    tokens: list[int]
    prompt_len: int
    features: torch.Tensor | None = None
    layers: list[int] | None = None

    def hidden_states(self, start: int, end: int) -> tuple:
        """An HF-style ``hidden_states`` tuple [1, end-start, H] per tapped layer for positions
        start..end-1 (None at untapped indices) -- what a verify pass would hand a drafter."""
        if self.features is None or not self.layers:
            raise SpecvizError("this drafter needs the target's hidden states, but the rollout "
                               "stores none (make rollouts with tapped layers)")
        H = self.features.shape[-1] // len(self.layers)
        rows = self.features[start:end].unsqueeze(0)
        out: list = [None] * (max(self.layers) + 1)
        for j, layer in enumerate(self.layers):
            out[layer] = rows[..., j * H:(j + 1) * H]
        return tuple(out)


def greedy_against(tree: TokenTree, reply: Sequence[int]) -> Verdict:
    """Greedy verification against a known reply (y[n], y[n+1], ...): follow the child
    that equals the next token while one does."""
    children = tree.children_map()
    path: list[int] = []
    cur = -1
    while len(path) < len(reply) - 1:
        want = int(reply[len(path)])
        nxt = next((c for c in children.get(cur, []) if tree.tokens[c] == want), None)
        if nxt is None:
            break
        path.append(nxt)
        cur = nxt
    return Verdict(path, int(reply[len(path)]))


def _check_layers(drafter: Drafter, rollout: Rollout) -> None:
    need = drafter.hidden_state_layers
    if need is not None and list(rollout.layers or []) != list(need):
        raise SpecvizError(f"the drafter needs target hidden states {list(need)} (HF indices) but "
                           f"the rollout stores {list(rollout.layers or [])}")


def _known_argmax(tree: TokenTree, verdict: Verdict, y: Sequence[int], n: int) -> list[int]:
    """target_argmax per verify row: y on the rows of the accepted path, UNKNOWN elsewhere."""
    rows = verdict.rows
    out = [UNKNOWN] * (max(rows) + 1)
    for depth, row in enumerate(rows):
        out[row] = int(y[n + depth])
    return out


def _round(index: int, n: int, name: str, draft: Draft, tree: TokenTree, verdict: Verdict,
           y: Sequence[int], eos: set[int], t_draft: float) -> Round:
    committed = [int(tree.tokens[i]) for i in verdict.path] + [verdict.token]
    eos_at = next((j for j, t in enumerate(committed) if t in eos), None)
    committed = committed if eos_at is None else committed[:eos_at + 1]
    chain = tree.is_chain
    n_acc = min(len(verdict.path), len(committed))  # an accepted EOS ends the round early
    return Round(index=index, start=n, drafter=name, draft=list(tree.tokens),
                 accepted=n_acc, committed=committed,
                 target_argmax=_known_argmax(tree, verdict, y, n),
                 q_draft=list(draft.q_token) if draft.q_token is not None
                 else [None] * len(tree),
                 parents=None if chain else list(tree.parents),
                 accepted_path=[] if chain else verdict.path[:n_acc],
                 t_draft=t_draft, t_verify=0.0, extras=dict(draft.extras))


def replay(drafter: Drafter, rollout: Rollout, target=None, method: str | None = None,
           eos_token_ids: set[int] | None = None, token_texts: bool = True,
           min_width: int | None = None) -> Trace:
    """Run ``drafter`` along ``rollout`` with greedy verification and no target forward.
    ``target`` is passed to the drafter's ``begin`` (drafters that read its embeddings or LM
    head); ``token_texts=False`` skips decoding token texts (training-time evaluation).
    ``min_width`` (default: the target's; 1 without one): under width-invariant numerics
    (> 1) a tree round keeps only what its first branch would commit, as the engine does
    (:func:`specviz.numerics.first_branch_only`)."""
    y, P = [int(t) for t in rollout.tokens], int(rollout.prompt_len)
    if not 0 < P <= len(y):
        raise SpecvizError(f"rollout prompt_len {P} is out of range for {len(y)} tokens")
    _check_layers(drafter, rollout)
    hidden = drafter.hidden_state_layers is not None
    eos = set(eos_token_ids if eos_token_ids is not None
              else (target.eos_token_ids if target is not None else ()))
    width = int(min_width if min_width is not None else getattr(target, "min_width", 1) or 1)
    drafter.begin(target, y[:P], rollout.hidden_states(0, P - 1) if hidden and P > 1 else None)
    rounds: list[Round] = []
    n = P
    while n < len(y):
        t0 = time.perf_counter()
        draft = clip_draft(drafter.propose(DraftContext(y[:n], P, len(y) - n - 1, len(rounds))),
                           len(y) - n - 1)
        t_draft = time.perf_counter() - t0
        tree = draft.tree
        verdict = greedy_against(tree, y[n:])
        if width > 1 and not tree.is_chain:
            verdict = first_branch_only(tree, verdict)
        rnd = _round(len(rounds), n, drafter.name, draft, tree, verdict, y, eos, t_draft)
        rounds.append(rnd)
        # the features handed back are the committed positions' rows only (a tree's accepted
        # path, in order), so the kept rows are all of them
        drafter.observe(VerifyFeedback(
            round=rnd, logits=None, kept_rows=list(range(len(verdict.rows))),
            hidden_states=rollout.hidden_states(n - 1, n + len(rnd.committed) - 1)
            if hidden else None))
        n += len(rnd.committed)
        if rnd.committed[-1] in eos:
            break
    return _trace(drafter, rollout, rounds, method, target if token_texts else None)


def _trace(drafter: Drafter, rollout: Rollout, rounds: list[Round], method, target) -> Trace:
    y = [int(t) for t in rollout.tokens]
    P = int(rollout.prompt_len)
    texts = {}
    if target is not None:
        ids = set(y) | {t for r in rounds for t in r.draft}
        texts = {i: target.tokenizer.decode([i], skip_special_tokens=False) for i in sorted(ids)}
    meta = {"model": getattr(target, "name", None) if target else None, "method": method or drafter.name,
            "drafter": drafter.name, "drafter_config": drafter.config(),
            "settings": {"max_new_tokens": len(y) - P, "temperature": 0.0},
            "prompt_len": P, "vocab_size": getattr(target, "vocab_size", None) if target else None,
            "replay": True, "stop_reason": "rollout_end"}
    return Trace(meta=meta, prompt_ids=y[:P], rounds=rounds, token_texts=texts)
