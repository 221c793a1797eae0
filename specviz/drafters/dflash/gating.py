"""DFlash's forward gate and cut, the drafter's side (docs/methods/dflash.md): before a
block's forward, whether to run the drafter at all (the forward gate of :mod:`.block_cut`, then,
when fitted and on, the state probe of :mod:`.state_probe`); after the verify, what the cut and
the gate learn from the round (its block confidence, the kept slots or tree nodes, and what the
round measurably cost). Each decision goes into the round's extras (``cut``, ``state_probe``)
for the decode page's gate chart.

A mixin of :class:`~specviz.drafters.dflash.drafter.DFlashDrafter`: it reads the drafter's ``cut``
(:class:`~.block_cut.BlockCut` or None), ``shared`` (a hybrid's lookup draft), state probe and
settings, and keeps ``_last_cut`` / ``_last_tree`` / ``_probe_x`` between propose and observe.
"""
from __future__ import annotations

from typing import Any

import torch

from .block_tree import path_confidence
from .checkpoint import resolve_checkpoint
from .context import tapped_features
from .params import PARAMS
from .state_probe import load_state_probe, skips


class GatedBlock:
    """When a DFlash round runs the drafter, and what its cut and gate learn (see above)."""

    def _load_state_probe(self, checkpoint, state_probe: str) -> None:
        """The state probe fitted beside ``checkpoint`` (:mod:`.state_probe`); none where
        ``state_probe`` is off or the model came without a checkpoint."""
        self.state_probe_setting = PARAMS["state_probe"].check(state_probe)
        m = self.model
        self.state_probe = None if self.state_probe_setting == "off" or checkpoint is None \
            else load_state_probe(resolve_checkpoint(checkpoint), list(m.target_layer_ids),
                                  len(self.hidden_state_layers) * int(m.hidden_size))
        self._probe_x: torch.Tensor | None = None   # tapped features before the next anchor

    def _skips_forward(self, round_index: int, k: int, extras: dict) -> bool:
        """No drafter forward this round? The forward gate has paused the drafter, or its
        state probe says the block would not pay (:mod:`.state_probe`, when fitted and on);
        the verdict goes into ``extras``."""
        if self.cut is not None and not self.cut.wants_forward(round_index):
            extras["cut"] = {"kept": 0, "block": k, "paused": True,
                             **self._gate_state(drafted=False)}
            return True
        verdict = self._probe_verdict()
        if verdict is not None:
            extras["state_probe"] = verdict
            if verdict["skip"]:
                extras["cut"] = {"kept": 0, "block": k, "paused": True,
                                 **self._gate_state(drafted=False)}
                return True
        return False

    def _round_cost(self, rnd) -> float | None:
        """What the drafted round really cost, in one-token forwards: its drafting and verify
        forward times over the cost model's current one-token step (both measured in this run,
        under the same load); None (the gate uses c(nodes + 1) + d) with ``gate_cost="model"``
        or without a timed forward (offline replay)."""
        step = self.cut.cost.step_time if self.cut is not None else 0.0
        if self.gate_cost != "measured" or not rnd.t_forward or step <= 0:
            return None
        return (float(rnd.t_draft) + float(rnd.t_forward)) / step

    def _probe_verdict(self) -> dict[str, Any] | None:
        """The state probe's verdict before this round's forward (:mod:`.state_probe`): skip?,
        predicted accepted length and the threshold c(2) + d - 1; None without a probe (no
        fitted probe, ``cut`` not auto, or a hybrid's block, judged against its lookup)."""
        if self.state_probe is None or self._probe_x is None or self.cut is None \
                or self.cut.gate is None or self.shared is not None \
                or (self.state_probe_setting == "probes" and not self.cut.gate.off):
            return None
        skip, y_hat, threshold = skips(self.state_probe, self._probe_x,
                                       self.cut.cost.relative(2), self.cut.draft_cost)
        return {"skip": skip, "predicted": round(y_hat, 3), "threshold": round(threshold, 3)}

    def _keep_probe_features(self, hidden_states, row: int) -> None:
        """Keep the tapped features of ``row`` (the position before the next anchor) for the
        state probe; nothing without a probe."""
        if self.state_probe is not None and hidden_states is not None and row >= 0:
            self._probe_x = tapped_features(hidden_states, self.hidden_state_layers,
                                            [row])[0, 0].float().cpu()

    def _gate_state(self, drafted: bool) -> dict[str, Any]:
        """The forward gate's rate when this round was decided, and whether a drafted round is a
        probe of the paused drafter (the decode page's gate chart); empty without a gate."""
        gate = self.cut.gate if self.cut is not None else None
        if gate is None:
            return {}
        return {"rate": round(gate.rate, 3), "probe": bool(drafted and gate.off)}

    def pop_cut(self, path: list[int]) -> tuple[list[float], int, int] | None:
        """What the cut learns from the last drafted block, once, given the accepted ``path``
        of its nodes: (confidence, kept depths, verified nodes) for
        :meth:`.block_cut.BlockCut.observe` -- a chain's block confidence and kept slots, a
        tree's drafted mass at each judged depth (:func:`.block_tree.path_confidence`).
        None when the round drafted no block (paused, no budget) or runs without a cut."""
        cut, self._last_cut = self._last_cut, None
        tree, self._last_tree = self._last_tree, None
        if cut is not None:
            return cut[0], cut[1], cut[1]
        if tree is None:
            return None
        conf = path_confidence(tree[0], tree[1], path) if tree[0] else []
        return conf, len(conf), len(tree[0])
