"""One served run as a specviz Trace (docs/served.md): ask the endpoint, rebuild the rounds,
record what was measured where.

:func:`check_endpoint` runs the checks a user needs before trusting a served trace: the
server is reachable and OpenAI-compatible, its tokenizer is the one specviz loads (the prompt
is sent as token ids, so a different vocabulary would be read as other text), and, when it
speculates, it reports per-request counts (``--per-request-spec-decode-metrics detailed``).
:func:`served_trace` sends one prompt and returns the Trace: rounds from
:mod:`specviz.served.rebuild`, ``meta.served`` with the endpoint, the speculative settings, the
rebuild's agreement and the server's own counters. vLLM times no single step: each round's
``t_verify`` is the request's wall time (client side, prefill included) spread evenly, so the
trace's tokens/s is the request's and per-round times are not measurements.
"""
from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass

from .. import __version__
from ..errors import PromptError
from ..trace import Trace
from .client import (Completion, EndpointError, ServerInfo, complete, normalise,
                     server_info, server_tokens)
from .ngram_rule import NgramConfig
from .rebuild import Rebuild, StepCounts, counts_only, rebuild_ngram

TOKENIZER_PROBE = "Speculative decoding: 12 tokens/s, naïve café — ok?\n  def f(x): return x**2"
SPEC_METHODS = ("ngram", "eagle", "eagle3", "dflash", "mtp", "draft_model", "suffix")
_STOP = {"length": "max_new_tokens", "stop": "eos"}


@dataclass
class Endpoint:
    """A checked endpoint: the server, whether it speculates, its per-step reporting."""
    info: ServerInfo
    speculative: bool


def speculates(url: str) -> bool:
    """Whether the server speculates: vLLM's Prometheus counters list spec-decode drafts."""
    import urllib.request

    try:
        with urllib.request.urlopen(normalise(url) + "/metrics", timeout=10) as r:
            text = r.read().decode("utf-8", "replace")
    except OSError:
        return False
    return bool(re.search(r"^vllm:spec_decode_num_drafts", text, re.M))


def check_endpoint(url: str, tokenizer, timeout: float = 10.0) -> Endpoint:
    """The endpoint's server, checked (module docstring); one EndpointError sentence otherwise."""
    info = server_info(url, timeout=timeout)
    mine = [int(t) for t in tokenizer(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]]
    theirs = server_tokens(info.url, info.model, TOKENIZER_PROBE)
    if mine != theirs:
        raise EndpointError(f"the server's model {info.model!r} tokenizes text differently from "
                            "the model specviz loaded; load the served model in specviz "
                            "(--model with its HF id or folder) so the ids mean the same text")
    return Endpoint(info, speculates(info.url))


def spec_counts(c: Completion, ep: Endpoint) -> StepCounts | None:
    if c.spec is None:
        if ep.speculative:
            raise EndpointError(f"the server at {ep.info.url} speculates but reports no "
                                "per-request counts; start it with "
                                "--per-request-spec-decode-metrics detailed")
        return None
    acc, dr = c.spec.get("per_step_accepted"), c.spec.get("per_step_drafted")
    if acc is None or dr is None:
        raise EndpointError(f"the server at {ep.info.url} reports only summary counts; start it "
                            "with --per-request-spec-decode-metrics detailed")
    return StepCounts([int(x) for x in acc], [int(x) for x in dr])


def rebuild(c: Completion, counts: StepCounts | None, spec_method: str,
            cfg: NgramConfig) -> Rebuild:
    """The rounds of a completion (plain steps when the server did not speculate)."""
    if counts is None:
        return counts_only(len(c.prompt_ids), c.output_ids, StepCounts([], []), "vllm-ar")
    if spec_method == "ngram":
        return rebuild_ngram(c.prompt_ids, c.output_ids, counts, cfg)
    return counts_only(len(c.prompt_ids), c.output_ids, counts, f"vllm-{spec_method}")


