"""specviz: run real speculative decoding step by step and see why it speeds a model up.

Library layout: ``models`` (targets), ``drafters`` (PLD, AdaPLD, DFlash, ReTrace), ``verify`` and
``tree`` (lossless verification), ``engine`` (Session/step/run), ``trace`` (Round/Trace JSON),
``bench`` (prompt sets and the side-by-side runner), ``viz`` (Plotly figures and token HTML).
"""
import os as _os

# PyTorch's OpenMP workers spin while waiting by default; on a small shared CPU (the 2-core
# machines this runs on, with a browser and a server beside it) that turns a 0.2 s round into
# seconds. Passive waiting keeps rounds fast. Must happen before torch is first imported.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
