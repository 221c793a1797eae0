"""specviz: run real speculative decoding step by step and see why it speeds a model up.

Library layout: ``models`` (targets), ``drafters`` (AR, PLD, AdaPLD, DFlash, and the method
registry), ``tree`` and ``verify`` (token trees, lossless verification -> Verdict), ``kvcache``
(cache surgery after a round), ``engine`` (Session: propose -> verify -> commit -> record),
``trace`` (Round/Trace JSON), ``analysis`` (metrics, lossless checks, offline replay), ``bench``
(prompt sets and the side-by-side runner), ``train`` (rollouts, DFlash training), ``viz`` (Plotly
figures and token HTML).
"""
import os as _os

# PyTorch's OpenMP workers spin while waiting by default; on a small shared CPU (the 2-core
# machines this runs on, with a browser and a server beside it) that turns a 0.2 s round into
# seconds. Passive waiting keeps rounds fast. Must happen before torch is first imported.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# ... but sleeping at once between two linears of one forward costs a thread wake-up per call:
# with torch's libgomp a short bounded spin (~0.4 ms; GOMP_SPINCOUNT overrides the policy's
# zero) keeps the workers awake through a forward and still yields between rounds. Measured on
# the 2-core AMD machine (embedded model, packed linears): one-token step 65 -> 47 ms, an
# 8-token verify 88 -> 69 ms; 2,000 spins: 54 ms; with a busy process beside it no slower.
_os.environ.setdefault("GOMP_SPINCOUNT", "20000")

__version__ = "0.1.0"
