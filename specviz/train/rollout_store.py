"""The rollouts store, read side (docs/methods/dflash.md): a folder of target rollouts with the
tapped hidden states, as :mod:`specviz.train.rollouts` (generated replies) and
:mod:`specviz.train.prefill` (prefill-labelled texts) write it.

* ``meta.json``: model, tapped ``target_layer_ids``, hidden size, storage dtype, settings --
  :func:`read_meta`, and :func:`write_or_check_meta` refuses to mix data of another target;
* ``manifest.jsonl``: one line per rollout -- :func:`read_manifest` (a torn last line of an
  interrupted run is skipped: that rollout is redone);
* ``shard-NNNNN.safetensors``: :class:`RolloutSet` reads a rollout lazily (memory-mapped): its
  tokens alone, tokens + features, p(y) of a sampled reply, or the stored greedy labels.

Every read error is a :class:`~specviz.errors.SpecvizError` naming the folder, shard and rollout.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import SpecvizError

META_NAME = "meta.json"
MANIFEST_NAME = "manifest.jsonl"


def read_meta(folder: str | Path) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecvizError(f"rollouts folder {folder} does not exist")
    mp = folder / META_NAME
    if not mp.is_file():
        raise SpecvizError(f"{folder} has no {META_NAME}: not a rollouts folder "
                           "(make one with `python -m specviz train rollouts`)")
    try:
        return json.loads(mp.read_text())
    except json.JSONDecodeError as exc:
        raise SpecvizError(f"{mp} is not valid JSON ({exc.msg})") from exc


def write_or_check_meta(out: Path, meta: dict) -> None:
    """Write ``meta.json`` of a new folder; for an existing one, refuse to mix data made with
    other tapped layers / target / storage dtype."""
    mp = out / META_NAME
    if mp.is_file():
        old = read_meta(out)
        for k in ("target_layer_ids", "hidden_size", "num_target_layers", "dtype"):
            if old.get(k) != meta[k]:
                raise SpecvizError(f"{out} holds data with {k}={old.get(k)}, not {meta[k]}: "
                                   "use another --out folder")
    else:
        mp.write_text(json.dumps(meta, indent=2) + "\n")


def next_shard_no(folder: Path) -> int:
    """One past the highest ``shard-NNNNN.safetensors`` number in ``folder`` (0 when none): the
    next batch a resumed run writes."""
    return 1 + max([int(p.stem.split("-")[1]) for p in folder.glob("shard-*.safetensors")
                    if p.stem.split("-")[1].isdigit()], default=-1)


def read_manifest(folder: str | Path) -> list[dict]:
    mp = Path(folder) / MANIFEST_NAME
    if not mp.is_file():
        return []
    rows = []
    for line in mp.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line of an interrupted run: that rollout is redone
    return rows


class RolloutSet:
    """The rollouts of a folder, read lazily from the shards (safetensors, memory-mapped)."""

    def __init__(self, folder: str | Path, split: str | None = None):
        self.folder = Path(folder)
        self.meta = read_meta(self.folder)
        rows = read_manifest(self.folder)
        self.rows = [r for r in rows if split is None or r.get("split") == split]
        self._open: dict[str, object] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def _shard(self, i: int):
        """The opened (memory-mapped) shard of rollout ``i``; errors name a missing or torn one."""
        from safetensors import safe_open

        shard = self.rows[i]["shard"]
        if shard not in self._open:
            path = self.folder / shard
            if not path.is_file():
                raise SpecvizError(f"rollout shard {path} is missing")
            if len(self._open) > 8:
                self._open.pop(next(iter(self._open)))
            try:
                self._open[shard] = safe_open(str(path), framework="pt")
            except Exception as exc:
                raise SpecvizError(f"rollout shard {path} cannot be opened ({exc}): truncated "
                                   "or not a safetensors file") from exc
        return self._open[shard]

    def load(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(tokens int64 [T], hidden [T, k*H] as stored, prompt_len) of rollout ``i``."""
        r = self.rows[i]
        shard = r["shard"]
        f = self._shard(i)
        try:
            toks = f.get_tensor(r["name"] + ".tokens").long()
            hid = f.get_tensor(r["name"] + ".hidden")
        except Exception as exc:  # a truncated or foreign shard
            raise SpecvizError(f"rollout {r.get('key')} cannot be read from {self.folder / shard} "
                               f"({exc}): the shard is truncated or not a rollouts shard") from exc
        if toks.shape[0] != hid.shape[0] or not 0 < int(r["prompt_len"]) <= toks.shape[0]:
            raise SpecvizError(f"rollout {r.get('key')} in {self.folder / shard} is inconsistent "
                               f"({toks.shape[0]} tokens, {hid.shape[0]} feature rows, prompt "
                               f"length {r['prompt_len']})")
        return toks, hid, int(r["prompt_len"])

    def tokens(self, i: int) -> torch.Tensor:
        """Token ids int64 [T] of rollout ``i`` alone (its features are not read)."""
        r = self.rows[i]
        try:
            return self._shard(i).get_tensor(r["name"] + ".tokens").long()
        except SpecvizError:
            raise
        except Exception as exc:
            raise SpecvizError(f"rollout {r.get('key')} cannot be read from "
                               f"{self.folder / r['shard']} ({exc})") from exc

    @property
    def temperature(self) -> float:
        """The sampling temperature the replies were generated at (0 = greedy)."""
        return float(self.meta.get("temperature") or 0.0)

    def target_p(self, i: int) -> torch.Tensor | None:
        """p(y_t) float64 [reply length] of a sampled rollout (the target's probability of each
        reply token at the sampling temperature); None for greedy rollouts."""
        if self.temperature <= 0:
            return None
        r = self.rows[i]
        f = self._shard(i)   # tokens and p only: the features are not read
        try:
            out = f.get_tensor(r["name"] + ".p").double()
        except Exception as exc:
            raise SpecvizError(f"rollout {r.get('key')} in {self.folder} was sampled "
                               f"at temperature {self.temperature} but stores no target "
                               "probabilities p(y): regenerate it with this version of "
                               "`python -m specviz train rollouts`") from exc
        n = int(f.get_slice(r["name"] + ".tokens").get_shape()[0]) - int(r["prompt_len"])
        if out.shape[0] != n:
            raise SpecvizError(f"rollout {r.get('key')} in {self.folder} has {out.shape[0]} "
                               f"target probabilities for {n} reply tokens: the shard is "
                               "inconsistent")
        return out

    def greedy(self, i: int) -> torch.Tensor | None:
        """The stored greedy next token at every position (prefill-labelled texts,
        :mod:`specviz.train.prefill`); None for generated rollouts (their text is the path)."""
        if self.rows[i].get("kind") != "prefill":
            return None
        return self._shard(i).get_tensor(self.rows[i]["name"] + ".greedy").long()

    def rollout(self, i: int):
        """Rollout ``i`` as an offline-replay record (:class:`specviz.analysis.replay.Rollout`)."""
        from ..analysis.replay import Rollout

        toks, hid, p = self.load(i)
        return Rollout(toks.tolist(), p, hid, [j + 1 for j in self.meta["target_layer_ids"]])
