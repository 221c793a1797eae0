"""Drafting strategies behind one interface (see :mod:`specviz.drafters.base`)."""
from __future__ import annotations

from . import adapld, dflash, dspark, hybrid, pld, retrace
from .adapld import AdaPLDDrafter
from .base import ARDrafter, Draft, DraftContext, Drafter, VerifyFeedback
from .dflash import DFlashDrafter
from .dspark import DSparkDrafter
from .hybrid import HybridDrafter
from .pld import PLDDrafter
from .retrace import ReTraceDrafter
from .registry import MethodSpec, ParamSpec, lookup, registry

#: The one registry: every method in the order the CLI, the app and the docs list it. A drafter
#: module declares its ``SPECS`` (:class:`MethodSpec`, with its :class:`ParamSpec` settings)
#: next to its class; adding a method is one entry here.
METHODS: dict[str, MethodSpec] = registry(
    MethodSpec("ar", ARDrafter, "AR", "Plain autoregressive decoding (no draft; the baseline)"),
    *pld.SPECS,
    *adapld.SPECS,
    *dflash.SPECS,
    *dspark.SPECS,
    *retrace.SPECS,
    *hybrid.SPECS,
)


def method_spec(method: str) -> MethodSpec:
    """The registry entry of ``method``; an unknown name raises a SettingsError listing all."""
    return lookup(METHODS, method)


def register(spec: MethodSpec) -> MethodSpec:
    """Add (or replace) a method at run time, e.g. a drafter defined outside this package."""
    METHODS[spec.name] = spec
    return spec


def make_drafter(method: str, target=None, **params) -> Drafter:
    """Build a drafter by method name; ``params`` are the method's settings (validated and typed
    by their ParamSpecs; ``target`` is passed to methods that need it)."""
    return method_spec(method).build(target, **params)


def methods_of(factory) -> tuple[str, ...]:
    """The registered methods built by ``factory`` (e.g. AdaPLD and its ablations)."""
    return tuple(name for name, spec in METHODS.items() if spec.factory is factory)


__all__ = ["ARDrafter", "Draft", "DraftContext", "Drafter", "VerifyFeedback", "PLDDrafter",
           "AdaPLDDrafter", "DFlashDrafter", "DSparkDrafter", "ReTraceDrafter", "HybridDrafter", "METHODS", "MethodSpec", "ParamSpec", "make_drafter",
           "method_spec", "methods_of", "register"]
