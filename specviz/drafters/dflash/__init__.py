"""DFlash, a block-diffusion drafter conditioned on the target's hidden states
(docs/methods/dflash.md), and its variants DSpark (:mod:`.dspark`, a low-rank Markov head over
the block; docs/methods/dspark.md) and ReTrace (:mod:`.retrace`, conditioned on the rejected
suffix of the previous round; docs/methods/retrace.md).

The drafter is :mod:`.drafter`; the torch model :mod:`.model`, checkpoints :mod:`.checkpoint`,
settings :mod:`.params`, run-time weights :mod:`.runtime` (packed kernels, :mod:`.int8`), the
context cache :mod:`.context`, the forward gate :mod:`.block_cut` with the state probe
:mod:`.state_probe` (the drafter's side of both: :mod:`.gating`), token trees from a block
:mod:`.block_tree`, and the drafts and acceptance of every state along a cached rollout
:mod:`.offline` (used by offline evaluation and training)."""
from .drafter import SPECS as DFLASH_SPECS
from .drafter import DFlashDrafter
from .dspark import SPECS as DSPARK_SPECS
from .dspark import DSparkDrafter
from .retrace import SPECS as RETRACE_SPECS
from .retrace import ReTraceDrafter

#: the registry entries of DFlash, DSpark and ReTrace (in the order the app lists them)
SPECS = (*DFLASH_SPECS, *DSPARK_SPECS, *RETRACE_SPECS)

__all__ = ["DFlashDrafter", "DSparkDrafter", "ReTraceDrafter", "SPECS"]
