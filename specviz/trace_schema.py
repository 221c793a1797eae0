"""The trace file's declared schema: what a saved run may hold (docs/traces.md).

A trace file is what users pass around (teaching material, bug reports), so every reader -- the
app's upload, ``specviz show``, the bench and eval loaders -- checks it once, through
:func:`specviz.trace_checks.validate_trace_dict` (called by
:meth:`specviz.trace.Trace.from_dict`). This module is the declared part:

1. the pydantic models below declare every field a view reads, with its type, range and size
   (token ids, non-negative counts and times, finite probabilities in [0, 1], settings in the
   ranges :class:`specviz.engine.DecodeSettings` accepts); unknown keys are kept; a model's
   error becomes one sentence (:func:`first_error`);
2. :func:`scan_values` walks the parsed JSON for what the models leave open (unknown keys):
   nesting depth, and finite numbers everywhere (NaN or infinity cannot be written back by
   the Download button).

What no single field says (rounds in order, trees, committed tokens, ids within the vocabulary)
is checked by :mod:`specviz.trace_checks`. Every failure is one
:class:`~specviz.errors.TraceError` sentence that names the field and the round in the app's
words: rounds count from 1, as on the pages ("round 3: 'draft' must be a list of token ids;
item 2 is 'hello'").
"""
from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import TraceError

SCHEMA_VERSION = 1
MAX_DEPTH = 64            # a trace nests ~6 deep; extras a few more
MAX_ID = 2 ** 31          # a token id beyond any vocabulary (when the trace names none)
MAX_SECONDS = 86_400.0    # one round, one prefill: a day at most
MAX_NODES = 4_096         # draft nodes of one round
MAX_ROUNDS = 1_000_000
MAX_TOKENS = 1_000_000    # prompt tokens, token texts
MAX_TEXT = 10_000         # characters of one token's text
MAX_TEMPERATURE = 10.0

Id = Annotated[int, Field(ge=0, lt=MAX_ID)]
Count = Annotated[int, Field(ge=0, lt=MAX_ID)]
Node = Annotated[int, Field(ge=-1, lt=MAX_NODES)]
Seconds = Annotated[float, Field(ge=0.0, le=MAX_SECONDS, allow_inf_nan=False)]
Prob = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Number = Annotated[float, Field(allow_inf_nan=False)]
Span = Annotated[list[Count], Field(min_length=2, max_length=2)]
Ids = Annotated[list[Id], Field(max_length=MAX_NODES + 1)]
Rows = Annotated[list[Annotated[list[Id], Field(max_length=MAX_NODES)]],
                 Field(max_length=MAX_NODES + 1)]
ProbRows = Annotated[list[Annotated[list[Prob], Field(max_length=MAX_NODES)]],
                     Field(max_length=MAX_NODES + 1)]


class _Record(BaseModel):
    """Strict JSON types (no "5" for 5, no true for 1); unknown keys kept as they are."""
    model_config = ConfigDict(strict=True, extra="allow")


# ---------------------------------------------------------------- the drafters' round extras
class Match(_Record):
    """One lookup candidate (PLD's ``match``, AdaPLD's ``matches``)."""
    kind: str | None = None
    span: Span | None = None
    copy_from: Span | None = None
    score: Number | None = None
    ngram: Count | None = None
    similarity: Number | None = None
    votes: Count | None = None
    tokens: Ids | None = None
    branch: Count | None = None


class Cut(_Record):
    """A block drafter's cut and forward gate (DFlash)."""
    kept: Count = 0
    block: Count | None = None
    paused: bool | None = None
    probe: bool | None = None
    tree: bool | None = None
    block_confidence: list[Prob] | None = None
    value: list[Number] | None = None
    rate: Number | None = None


class StateProbe(_Record):
    skip: bool | None = None


class Hybrid(_Record):
    block_nodes: Count | None = None
    lookup_nodes: Count | None = None
    source: list[str] | None = None


class RetraceInfo(_Record):
    """ReTrace's fusion in a round: the slots that received a memory and their gates."""
    slots: list[Count] = []
    gate: list[Number] = []
    residual: list[Number] = []
    gate_off: bool | None = None


