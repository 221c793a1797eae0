"""The method registry: every decoding method by name, its drafter class and its settings.

A method is a drafter behind the one interface of :mod:`specviz.drafters.base` plus its
:class:`~specviz.drafters.registry.MethodSpec` (label, description, typed settings), declared
as ``SPECS`` next to the drafter class. The methods: plain decoding (AR), prompt lookup
(:mod:`.pld`), AdaPLD (:mod:`.adapld`, on the lookup pieces of :mod:`.lookup`), DFlash and its
variants DSpark and ReTrace (:mod:`.dflash`) and DFlash + AdaPLD (:mod:`.hybrid`).
"""
from __future__ import annotations

from . import adapld, dflash, hybrid, pld
from .base import ARDrafter, Drafter
from .registry import MethodSpec, lookup, registry

#: The one registry: every method in the order the CLI, the app and the docs list it. A drafter
#: module declares its ``SPECS`` (:class:`MethodSpec`, with its :class:`ParamSpec` settings)
#: next to its class, a method package exports them; adding a method is one entry here.
METHODS: dict[str, MethodSpec] = registry(
    MethodSpec("ar", ARDrafter, "AR", "Plain autoregressive decoding (no draft; the baseline)"),
    *pld.SPECS,
    *adapld.SPECS,      # AdaPLD and its ablations
    *dflash.SPECS,      # DFlash, DSpark, ReTrace
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


__all__ = ["METHODS", "make_drafter", "method_spec", "methods_of", "register"]