def served_trace(target, ep: Endpoint, prompt: str | list[int], settings,
                 spec_method: str = "ngram", ngram: NgramConfig | None = None) -> Trace:
    """Send one prompt (chat-templated by ``target`` as local runs are) and return its Trace."""
    if spec_method not in SPEC_METHODS:
        raise EndpointError(f"unknown speculative method {spec_method!r}; one of "
                            + ", ".join(SPEC_METHODS))
    if isinstance(prompt, str) and not prompt.strip():
        raise PromptError("the prompt is empty")
    prompt_ids = target.encode_prompt(prompt, settings.chat_template) \
        if isinstance(prompt, str) else [int(t) for t in prompt]
    limit = ep.info.max_model_len
    if not prompt_ids or (limit and len(prompt_ids) >= limit):
        raise PromptError("the prompt is empty" if not prompt_ids else
                          f"the prompt has {len(prompt_ids):,} tokens but the server's context "
                          f"is {limit:,} tokens")
    cfg = ngram or NgramConfig(max_model_len=ep.info.max_model_len or 8192)
    c = complete(ep.info.url, ep.info.model, prompt_ids, settings.max_new_tokens,
                 settings.temperature, settings.top_p, settings.seed)
    return completion_trace(target, ep, c, prompt if isinstance(prompt, str) else None,
                            settings, spec_method, cfg)


def completion_trace(target, ep: Endpoint, c: Completion, prompt_text: str | None, settings,
                     spec_method: str, cfg: NgramConfig) -> Trace:
    """The Trace of an answered completion (rounds rebuilt, meta.served filled)."""
    counts = spec_counts(c, ep)
    rb = rebuild(c, counts, spec_method, cfg)
    per_round = c.wall_s / max(1, len(rb.rounds))
    for r in rb.rounds:
        r.t_verify = per_round
    tok = target.tokenizer
    ids = set(c.prompt_ids) | set(c.output_ids) | {t for r in rb.rounds for t in r.draft}
    method = "vllm-ar" if counts is None else f"vllm-{spec_method}"
    spec = None
    if counts is not None:
        spec = {"method": spec_method,
                "num_speculative_tokens": (c.spec or {}).get("num_spec_tokens")}
        if spec_method == "ngram":
            spec.update(prompt_lookup_min=cfg.prompt_lookup_min,
                        prompt_lookup_max=cfg.prompt_lookup_max)
    meta = {
        "specviz_version": __version__, "model": target.name, "method": method,
        "drafter": method, "settings": asdict(settings), "prompt": prompt_text,
        "prompt_len": len(c.prompt_ids), "vocab_size": target.vocab_size,
        "stop_reason": _STOP.get(c.finish_reason or "", c.finish_reason),
        "eos_token_ids": sorted(target.eos_token_ids),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "served": {"endpoint": ep.info.url, "engine": "vllm", "served_model": ep.info.model,
                   "speculative": spec, "rebuild": rb.summary(), "wall_s": round(c.wall_s, 4),
                   "timing": "request wall time (client side, prefill included) spread evenly "
                             "over the rounds; vLLM does not time single steps",
                   "server_counts": {k: v for k, v in (c.spec or {}).items()
                                     if not k.startswith("per_step")} or None},
    }
    return Trace(meta=meta, prompt_ids=list(c.prompt_ids), rounds=rb.rounds,
                 token_texts={i: tok.decode([i], skip_special_tokens=False) for i in sorted(ids)})


def agreement(trace: Trace) -> tuple[bool | None, str]:
    """(all steps rebuilt in agreement? None: nothing to rebuild, one line) of a served trace."""
    served = trace.meta.get("served") or {}
    rb = served.get("rebuild") or {}
    if not served.get("speculative"):
        return None, "served without speculation: every round is a plain step"
    if not rb.get("rebuilt", True) and rb.get("agreed", 0) == 0:
        return None, f"counts only: {rb.get('failure')}"
    line = (f"rebuilt drafts agree with vLLM on {rb.get('agreed')} of {rb.get('steps')} draft "
            "steps")
    ok = not rb.get("failure")
    return ok, line + (f"; {rb['failure']}" if not ok else "")


def served_row(name: str, trace: Trace) -> dict:
    """One row of a table of served runs (the Served-run page, per prompt)."""
    rb = (trace.meta.get("served") or {}).get("rebuild") or {}
    return {"prompt": name, "new_tokens": trace.new_tokens, "rounds": trace.num_rounds,
            "tau": round(trace.tau, 3), "tokens_per_s": round(trace.tokens_per_s, 2),
            "draft_steps": rb.get("steps", 0), "agreed": rb.get("agreed", 0),
            "stop": trace.meta.get("stop_reason")}
