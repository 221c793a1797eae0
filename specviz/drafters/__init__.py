"""Drafting strategies behind one interface (see :mod:`specviz.drafters.base`)."""
from __future__ import annotations

from ..errors import SettingsError
from .base import ARDrafter, Draft, DraftContext, Drafter, VerifyFeedback
from .pld import PLDDrafter

METHODS = {
    "ar": "Plain autoregressive decoding (no draft; the baseline)",
    "pld": "Prompt lookup decoding (transformers semantics)",
}


def make_drafter(method: str, target=None, **params) -> Drafter:
    """Build a drafter by method name; ``params`` are the method's settings."""
    method = (method or "").strip().lower()
    factories = {"ar": ARDrafter, "pld": PLDDrafter}
    if method in factories:
        try:
            return factories[method](**params)
        except TypeError as exc:
            raise SettingsError(f"bad settings for method '{method}': {exc}") from exc
    raise SettingsError(f"unknown method '{method}' (choose from: {', '.join(METHODS)})")


__all__ = ["ARDrafter", "Draft", "DraftContext", "Drafter", "VerifyFeedback", "PLDDrafter",
           "METHODS", "make_drafter"]
