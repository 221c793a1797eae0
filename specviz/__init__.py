"""specviz: run real speculative decoding step by step and see why it speeds a model up.

Library layout: ``models`` (targets), ``drafters`` (PLD, AdaPLD, DFlash, ReTrace), ``verify`` and
``tree`` (lossless verification), ``engine`` (Session/step/run), ``trace`` (Round/Trace JSON),
``bench`` (prompt sets and the side-by-side runner), ``viz`` (Plotly figures and token HTML).
"""
__version__ = "0.1.0"
