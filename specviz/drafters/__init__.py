"""Drafting strategies behind one interface (see :mod:`specviz.drafters.base`)."""
from __future__ import annotations

from ..errors import SettingsError
from .base import ARDrafter, Draft, DraftContext, Drafter, VerifyFeedback
from .pld import PLDDrafter
from .adapld import AdaPLDDrafter
from .dflash import DFlashDrafter

METHODS = {
    "ar": "Plain autoregressive decoding (no draft; the baseline)",
    "pld": "Prompt lookup decoding (transformers semantics)",
    "adapld": "AdaPLD: adaptive prompt lookup (lexical + semantic retrieval, token trees)",
    "adapld_lex": "AdaPLD ablation: lexical retrieval only, single chain",
    "adapld_sem": "AdaPLD ablation: lexical + semantic retrieval, single chain",
    "dflash": "DFlash: block-diffusion drafter on the target's hidden states (bundled for the embedded model)",
}

#: Sidebar widgets per method (name -> default; the drafter validates the ranges). Methods not
#: listed get their drafter class's keyword arguments. The AdaPLD ablations leave out what their
#: preset fixes (adapld_lex: semantic off, no branches; adapld_sem: no branches).
METHOD_PARAMS = {
    "adapld": {"max_ngram": 4, "min_ngram": 1, "max_draft": 8, "max_branches": 3,
               "node_budget": 24, "semantic": "target_embed", "window": 8, "adaptive": True,
               "cost": "cpu"},
    "adapld_sem": {"max_ngram": 4, "min_ngram": 1, "max_draft": 8, "semantic": "target_embed",
                   "window": 8, "adaptive": True, "cost": "cpu"},
    "adapld_lex": {"max_ngram": 4, "min_ngram": 1, "max_draft": 8, "adaptive": True,
                   "cost": "cpu"},
    # checkpoint: a local folder or hub id ('' = the bundled drafter of the embedded target);
    # block_size 0 = the checkpoint's own
    "dflash": {"checkpoint": "", "block_size": 0, "draft_temperature": 0.0, "seed": 0},
}


def make_drafter(method: str, target=None, **params) -> Drafter:
    """Build a drafter by method name; ``params`` are the method's settings."""
    method = (method or "").strip().lower()
    factories = {"ar": ARDrafter, "pld": PLDDrafter, "adapld": AdaPLDDrafter}
    if method in ("adapld_lex", "adapld_sem"):  # AdaPLD ablation presets
        params = {"ablation": "lexical" if method == "adapld_lex" else "semantic", **params}
        method = "adapld"
    if method == "dflash":  # needs the target (its hidden size, embedding and LM head)
        try:
            return DFlashDrafter(target=target, **params)
        except TypeError as exc:
            raise SettingsError(f"bad settings for method 'dflash': {exc}") from exc
    if method in factories:
        try:
            return factories[method](**params)
        except TypeError as exc:
            raise SettingsError(f"bad settings for method '{method}': {exc}") from exc
    raise SettingsError(f"unknown method '{method}' (choose from: {', '.join(METHODS)})")


__all__ = ["ARDrafter", "Draft", "DraftContext", "Drafter", "VerifyFeedback", "PLDDrafter",
           "AdaPLDDrafter", "DFlashDrafter", "METHODS", "METHOD_PARAMS", "make_drafter"]
