"""Round and Trace records: what a speculative run did, round by round (docs/traces.md).

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

from . import metrics
from .errors import TraceError
from .trace_checks import validate_trace_dict
from .trace_schema import MAX_DEPTH, SCHEMA_VERSION
from .tree import TokenTree

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
        target's token follows it) or ``correction`` (the target's token replaces a rejection).
        A served round whose drafted tokens are not reported takes its depth from
        ``extras.served.drafted``."""
        served = (self.extras or {}).get("served") or {}
        depth = max(self.draft_depth, int(served.get("drafted") or 0))
        if depth == 0:
            return "nodraft"
        return "bonus" if self.accepted >= depth else "correction"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Round":
        """A round from a checked record (:func:`specviz.trace_checks.validate_trace_dict`)."""
        names = {f.name for f in fields(cls)}
        r = cls(**{k: v for k, v in d.items() if k in names})
        r.extras = dict(r.extras or {})
        return r


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
        """tau: committed tokens per round (:func:`specviz.metrics.tau`)."""
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
        """Headline numbers of the run (definitions: :mod:`specviz.metrics`)."""
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
        """A trace from parsed JSON, checked against its declared schema first
        (:mod:`specviz.trace_schema`); anything that cannot be shown raises TraceError."""
        validate_trace_dict(d)
        ver = d["schema_version"]
        return cls(meta=dict(d.get("meta") or {}), prompt_ids=list(d.get("prompt_ids") or []),
                   rounds=[Round.from_dict(r) for r in d["rounds"]],
                   token_texts={int(k): v for k, v in (d.get("token_texts") or {}).items()},
                   schema_version=ver)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Trace":
        """Read a trace file's bytes (UTF-8, a byte-order mark allowed) or text."""
        if isinstance(text, bytes):
            if len(text) > MAX_TRACE_BYTES:
                raise TraceError(f"the trace file is too large (over {MAX_TRACE_BYTES >> 20} MB)")
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError("the trace file is not UTF-8 text") from exc
        text = text.removeprefix("\ufeff")   # a byte-order mark, from bytes or text
        if not text.strip():
            raise TraceError("the trace file is empty")
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"the trace file is not valid JSON (line {exc.lineno}: "
                             f"{exc.msg})") from exc
        except RecursionError:
            raise TraceError(f"the trace file nests JSON too deeply (a trace nests at most "
                             f"{MAX_DEPTH} levels)") from None
        return cls.from_dict(d)

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        path = Path(path)
        if not path.is_file():
            raise TraceError(f"trace file {path} does not exist" if not path.exists()
                             else f"{path} is not a file")
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise TraceError(f"trace file {path} is too large (over {MAX_TRACE_BYTES >> 20} MB)")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from exc
        try:
            return cls.from_json(data)
        except TraceError as exc:
            raise TraceError(f"{path.name}: {exc}") from None


def _json_default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
