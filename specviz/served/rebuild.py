"""A served run's verify steps as specviz rounds: counts from vLLM, tokens rebuilt where the
drafter is a pure function of the context (docs/served.md).

vLLM reports per request the ordered ``per_step_accepted`` / ``per_step_drafted`` counts of
every verify step that had a draft (steps without one are not listed) and the generated token
ids. The first generated token comes from the prompt's own forward (vLLM's prefill samples it),
so round 1 is a plain step; after that, each step either drafted (the next listed counts) or
not (a plain step committing one token).

* ngram: the drafted tokens are rebuilt with vLLM's proposer rule
  (:mod:`specviz.served.ngram_rule`). A step *agrees* when the rule proposes at least the
  reported number of tokens, the committed tokens start with the first ``accepted`` of them and
  the target's token after them is not the next drafted one -- the condition under which vLLM's
  verifier (greedy or sampling with a point-mass draft) accepts exactly that many. Where the
  rule drafts nothing the step is plain. The first step that does not agree ends the rebuild:
  it and every later step keep only vLLM's counts, and the result names it and says why.
* learned drafters (EAGLE, DFlash, ...): vLLM does not report the rejected tokens. Each
  listed step becomes a counts-only round: its draft holds the accepted tokens (which are the
  committed ones), ``extras.served.drafted`` the number drafted. Plain steps cannot be told
  apart from drafted ones here, so every step is assumed drafted, as vLLM drafts every step
  for these methods.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..trace import Round
from .ngram_rule import NgramConfig, propose


@dataclass
class StepCounts:
    """What vLLM reported of its verify steps with a draft, in order."""
    accepted: list[int]
    drafted: list[int]

    def __post_init__(self):
        if len(self.accepted) != len(self.drafted):
            raise ValueError("per_step_accepted and per_step_drafted differ in length")


@dataclass
class Rebuild:
    """Rounds of a served run plus how far the drafted tokens could be rebuilt."""
    rounds: list[Round] = field(default_factory=list)
    steps: int = 0                  # verify steps with a draft that vLLM reported
    agreed: int = 0                 # of them, rebuilt and in agreement with vLLM's counts
    failure: str | None = None      # the first step that could not be rebuilt, and why
    rebuilt: bool = True            # drafted tokens are known (ngram); False: counts only

    def summary(self) -> dict:
        return {"steps": self.steps, "agreed": self.agreed, "failure": self.failure,
                "rebuilt": self.rebuilt}


def _round(index: int, start: int, drafter: str, draft: list[int], accepted: int,
           committed: list[int], drafted: int | None, step: int | None, rebuilt: bool) -> Round:
    served = {"step": step, "drafted": drafted, "rebuilt": rebuilt} if drafted is not None \
        else {"step": None, "drafted": 0, "rebuilt": True}
    return Round(index=index, start=start, drafter=drafter, draft=list(draft),
                 accepted=int(accepted), committed=list(committed), extras={"served": served})


def _disagreement(proposal: list[int], drafted: int, accepted: int, rest: list[int]) -> str | None:
    """Why a rebuilt draft cannot be the one vLLM verified (None: it can)."""
    if len(proposal) < drafted:
        return f"the rule drafts {len(proposal)} tokens, vLLM drafted {drafted}"
    if accepted > drafted:
        return f"vLLM accepted {accepted} of {drafted} drafted tokens"
    draft = proposal[:drafted]
    if rest[:accepted] != draft[:accepted][:len(rest)]:
        return f"the committed tokens do not start with the rebuilt draft's first {accepted}"
    if accepted < drafted and len(rest) > accepted and rest[accepted] == draft[accepted]:
        return f"the rebuilt draft's token {accepted + 1} was committed, yet vLLM rejected it"
    return None


def rebuild_ngram(prompt_ids: Sequence[int], output_ids: Sequence[int], counts: StepCounts,
                  cfg: NgramConfig, drafter: str = "vllm-ngram") -> Rebuild:
    """Rounds of a served ngram run, drafted tokens rebuilt step by step (module docstring)."""
    out = [int(t) for t in output_ids]
    ctx = [int(t) for t in prompt_ids]
    res = Rebuild(steps=len(counts.accepted))
    if not out:
        return res
    res.rounds.append(_round(0, len(ctx), drafter, [], 0, out[:1], None, None, True))
    ctx.append(out[0])
    pos, j = 1, 0
    while pos < len(out):
        proposal = propose(ctx, cfg) if res.failure is None else None
        if proposal == [] and res.failure is None:        # the rule drafts nothing: plain step
            committed = out[pos:pos + 1]
            res.rounds.append(_round(len(res.rounds), len(ctx), drafter, [], 0, committed,
                                     None, None, True))
        elif j >= len(counts.accepted):
            if res.failure is None:
                res.failure = (f"round {len(res.rounds) + 1}: the rule drafts here but vLLM "
                               f"reports no more steps with a draft")
            committed = out[pos:pos + 1]
            res.rounds.append(_round(len(res.rounds), len(ctx), drafter, [], 0, committed,
                                     None, None, True))
        else:
            drafted, accepted = int(counts.drafted[j]), int(counts.accepted[j])
            rest = out[pos:]
            why = _disagreement(proposal, drafted, accepted, rest) if res.failure is None \
                else "after an earlier step that could not be rebuilt"
            committed = rest[:accepted + 1]
            if why is None:
                res.agreed += 1
                draft, rebuilt = proposal[:drafted], True
            else:
                if res.failure is None:
                    res.failure = f"round {len(res.rounds) + 1} (vLLM step {j + 1}): {why}"
                draft, rebuilt = committed[:accepted], False
            res.rounds.append(_round(len(res.rounds), len(ctx), drafter, draft,
                                     min(accepted, len(committed)), committed, drafted, j + 1,
                                     rebuilt))
            j += 1
        ctx += committed
        pos += len(committed)
    if res.failure is None and j < len(counts.accepted):
        res.failure = (f"vLLM reports {len(counts.accepted)} steps with a draft, the rebuild "
                       f"used {j}")
    return res


def counts_only(prompt_len: int, output_ids: Sequence[int], counts: StepCounts,
                drafter: str) -> Rebuild:
    """Rounds of a served run whose drafter's tokens are not reported (EAGLE, DFlash, ...)."""
    out = [int(t) for t in output_ids]
    res = Rebuild(steps=len(counts.accepted), rebuilt=False,
                  failure="the drafted tokens of a learned drafter are not reported; "
                          "rounds hold counts and the accepted tokens only")
    if not out:
        return res
    res.rounds.append(_round(0, prompt_len, drafter, [], 0, out[:1], None, None, True))
    pos, j = 1, 0
    while pos < len(out):
        if j < len(counts.accepted):
            drafted, accepted = int(counts.drafted[j]), int(counts.accepted[j])
            committed = out[pos:pos + accepted + 1]
            res.rounds.append(_round(len(res.rounds), prompt_len + pos, drafter,
                                     committed[:accepted], min(accepted, len(committed)),
                                     committed, drafted, j + 1, False))
            j += 1
        else:
            committed = out[pos:pos + 1]
            res.rounds.append(_round(len(res.rounds), prompt_len + pos, drafter, [], 0,
                                     committed, None, None, True))
        pos += len(committed)
    return res
