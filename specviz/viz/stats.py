"""Statistics shown by the app, computed from a :class:`~specviz.trace.Trace` only.

tau and target forwards are defined once in specviz.metrics.
Everything here is a pure function of the trace, so an uploaded trace shows the same numbers
as the live run that produced it.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from ..trace import Trace


def trace_prefix(trace: Trace, n_rounds: int | None) -> Trace:
    """The trace as it was after its first ``n_rounds`` rounds (for scrubbing back in time)."""
    if n_rounds is None or n_rounds >= len(trace.rounds):
        return trace
    n = max(0, int(n_rounds))
    return replace(trace, rounds=list(trace.rounds[:n]))


def accepted_lengths(trace: Trace) -> list[int]:
    """Accepted draft tokens per round (0 .. draft depth)."""
    return [int(r.accepted) for r in trace.rounds]


@dataclass
class PositionStat:
    position: int   # 1-based draft position
    reached: int    # rounds whose draft had this position and accepted every position before it
    accepted: int   # ... of which the token at this position was accepted too

    @property
    def rate(self) -> float | None:
        return self.accepted / self.reached if self.reached else None


def position_acceptance(trace: Trace) -> list[PositionStat]:
    """Acceptance rate per draft position, conditional on reaching that position.

    Position k is *reached* in a round when the draft is at least k deep and positions
    1..k-1 were all accepted; it is *accepted* when the round accepted at least k tokens.
    Rounds without a draft contribute nothing.
    """
    depths = [r.draft_depth for r in trace.rounds]
    max_k = max(depths, default=0)
    out = []
    for k in range(1, max_k + 1):
        reached = sum(1 for r, d in zip(trace.rounds, depths) if d >= k and r.accepted >= k - 1)
        acc = sum(1 for r, d in zip(trace.rounds, depths) if d >= k and r.accepted >= k)
        out.append(PositionStat(position=k, reached=reached, accepted=acc))
    return out


@dataclass
class SpeedupEstimate:
    value: float | None
    step_time: float | None    # estimated time of one plain decoding step (s)
    round_time: float | None   # median time of one speculative round (s)
    basis: str                 # how step_time was obtained

    def explain(self) -> str:
        if self.value is None:
            return "No rounds yet."
        return ("An estimate, not a measurement: plain decoding (AR) was not run. Computed from "
                "this run alone as (new tokens per round) × (time of one plain decoding step, "
                f"{self.step_time * 1000:.0f} ms) ÷ (median round time, "
                f"{self.round_time * 1000:.0f} ms; waits for another tab's turn excluded). "
                f"The step time is {self.basis}. The Compare page runs AR and the method one "
                "after the other and times both (prefill and every round included): that "
                "measured speedup usually differs from this estimate.")


def speedup_estimate(trace: Trace) -> SpeedupEstimate:
    """Speedup over plain decoding, estimated from this trace alone.

    A plain decoding step costs about one target forward over one token. Rounds with an empty
    draft are exactly such steps, so their median time is the step time; without any, the
    median verify time is used (assuming verifying k tokens costs about as much as one token:
    the estimate is then close to tau). Medians keep one slow round (a busy CPU, the first
    call's warm-up) from dominating the estimate.
    """
    rounds = trace.rounds
    if not rounds:
        return SpeedupEstimate(None, None, None, "")
    times = [r.t_draft + r.t_verify - r.t_wait for r in rounds]  # compute, no queue wait
    round_time = statistics.median(times)
    if round_time <= 0:
        return SpeedupEstimate(None, None, None, "")
    plain = [t for r, t in zip(rounds, times) if not r.draft]
    model_step = float((trace.meta.get("cost_model") or {}).get("step_time") or 0.0)
    if plain:
        step = statistics.median(plain)
        basis = f"the median of this run's {len(plain)} round(s) without a draft"
    elif model_step > 0:
        step = model_step
        basis = ("the one-token forward time of the verify-cost model measured on this machine "
                 "(calibrated at start, refined by every round)")
    else:
        step = statistics.median(r.t_verify - r.t_wait for r in rounds)
        basis = ("the median verify time of this run's rounds (no round without a draft yet, "
                 "so this assumes verifying a draft costs about one plain step)")
    per_round = trace.new_tokens / len(rounds)
    return SpeedupEstimate(per_round * step / round_time, step, round_time, basis)


def live_metrics(trace: Trace) -> dict:
    """The headline numbers of a (partial) run."""
    est = speedup_estimate(trace)
    drafted = sum(len(r.draft) for r in trace.rounds)
    accepted = sum(r.accepted for r in trace.rounds)
    return {
        "rounds": trace.num_rounds,
        "target_forwards": trace.target_forwards,
        "new_tokens": trace.new_tokens,
        "tau": trace.tau,
        "tokens_per_s": trace.tokens_per_s,
        "decode_time": trace.decode_time,
        "wait_time": sum(r.t_wait for r in trace.rounds),
        "prefill_time": float(trace.meta.get("prefill_time") or 0.0),
        "speedup_est": est.value,
        "speedup_explain": est.explain(),
        "drafted": drafted,
        "accepted": accepted,
        "draft_acceptance": accepted / drafted if drafted else None,
    }
