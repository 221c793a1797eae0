"""The target's own greedy history as a datastore (an AdaPLD source beyond the paper, in the spirit
of REST, He et al. 2024, "retrieval-based speculative decoding"): for the one to three tokens that
end the context, the token the target most often produced next in its own earlier greedy replies.

Why: prompt lookup has nothing to copy when the last token never occurred in prompt + output
(40 % of AdaPLD's rounds on the 155-prompt bench drafted nothing for that reason). The target's
own replies to *other* prompts know what it tends to write next (" list" -> " comprehension",
"```" -> "python"). Under width-invariant numerics (:mod:`specviz.numerics`) a one-token draft
costs nothing (the step is padded to two tokens anyway), so even a modest hit rate pays.

Conventions: a store is counted once from token sequences (the replies of cached greedy
rollouts, :func:`build`): ``bigram[x] = (y, share)``, ``trigram[(w, x)] = (y, share)`` and
``fourgram[(u, w, x)] = (y, share)`` with y the most frequent successor and ``share`` its
fraction of that context's occurrences (a three-token context is kept only when it occurred at
least ``min_count4`` times: a context seen once says "share 1.0" on no evidence). A lookup
prefers the longest context (backing off to shorter ones), and a chain continues on its own
predictions (:meth:`HistoryStore.chain`) until a context is unknown or an EOS would follow.
A store built from rollouts also carries the reply openings index (:mod:`.openings`: how the
target began its replies to similar prompts; AdaPLD's first round).
Deterministic, no model, no training: counting. Stores are tied to one tokenizer (``meta``:
model, vocab size); ``auto`` in AdaPLD uses the bundled store of the loaded target when one
exists.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ...errors import SettingsError
from .openings import OpeningIndex

BUNDLED_DIR = Path(__file__).resolve().parents[2] / "weights"   # specviz/weights
#: the store committed for the embedded default target (built by ``specviz train store``)
BUNDLED = {"SmolLM2-135M-Instruct (embedded)": "history-smollm2-135m-instruct.npz"}


@dataclass
class HistoryStore:
    """n-gram -> the target's most frequent next token (and its share) in its own replies."""

    bigram: dict[int, tuple[int, float]]
    trigram: dict[tuple[int, int], tuple[int, float]]
    meta: dict = field(default_factory=dict)
    fourgram: dict[tuple[int, int, int], tuple[int, float]] = field(default_factory=dict)
    openings: OpeningIndex | None = None   # how the target opened replies to earlier prompts

    def __len__(self) -> int:
        return len(self.bigram) + len(self.trigram) + len(self.fourgram)

    def next_token(self, w: int | None, x: int, u: int | None = None
                   ) -> tuple[int, float, int] | None:
        """(predicted token, its share, n of the matched context: 3, 2 or 1) after
        ``... u w x`` (``u`` / ``w`` None: that much context is not known)."""
        if u is not None and w is not None and self.fourgram:
            hit = self.fourgram.get((int(u), int(w), int(x)))
            if hit is not None:
                return hit[0], hit[1], 3
        if w is not None:
            hit = self.trigram.get((int(w), int(x)))
            if hit is not None:
                return hit[0], hit[1], 2
        hit = self.bigram.get(int(x))
        return None if hit is None else (hit[0], hit[1], 1)

    def chain(self, tokens: Sequence[int], length: int, eos=frozenset()) -> tuple[list[int], int]:
        """(up to ``length`` predicted tokens, n of the first lookup's context; 0 = no entry)."""
        if not tokens or length <= 0:
            return [], 0
        ctx = [int(t) for t in tokens[-3:]]
        out: list[int] = []
        first_n = 0
        while len(out) < length:
            hit = self.next_token(*self.context(ctx))
            if hit is None or hit[0] in eos:
                break
            first_n = first_n or hit[2]
            out.append(hit[0])
            ctx.append(hit[0])
        return out, first_n

    @staticmethod
    def context(tokens: Sequence[int]) -> tuple[int | None, int, int | None]:
        """``(w, x, u)`` for :meth:`next_token` from the context's last three tokens."""
        n = len(tokens)
        return (int(tokens[-2]) if n > 1 else None, int(tokens[-1]),
                int(tokens[-3]) if n > 2 else None)

    # ------------------------------------------------------------------ (de)serialisation
    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        bk = np.array(sorted(self.bigram), dtype=np.int32)
        tk = np.array(sorted(self.trigram), dtype=np.int32).reshape(-1, 2)
        fk = np.array(sorted(self.fourgram), dtype=np.int32).reshape(-1, 3)
        np.savez_compressed(
            path, meta=np.array(json.dumps(self.meta)),
            bigram_keys=bk, bigram_next=np.array([self.bigram[k][0] for k in bk.tolist()], np.int32),
            bigram_share=np.array([self.bigram[k][1] for k in bk.tolist()], np.float16),
            trigram_keys=tk,
            trigram_next=np.array([self.trigram[tuple(k)][0] for k in tk.tolist()], np.int32),
            trigram_share=np.array([self.trigram[tuple(k)][1] for k in tk.tolist()], np.float16),
            fourgram_keys=fk,
            fourgram_next=np.array([self.fourgram[tuple(k)][0] for k in fk.tolist()], np.int32),
            fourgram_share=np.array([self.fourgram[tuple(k)][1] for k in fk.tolist()], np.float16),
            **(self.openings.arrays() if self.openings is not None else {}))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "HistoryStore":
        """Read a saved store; a missing, truncated or foreign file raises one clear
        :class:`~specviz.errors.SettingsError`."""
        path = Path(path)
        if not path.is_file():
            raise SettingsError(f"history store {path} does not exist")
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                bigram = {int(k): (int(y), float(s)) for k, y, s in
                          zip(z["bigram_keys"], z["bigram_next"], z["bigram_share"])}
                trigram = {(int(k[0]), int(k[1])): (int(y), float(s)) for k, y, s in
                           zip(z["trigram_keys"], z["trigram_next"], z["trigram_share"])}
                fourgram = {tuple(int(t) for t in k): (int(y), float(s)) for k, y, s in
                            zip(z["fourgram_keys"], z["fourgram_next"], z["fourgram_share"])} \
                    if "fourgram_keys" in z.files else {}   # stores saved before 4-grams
                openings = OpeningIndex.from_arrays(z)
        except Exception as exc:  # zip/npz/json errors: a torn or foreign file
            raise SettingsError(f"history store {path} cannot be read ({type(exc).__name__}: "
                                f"{exc}); rebuild it with `python -m specviz train store`") from exc
        return cls(bigram, trigram, meta, fourgram, openings)


