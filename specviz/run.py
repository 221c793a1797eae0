"""Run one method on one prompt: build the drafter by its registry name, decode to the end.

The convenience above the core: :class:`~specviz.engine.Session` takes a drafter object and
knows nothing of the method registry (:mod:`specviz.drafters`); this joins the two.
"""
from __future__ import annotations

from .drafters import make_drafter
from .engine import DecodeSettings, Session
from .models import Target
from .trace import Trace


def generate(target: Target, method: str, prompt: str | list[int],
             settings: DecodeSettings | None = None, **drafter_params) -> Trace:
    """Build the drafter of ``method`` for ``target``, run a Session to the end, return its
    Trace."""
    drafter = make_drafter(method, target, **drafter_params)
    return Session(target, drafter, prompt, settings, method=method).run()
