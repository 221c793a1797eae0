"""Round and Trace records (speculative decoding §0; DESIGN "Round record").

A :class:`Round` is one speculative round: what the drafter proposed, what the target said at
every drafted position, what was accepted, committed and rejected, and how long it took. A
:class:`Trace` is a run: metadata plus rounds. Every chart and page is a pure function of a
Trace, and a Trace saved to JSON and loaded back renders exactly like the live one.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .analysis import metrics
from .errors import TraceError
from .tree import TokenTree

SCHEMA_VERSION = 1
MAX_TRACE_BYTES = 200 * 1024 * 1024


@dataclass
class Round:
    """One speculative round starting at committed position ``start`` (absolute, prompt included).

    Chain drafts have ``parents=None``. Tree drafts give each node's parent index
    (-1 = the last committed token, i.e. the tree root) and ``accepted_path`` lists the node
    indices of the accepted path. Per-position lists are indexed like ``draft`` except
    ``target_argmax`` / ``target_argmax_prob`` / ``target_topk`` / ``target_topk_prob`` of a
    chain, which have one more entry: the target's prediction after the last draft token (the
    bonus slot). ``target_topk`` holds the target's top-4 ids per verify row, best first (empty in
    traces recorded before it existed).
    """

    index: int
    start: int
    drafter: str
    draft: list[int]
    accepted: int
    committed: list[int]
    target_argmax: list[int] = field(default_factory=list)
    target_argmax_prob: list[float] = field(default_factory=list)
    target_topk: list[list[int]] = field(default_factory=list)       # per verify row, best first
    target_topk_prob: list[list[float]] = field(default_factory=list)
    p_draft: list[float] = field(default_factory=list)       # target prob of each draft token
    q_draft: list[float | None] = field(default_factory=list)  # drafter prob (None: point mass)
    parents: list[int] | None = None
    accepted_path: list[int] = field(default_factory=list)
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_forward: float = 0.0   # the verify forward's compute alone (inside t_verify; no queue wait)
    t_wait: float = 0.0      # waiting for the shared model (another tab's turn; inside t_verify)
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    # ---- the draft as a tree (a chain is a one-branch tree): read here, once, for every view
    @property
    def tree(self) -> TokenTree:
        if self.parents is None:
            return TokenTree.chain(self.draft)
        return TokenTree([int(t) for t in self.draft], [int(p) for p in self.parents])

    @property
    def path(self) -> list[int]:
        """Node indices of the accepted path (a chain: the first ``accepted`` nodes)."""
        if self.parents is None:
            return list(range(min(int(self.accepted), len(self.draft))))
        return [int(x) for x in self.accepted_path if 0 <= int(x) < len(self.draft)]

    def node_status(self, sampling: bool = False) -> list[str]:
        """accepted / first_rejected / rejected / not_reached per draft node (TokenTree)."""
        return self.tree.node_status(self.path, sampling)

    @property
    def rejected_nodes(self) -> list[int]:
        """Draft nodes off the accepted path, in node order (never committed)."""
        on_path = set(self.path)
        return [i for i in range(len(self.draft)) if i not in on_path]

    @property
    def rejected_suffix(self) -> list[int]:
        """Draft tokens off the accepted path (a chain: from the first mismatch on)."""
        return [int(self.draft[i]) for i in self.rejected_nodes]

    @property
    def draft_depth(self) -> int:
        """How deep the draft goes: its length for a chain, the deepest node for a tree."""
        return len(self.draft) if self.parents is None else self.tree.depth

    def node_row(self, node: int) -> int:
        """Row of the verify forward whose output predicts draft node ``node``."""
        return node if self.parents is None else TokenTree.row_of(int(self.parents[node]))

    @property
    def target_row(self) -> int:
        """Row of the verify forward whose output is the round's target token."""
        path = self.path
        return TokenTree.row_of(path[-1]) if path else 0

    @property
    def target_token(self) -> int:
        """The target's own token that ends the round (correction, or bonus if all accepted)."""
        return self.committed[self.accepted] if len(self.committed) > self.accepted else -1

    @property
    def kind(self) -> str:
        """``nodraft`` (a plain decoding step), ``bonus`` (the whole draft depth accepted, the
        target's token follows it) or ``correction`` (the target's token replaces a rejection)."""
        if not self.draft:
            return "nodraft"
        return "bonus" if self.accepted >= self.draft_depth else "correction"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Round":
        names = {f.name for f in fields(cls)}
        missing = {"index", "start", "drafter", "draft", "accepted", "committed"} - set(d)
        if missing:
            raise TraceError(f"round is missing fields: {', '.join(sorted(missing))}")
        _check_round_types(d)
        r = cls(**{k: v for k, v in d.items() if k in names})
        if not (0 <= r.accepted <= len(r.draft)) or len(r.committed) < r.accepted:
            raise TraceError(f"round {r.index}: accepted={r.accepted} is inconsistent with its draft")
        return r


