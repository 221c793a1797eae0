"""The checks every trace reader runs (docs/traces.md): :func:`validate_trace_dict` -- the
declared schema (:mod:`specviz.trace_schema`: types, ranges, sizes, depth, finite numbers), then
what no single field says (:func:`check_structure`): rounds numbered in order, each starting
where the previous one ended, a chain's or a tree's accepted tokens committed as drafted, tree
parents before their children, per-row lists no longer than the verify's rows, and token ids
within the trace's vocabulary (``meta.vocab_size``, else the ids that have a text in
``token_texts``). Every failure is one :class:`~specviz.errors.TraceError` sentence naming the
field and the round (rounds count from 1, as on the pages).
"""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from .errors import TraceError
from .trace_schema import MAX_ID, SCHEMA_VERSION, TraceRecord, first_error, scan_values, shown


def _fail(i: int, what: str) -> None:
    raise TraceError(f"round {i + 1}: {what}")


def _check_tree(i: int, r: dict) -> None:
    draft, parents, path = r["draft"], r["parents"], r.get("accepted_path", [])
    if len(parents) != len(draft):
        _fail(i, f"'parents' has {len(parents)} entries for {len(draft)} draft nodes")
    for n, p in enumerate(parents):
        if not -1 <= p < n:
            _fail(i, f"node {n + 1} has parent {p}: a parent comes before its child "
                     "(-1 is the root)")
    prev = -1
    for node in path:
        if node >= len(draft) or parents[node] != prev:
            _fail(i, f"'accepted_path' {path} is not a path down the draft tree")
        prev = node
    if r["accepted"] != len(path):
        _fail(i, f"'accepted' is {r['accepted']} but the accepted path has {len(path)} nodes")


def _check_round(i: int, r: dict, start: int) -> None:
    if r["index"] != i:
        _fail(i, f"'index' is {r['index']}; rounds are numbered 0, 1, 2, ... in file order")
    if r["start"] != start:
        _fail(i, f"'start' is {r['start']} but the prompt and the rounds before it end at "
                 f"position {start}")
    draft, acc, com = r["draft"], r["accepted"], r["committed"]
    if r.get("parents") is not None:
        _check_tree(i, r)
        path_tokens = [draft[n] for n in r.get("accepted_path", [])]
    else:
        if r.get("accepted_path"):
            _fail(i, "'accepted_path' is for tree drafts; this round is a chain (no parents)")
        if acc > len(draft):
            _fail(i, f"'accepted' is {acc} but the draft has {len(draft)} token(s)")
        path_tokens = draft[:acc]
    if not acc <= len(com) <= acc + 1:
        _fail(i, f"'committed' has {len(com)} tokens; a round commits its {acc} accepted "
                 "token(s) and at most one of the target's")
    if list(com[:acc]) != list(path_tokens):
        _fail(i, "the committed tokens differ from the accepted draft tokens")
    rows = len(draft) + 1
    for k in ("target_argmax", "target_argmax_prob", "target_topk", "target_topk_prob"):
        if len(r.get(k, [])) > rows:
            _fail(i, f"'{k}' has {len(r[k])} rows; its verify had {rows}")
    for k in ("p_draft", "q_draft"):
        if len(r.get(k, [])) not in (0, len(draft)):
            _fail(i, f"'{k}' has {len(r[k])} entries for {len(draft)} draft tokens")
    for ids, ps in (("target_topk", "target_topk_prob"),):
        if r.get(ps) and [len(x) for x in r[ps]] != [len(x) for x in r.get(ids, [])][:len(r[ps])]:
            _fail(i, f"'{ps}' does not have the shape of '{ids}'")


def _check_ids(d: dict) -> None:
    """Token ids within the trace's vocabulary: ``meta.vocab_size`` when recorded, else the ids
    that have a text (a recorded trace writes the text of every id it holds)."""
    vocab = (d.get("meta") or {}).get("vocab_size")
    texts = d.get("token_texts") or {}
    if vocab is None and not texts:
        return
    known = None if vocab is not None else set(texts)

    def bad(t: int) -> bool:
        return t >= vocab if vocab is not None else str(t) not in known

    def words(t: int) -> str:
        return (f"token id {t} is outside the model's vocabulary (0 to {vocab - 1})"
                if vocab is not None else f"token id {t} has no text in 'token_texts'")

    for t in d.get("prompt_ids", []):
        if bad(t):
            raise TraceError(f"'prompt_ids': {words(t)}")
    for i, r in enumerate(d["rounds"]):
        rows = r.get("target_topk", []) if vocab is not None else []
        for k, ids in (("draft", r["draft"]), ("committed", r["committed"]),
                       ("target_argmax", r.get("target_argmax", [])),
                       ("target_topk", [t for row in rows for t in row])):
            for t in ids:
                if bad(t):
                    _fail(i, f"'{k}': {words(t)}")


def check_structure(d: dict) -> None:
    """What no single field says: see the module docstring."""
    for k in d.get("token_texts") or {}:
        if not (k.isdigit() and int(k) < MAX_ID):
            raise TraceError(f"'token_texts': key {shown(k)} is not a token id")
    start = len(d.get("prompt_ids", []))
    for i, r in enumerate(d["rounds"]):
        _check_round(i, r, start)
        start += len(r["committed"])
    _check_ids(d)


def validate_trace_dict(d: Any) -> None:
    """Check a parsed trace file; raises TraceError with one sentence naming field and round."""
    if not isinstance(d, dict):
        raise TraceError("not a specviz trace (expected a JSON object)")
    if "schema_version" not in d or "rounds" not in d:
        raise TraceError("not a specviz trace (no schema_version / rounds)")
    ver = d["schema_version"]
    if not isinstance(ver, int) or isinstance(ver, bool) or not 1 <= ver <= SCHEMA_VERSION:
        raise TraceError(f"unsupported trace schema_version {shown(ver)} (this specviz reads "
                         f"1..{SCHEMA_VERSION})")
    try:
        TraceRecord.model_validate(d)
    except ValidationError as exc:
        raise TraceError(first_error(exc)) from None
    scan_values(d)   # what the models leave open (unknown keys): depth, finite numbers
    check_structure(d)