class Served(_Record):
    """A served run's verify step (:mod:`specviz.served.rebuild`): vLLM's step number, how many
    tokens it drafted, whether the drafted tokens are rebuilt (else: counts only)."""
    step: Count | None = None
    drafted: Annotated[int, Field(ge=0, le=MAX_NODES)] = 0
    rebuilt: bool = True


class Selector(_Record):
    """DFlash2's candidate selector in a round: each slot's top-K candidates, their unary
    logits and the index the walk chose (:mod:`specviz.drafters.dflash.dflash2`)."""
    candidates: Rows = []
    unary: list[list[Number]] = []
    path: list[Count] = []


class Domino(_Record):
    """Domino's correction head in a round: the backbone's own word per slot and whether the
    correction changed it (:mod:`specviz.drafters.dflash.domino`)."""
    backbone: Ids = []
    corrected: list[Annotated[int, Field(ge=0, le=1)]] = []


class Extras(_Record):
    """What a drafter recorded of its round; every key a view reads, declared."""
    match: Match | None = None
    matches: list[Match] | None = None
    retrieval: str | None = None
    source: str | None = None
    suffix: Span | None = None
    streak: Count | None = None
    edits: list[list[list[Id]]] | None = None
    branches: Count | None = None
    probe: bool | None = None
    alpha: list[Number] | Number | None = None
    fallback_reason: str | None = None
    opening: Count | None = None
    hybrid: Hybrid | None = None
    confidence: list[Prob] | None = None
    cut: Cut | None = None
    state_probe: StateProbe | None = None
    topk: Rows | None = None
    topk_p: ProbRows | None = None
    tree_slots: list[Count] | None = None
    tree_ranks: list[Count] | None = None
    retrace: RetraceInfo | None = None
    served: Served | None = None
    selector: Selector | None = None
    domino: Domino | None = None


class RoundRecord(_Record):
    """One speculative round (:class:`specviz.trace.Round`)."""
    index: Count
    start: Count
    drafter: str
    draft: Ids
    accepted: Count
    committed: Ids
    target_argmax: Ids = []
    target_argmax_prob: Annotated[list[Prob], Field(max_length=MAX_NODES + 1)] = []
    target_topk: Rows = []
    target_topk_prob: ProbRows = []
    p_draft: Annotated[list[Prob], Field(max_length=MAX_NODES)] = []
    q_draft: Annotated[list[Prob | None], Field(max_length=MAX_NODES)] = []
    parents: Annotated[list[Node], Field(max_length=MAX_NODES)] | None = None
    accepted_path: Annotated[list[Count], Field(max_length=MAX_NODES)] = []
    t_draft: Seconds = 0.0
    t_verify: Seconds = 0.0
    t_forward: Seconds = 0.0
    t_wait: Seconds = 0.0
    extras: Extras = Extras()


# ---------------------------------------------------------------- the run's metadata
class Settings(_Record):
    """The decoding settings of the run (:class:`specviz.engine.DecodeSettings`)."""
    max_new_tokens: Count | None = None
    temperature: Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False)] = 0.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] = 1.0
    seed: Count | None = None
    chat_template: bool | None = None


class CostCurve(_Record):
    """The verify-cost curve measured at load (:meth:`specviz.costs.CostModel.to_dict`)."""
    kind: str | None = None
    step_time: Seconds = 0.0
    points: list[Annotated[list[Number], Field(min_length=2, max_length=2)]] | None = None
    raw: list[Annotated[list[Number], Field(min_length=2, max_length=3)]] | None = None


class ServedMeta(_Record):
    """Where a served run came from and how far its rounds could be rebuilt."""
    endpoint: str | None = None
    engine: str | None = None
    served_model: str | None = None
    speculative: dict[str, Any] | None = None
    rebuild: dict[str, Any] | None = None
    wall_s: Seconds | None = None


class Meta(_Record):
    model: str | None = None
    method: str | None = None
    drafter: str | None = None
    settings: Settings | None = None
    prompt: str | None = None
    prompt_len: Count | None = None
    min_width: Annotated[int, Field(ge=1, le=MAX_NODES)] | None = None
    numerics: str | None = None
    kernels: str | None = None
    prefill_time: Seconds | None = None
    stop_reason: str | None = None
    eos_token_ids: list[Id] = []
    cost_model: CostCurve | None = None
    created: str | None = None
    vocab_size: Annotated[int, Field(ge=1, le=MAX_ID)] | None = None
    served: ServedMeta | None = None