_INT_FIELDS = ("index", "start", "accepted")
_ID_LISTS = ("draft", "committed", "target_argmax", "accepted_path")
_NUM_FIELDS = ("t_draft", "t_verify", "t_forward", "t_wait")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_round_types(d: dict) -> None:
    """Field types of a round read from JSON, with a message a person can act on."""
    where = f"round {d.get('index')!r}" if _is_int(d.get("index")) else "a round"
    for k in _INT_FIELDS:
        if not _is_int(d.get(k)):
            raise TraceError(f"{where}: '{k}' must be a whole number, got {d.get(k)!r}")
    for k in _ID_LISTS:
        v = d.get(k, [])
        if not isinstance(v, list) or not all(_is_int(x) for x in v):
            raise TraceError(f"{where}: '{k}' must be a list of token ids")
    par = d.get("parents")
    if par is not None and (not isinstance(par, list) or not all(_is_int(x) for x in par)):
        raise TraceError(f"{where}: 'parents' must be a list of node indices or null")
    for k in ("target_topk", "target_topk_prob"):
        v = d.get(k, [])
        if not isinstance(v, list) or not all(isinstance(row, list) and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in row) for row in v):
            raise TraceError(f"{where}: '{k}' must be a list of lists of numbers")
    for k in _NUM_FIELDS:
        v = d.get(k, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TraceError(f"{where}: '{k}' must be a number of seconds, got {v!r}")
    if not isinstance(d.get("extras", {}), dict):
        raise TraceError(f"{where}: 'extras' must be an object")


@dataclass
class Trace:
    """A speculative run: metadata (model, method, settings, prompt) and its rounds."""

    meta: dict[str, Any]
    prompt_ids: list[int]
    rounds: list[Round] = field(default_factory=list)
    token_texts: dict[int, str] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    # ---- derived statistics (every number shown is computed from the rounds) ----
    @property
    def output_ids(self) -> list[int]:
        return [t for r in self.rounds for t in r.committed]

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    @property
    def target_forwards(self) -> int:
        """Target forward passes: one per round, prefill not counted (analysis.metrics)."""
        return metrics.target_forwards(self.rounds)

    @property
    def tau(self) -> float:
        """tau: committed tokens per round (:func:`specviz.analysis.metrics.tau`)."""
        return metrics.tau(self.new_tokens, self.num_rounds)

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def decode_time(self) -> float:
        return sum(r.t_draft + r.t_verify for r in self.rounds)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens ÷ decode time (prefill excluded); 0.0 before any round."""
        return metrics.tokens_per_s(self.new_tokens, self.decode_time) or 0.0

    def text(self, tokenizer=None) -> str:
        if tokenizer is not None:
            return tokenizer.decode(self.output_ids, skip_special_tokens=False)
        return "".join(self.token_texts.get(t, "") for t in self.output_ids)

    def summary(self) -> dict[str, Any]:
        """Headline numbers of the run (definitions: :mod:`specviz.analysis.metrics`)."""
        return {
            "method": self.meta.get("method"),
            "rounds": self.num_rounds,
            "target_forwards": self.target_forwards,
            "new_tokens": self.new_tokens,
            "tau": round(self.tau, 4),
            "decode_time_s": round(self.decode_time, 4),
            "tokens_per_s": round(self.tokens_per_s, 3),
        }

    # ---- JSON ----
    def to_dict(self) -> dict:
        return {
            "schema_version": self.schema_version,
            "meta": self.meta,
            "prompt_ids": self.prompt_ids,
            "rounds": [r.to_dict() for r in self.rounds],
            "token_texts": {str(k): v for k, v in self.token_texts.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=False,
                          default=_json_default)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(self.to_json(), encoding="utf-8")
        tmp.replace(path)
        return path

    @classmethod
    def from_dict(cls, d: Any) -> "Trace":
        if not isinstance(d, dict):
            raise TraceError("not a specviz trace (expected a JSON object)")
        if "schema_version" not in d or "rounds" not in d:
            raise TraceError("not a specviz trace (no schema_version / rounds)")
        ver = d["schema_version"]
        if not isinstance(ver, int) or ver > SCHEMA_VERSION or ver < 1:
            raise TraceError(f"unsupported trace schema_version {ver!r} (this specviz reads "
                             f"1..{SCHEMA_VERSION})")
        try:
            rounds = [Round.from_dict(r) for r in d["rounds"]]
            token_texts = {int(k): str(v) for k, v in (d.get("token_texts") or {}).items()}
            prompt_ids = [int(x) for x in d.get("prompt_ids", [])]
        except TraceError:
            raise
        except (TypeError, ValueError, AttributeError) as exc:
            raise TraceError(f"malformed trace: {exc}") from exc
        meta = d.get("meta") or {}
        if not isinstance(meta, dict):
            raise TraceError("malformed trace: meta must be an object")
        return cls(meta=meta, prompt_ids=prompt_ids, rounds=rounds, token_texts=token_texts,
                   schema_version=ver)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Trace":
        if isinstance(text, bytes):
            if len(text) > MAX_TRACE_BYTES:
                raise TraceError("trace file is too large")
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError("trace file is not UTF-8 text") from exc
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"trace file is not valid JSON (line {exc.lineno}: {exc.msg})") from exc
        return cls.from_dict(d)

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        path = Path(path)
        if not path.exists():
            raise TraceError(f"trace file {path} does not exist")
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise TraceError(f"trace file {path} is too large")
        return cls.from_json(path.read_bytes())


def _json_default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