#: a three-token context must have occurred this often to enter the store
MIN_COUNT4 = 2


def build(sequences: Iterable[Sequence[int]], meta: dict | None = None,
          min_count4: int = MIN_COUNT4, openings: OpeningIndex | None = None) -> HistoryStore:
    """Count a store from token sequences (each the target's greedy reply, preceded by the
    prompt's last tokens so the reply's first token has a context). ``min_count4 = 0``: no
    three-token contexts (the store of bigrams and trigrams only). ``openings``: the reply
    openings index carried along (:mod:`.openings`)."""
    big: dict[int, Counter] = defaultdict(Counter)
    tri: dict[tuple[int, int], Counter] = defaultdict(Counter)
    four: dict[tuple[int, int, int], Counter] = defaultdict(Counter)
    tokens = 0
    for seq in sequences:
        s = [int(t) for t in seq]
        tokens += len(s)
        for a, b in zip(s, s[1:]):
            big[a][b] += 1
        for a, b, c in zip(s, s[1:], s[2:]):
            tri[(a, b)][c] += 1
        if min_count4 > 0:
            for a, b, c, d in zip(s, s[1:], s[2:], s[3:]):
                four[(a, b, c)][d] += 1

    def top(table, min_count=1):
        out = {}
        for k, cnt in table.items():
            if sum(cnt.values()) < min_count:
                continue
            # most frequent; ties to the smaller token id (deterministic)
            y, n = min(cnt.items(), key=lambda kv: (-kv[1], kv[0]))
            out[k] = (int(y), n / sum(cnt.values()))
        return out
    return HistoryStore(top(big), top(tri), dict(meta or {}, tokens=tokens, min_count4=min_count4),
                        top(four, max(1, min_count4)) if min_count4 > 0 else {}, openings)


def bundled_store(target) -> HistoryStore | None:
    """The committed store of ``target`` (by its name, checked against its vocabulary), or
    None when there is none for this model."""
    name = BUNDLED.get(str(getattr(target, "name", "")))
    if name is None or not (BUNDLED_DIR / name).is_file():
        return None
    return _load_cached(str(BUNDLED_DIR / name), _vocab_size(target))


_LOADED: dict[str, HistoryStore] = {}


def _vocab_size(target) -> int | None:
    try:
        return int(target.model.config.vocab_size)
    except AttributeError:
        return None


def _load_cached(path: str, vocab: int | None) -> HistoryStore | None:
    store = _LOADED.get(path)
    if store is None:
        store = _LOADED[path] = HistoryStore.load(path)
    want = store.meta.get("vocab_size")
    return store if vocab is None or want is None or int(want) == vocab else None


def resolve_store(choice: str, target) -> HistoryStore | None:
    """AdaPLD's ``history`` setting: ``off`` -> None, ``auto`` -> the bundled store of the
    target (None without one), else a path to a saved store (its vocabulary must match)."""
    choice = str(choice or "off").strip()
    if choice == "off":
        return None
    if choice == "auto":
        return bundled_store(target) if target is not None else None
    store = _load_cached(str(Path(choice).expanduser()), None)
    vocab, want = _vocab_size(target), store.meta.get("vocab_size")
    if vocab is not None and want is not None and int(want) != vocab:
        raise SettingsError(f"history store {choice} was counted for a vocabulary of {want} "
                            f"tokens, but the loaded target has {vocab}")
    return store