class TraceRecord(_Record):
    schema_version: int
    meta: Meta | None = None
    prompt_ids: Annotated[list[Id], Field(max_length=MAX_TOKENS)] = []
    rounds: Annotated[list[RoundRecord], Field(max_length=MAX_ROUNDS)]
    token_texts: Annotated[dict[str, Annotated[str, Field(max_length=MAX_TEXT)]],
                           Field(max_length=MAX_TOKENS)] | None = None


# ---------------------------------------------------------------- 1. depth and finite numbers
def scan_values(d: Any) -> None:
    """Every value of the parsed JSON: nesting at most :data:`MAX_DEPTH`, every number finite.
    Iterative (a deeply nested file cannot exhaust Python's stack here)."""
    stack: list[tuple[Any, tuple, int]] = [(d, (), 0)]
    while stack:
        v, loc, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise TraceError(f"{_where(loc[:4])} nests more than {MAX_DEPTH} levels deep; "
                             "a trace nests a few levels")
        if isinstance(v, float) and not math.isfinite(v):
            raise TraceError(f"{_where(loc)} is {v}; a trace holds finite numbers only")
        if isinstance(v, dict):
            stack.extend((x, loc + (k,), depth + 1) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, loc + (i,), depth + 1) for i, x in enumerate(v))


# ---------------------------------------------------------------- 2. the declared schema
#: what a field must be, in words (the last named field of the error's location)
FIELD_WORDS = {
    "rounds": "must be a list of rounds",
    "prompt_ids": "must be a list of token ids",
    "draft": "must be a list of token ids",
    "committed": "must be a list of token ids",
    "target_argmax": "must be a list of token ids",
    "eos_token_ids": "must be a list of token ids",
    "tokens": "must be a list of token ids",
    "target_topk": "must be a list of rows of token ids",
    "topk": "must be a list of rows of token ids",
    "target_topk_prob": "must be a list of rows of probabilities (0 to 1)",
    "topk_p": "must be a list of rows of probabilities (0 to 1)",
    "target_argmax_prob": "must be a list of probabilities (0 to 1)",
    "p_draft": "must be a list of probabilities (0 to 1)",
    "q_draft": "must be a list of probabilities (0 to 1) or nulls",
    "confidence": "must be a list of probabilities (0 to 1)",
    "block_confidence": "must be a list of probabilities (0 to 1)",
    "parents": f"must be null or a list of parent nodes (-1 for the root, below {MAX_NODES})",
    "accepted_path": "must be a list of node indices",
    "index": "must be a whole number of 0 or more",
    "start": "must be a whole number of 0 or more (a position)",
    "accepted": "must be a whole number of 0 or more",
    "t_draft": f"must be a number of seconds from 0 to {MAX_SECONDS:.0f}",
    "t_verify": f"must be a number of seconds from 0 to {MAX_SECONDS:.0f}",
    "t_forward": f"must be a number of seconds from 0 to {MAX_SECONDS:.0f}",
    "t_wait": f"must be a number of seconds from 0 to {MAX_SECONDS:.0f}",
    "prefill_time": f"must be a number of seconds from 0 to {MAX_SECONDS:.0f}",
    "step_time": f"must be a number of seconds from 0 to {MAX_SECONDS:.0f}",
    "temperature": f"must be a number from 0 (greedy) to {MAX_TEMPERATURE:.0f}",
    "top_p": "must be a number above 0 and at most 1",
    "max_new_tokens": "must be a whole number of 0 or more",
    "seed": "must be a whole number of 0 or more",
    "matches": "must be a list of match objects",
    "span": "must be a pair of positions [start, end]",
    "copy_from": "must be a pair of positions [start, end]",
    "suffix": "must be a pair of positions [start, end]",
    "token_texts": "must be an object from token id to text",
    "schema_version": "must be a whole number",
    "vocab_size": "must be a whole number of 1 or more",
    "min_width": f"must be a whole number from 1 to {MAX_NODES}",
}
#: pydantic's error types, in words (when the field has no entry above)
TYPE_WORDS = {
    "missing": "is missing", "int_type": "must be a whole number",
    "float_type": "must be a number", "finite_number": "must be a finite number",
    "string_type": "must be text", "bool_type": "must be true or false",
    "list_type": "must be a list", "dict_type": "must be an object",
    "model_type": "must be an object", "model_attributes_type": "must be an object",
}


def _where(loc: tuple) -> str:
    """A location in words: ``round 3: 'draft'``, ``meta: 'settings.temperature'``."""
    loc = tuple(loc)
    head = ""
    if len(loc) >= 2 and loc[0] == "rounds" and isinstance(loc[1], int):
        head, loc = f"round {loc[1] + 1}", loc[2:]
    elif len(loc) >= 2 and loc[0] == "meta":
        head, loc = "meta", loc[1:]
    names = [str(x) for x in loc if not isinstance(x, int)]
    if not names:
        return head or "the trace"
    return f"{head + ': ' if head else ''}'{'.'.join(names)}'"


def shown(v: Any) -> str:
    """A value as a sentence quotes it (cut to 40 characters)."""
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _sentence(err: dict) -> str:
    loc = tuple(x for x in err.get("loc", ()) if x not in ("function-after", "list[...]"))
    named = [x for x in loc if not isinstance(x, int)]
    field = str(named[-1]) if named else ""
    kind = err.get("type", "")
    if kind == "missing":
        return f"{_where(loc)} is missing"
    if len(loc) == 2 and loc[0] == "token_texts":
        return (f"'token_texts': the text of token {shown(loc[1])} must be text, got "
                f"{shown(err.get('input'))}")
    if len(loc) == 2 and loc[0] == "rounds" and isinstance(loc[1], int):
        return (f"round {loc[1] + 1} must be an object of round fields, got "
                f"{shown(err.get('input'))}")
    item = ""
    # the offending item of a list: 'draft' item 2 is 'hello'
    if loc and isinstance(loc[-1], int) and named:
        cut = max(i for i, x in enumerate(loc) if not isinstance(x, int))
        loc, item = loc[:cut + 1], f"; item {loc[-1] + 1} is {shown(err.get('input'))}"
    words = FIELD_WORDS.get(field) or _type_words(kind, err.get("ctx") or {}, bool(item))
    if kind in ("too_long", "too_short"):
        ctx = err.get("ctx") or {}
        bound = (f"at most {ctx.get('max_length')}" if kind == "too_long"
                 else f"at least {ctx.get('min_length')}")
        return f"{_where(loc)} must have {bound} items, got {shown(err.get('input'))}"
    got = item or f", got {shown(err.get('input'))}"
    return f"{_where(loc)} {words}{got}"


#: the kinds of value a list item must be, for a field without its own words
ITEM_WORDS = {"int_type": "whole numbers", "float_type": "numbers", "string_type": "texts",
              "bool_type": "true or false values", "dict_type": "objects", "model_type": "objects",
              "list_type": "lists"}


def _type_words(kind: str, ctx: dict, in_list: bool) -> str:
    """What a value must be, from pydantic's error type (never pydantic's own sentence)."""
    bounds = {"greater_than_equal": ("at least", "ge"), "greater_than": ("above", "gt"),
              "less_than_equal": ("at most", "le"), "less_than": ("below", "lt")}
    if kind in bounds:
        words, key = bounds[kind]
        return f"must be {words} {ctx.get(key)}"
    if in_list and kind in ITEM_WORDS:
        return f"must be a list of {ITEM_WORDS[kind]}"
    return TYPE_WORDS.get(kind, "is not a value a trace can hold")


def first_error(exc: ValidationError) -> str:
    """The one sentence a failed model validation is told in (the outermost error first)."""
    errs = exc.errors(include_url=False)
    # a wrong container type is told before the items inside it
    errs.sort(key=lambda e: len(e.get("loc", ())))
    n = len(errs)
    more = f" (and {n - 1} more problem{'s' if n > 2 else ''})" if n > 1 else ""
    return _sentence(errs[0]) + more
