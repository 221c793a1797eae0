"""The method registry's vocabulary: one :class:`ParamSpec` per setting, one :class:`MethodSpec`
per method.

A ``ParamSpec`` holds everything known about one setting — type, default, range or choices, the
label the app shows and a one-line help — and :meth:`ParamSpec.check` validates a value once for
every caller: the drafter's ``__init__``, ``make_drafter``, the CLI's ``--param``, the bench and
the app sidebar. Errors are :class:`~specviz.errors.SettingsError` in the UI's words (the label,
not the Python name): ``"Draft length must be a whole number from 1 to 128, got 0"``.

A ``MethodSpec`` is one method: name, factory (a drafter class, or the same class with preset
arguments, as the AdaPLD ablations are), display name, one-line description, kind (model-free /
learned), whether the factory needs the target model, its settings and an optional sidebar hint.
Each drafter module declares its own ``SPECS`` next to its class; :mod:`specviz.drafters` lists
them in ``METHODS``, the one registry.
"""
from __future__ import annotations

import inspect
import math
import numbers
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from ..errors import SettingsError

KINDS = ("model-free", "learned")
BOOL_WORDS = {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False}


# ---------------------------------------------------------------------------- one setting
@dataclass(frozen=True)
class ParamSpec:
    """One method setting. ``range`` is inclusive ``(lo, hi)`` for int/float settings, ``choices``
    lists the allowed strings; ``advanced`` settings are set from code or ``--param`` only (no
    sidebar widget). A ``None`` value means "unset": :meth:`check` returns the default (a
    ``None`` default means the drafter derives the value from other settings)."""

    name: str
    type: type
    default: Any
    range: tuple[float, float] | None = None
    choices: tuple[str, ...] | None = None
    label: str = ""
    help: str = ""
    advanced: bool = False

    @property
    def kind(self) -> str:
        """``"int"``, ``"float"``, ``"bool"`` or ``"str"`` (what widget the sidebar draws)."""
        return self.type.__name__

    def check(self, value: Any) -> Any:
        """``value`` as this setting's type (``"3"`` -> 3; 3.5 is not a whole number), or a
        :class:`SettingsError` naming the label."""
        if value is None:
            return self.default
        return _CHECKS[self.type](self, value)

    def within(self, lo: float, hi: float) -> "ParamSpec":
        """The same setting with a narrower range (for checks that depend on another setting)."""
        return replace(self, range=(lo, hi))

    def expected(self) -> str:
        """What a valid value looks like, in words: ``"a whole number from 1 to 128"``."""
        if self.type is bool:
            return "true or false"
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.type is str:
            return "text"
        noun = "a whole number" if self.type is int else "a number"
        if self.range is None:
            return noun
        return f"{noun} from {_num(self.range[0])} to {_num(self.range[1])}"

    def error(self, value: Any) -> SettingsError:
        """The error for a rejected ``value``."""
        return SettingsError(f"{self.label or self.name} must be {self.expected()}, got {value!r}")


def _num(x: float) -> str:
    """A bound for people: 128, 0.5 (no trailing .0, no exponent)."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _number(value: Any) -> float | int | None:
    """A real number from a number or its text; None for anything else (bools, NaN, words)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        for parse in (int, float):
            try:
                value = parse(text)
                break
            except ValueError:
                continue
        else:
            return None
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        return None
    return value


def _in_range(spec: ParamSpec, v: float) -> bool:
    return spec.range is None or spec.range[0] <= v <= spec.range[1]


def _check_int(spec: ParamSpec, value: Any) -> int:
    v = _number(value)
    if v is None or v != int(v) or not _in_range(spec, v):
        raise spec.error(value)
    return int(v)


def _check_float(spec: ParamSpec, value: Any) -> float:
    v = _number(value)
    if v is None or not _in_range(spec, v):
        raise spec.error(value)
    return float(v)


def _check_bool(spec: ParamSpec, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in BOOL_WORDS:
        return BOOL_WORDS[value.strip().lower()]
    raise spec.error(value)


def _check_str(spec: ParamSpec, value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise spec.error(value)
    text = str(value) if not spec.choices else str(value).strip().lower()
    if spec.choices and text not in spec.choices:
        raise spec.error(value)
    return text


_CHECKS: dict[type, Callable[[ParamSpec, Any], Any]] = {
    int: _check_int, float: _check_float, bool: _check_bool, str: _check_str}


def params_by_name(*specs: ParamSpec) -> dict[str, ParamSpec]:
    """``{spec.name: spec}`` in declaration order (a drafter module's ``PARAMS``)."""
    return {s.name: s for s in specs}


# ---------------------------------------------------------------------------- one method
@dataclass(frozen=True)
class MethodSpec:
    """One method: what builds it and what it can be told. ``preset`` are fixed keyword
    arguments of the factory (an ablation); ``hint`` is a markdown line the sidebar shows under
    the method's settings (e.g. the page that explains its drafts)."""

    name: str
    factory: Callable[..., Any]
    display: str
    description: str
    kind: str = "model-free"
    needs_target: bool = False
    params: tuple[ParamSpec, ...] = ()
    preset: Mapping[str, Any] = field(default_factory=dict)
    hint: str = ""

    def param(self, name: str) -> ParamSpec | None:
        """The setting called ``name``, or None."""
        return next((p for p in self.params if p.name == name), None)

    @property
    def param_names(self) -> list[str]:
        return [p.name for p in self.params]

    def sidebar_params(self) -> list[ParamSpec]:
        """The settings the app draws widgets for (all but the advanced ones)."""
        return [p for p in self.params if not p.advanced]

    def unknown(self, key: str, where: str) -> SettingsError:
        """The error for a setting this method does not have, listing the valid ones."""
        valid = f"valid: {', '.join(self.param_names)}" if self.params else "it has no settings"
        return SettingsError(f"{where}unknown setting '{key}' for method '{self.name}' ({valid})")

    def check(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Typed, validated ``params``. A key that is no setting is kept only if the factory
        takes it as a keyword (library-only arguments such as a loaded ``model=``)."""
        out = {}
        for key, value in params.items():
            spec = self.param(key)
            if spec is not None:
                out[key] = spec.check(value)
            elif key in _keywords(self.factory) and key not in self.preset:
                out[key] = value
            else:
                raise self.unknown(key, "bad settings: ")
        return out

    def parse(self, pairs: list[str] | None) -> dict[str, Any]:
        """CLI ``--param key=value`` pairs, each typed by its :class:`ParamSpec`."""
        out = {}
        for pair in pairs or []:
            key, eq, text = str(pair).partition("=")
            if not eq:
                raise SettingsError(f"--param expects key=value, got '{pair}'")
            spec = self.param(key.strip())
            if spec is None:
                raise self.unknown(key.strip(), "--param: ")
            out[spec.name] = spec.check(text.strip())
        return out

    def build(self, target: Any = None, **params: Any) -> Any:
        """The drafter, from validated settings (plus the target when the method needs it)."""
        kwargs = {**self.preset, **self.check(params)}
        if self.needs_target:
            kwargs["target"] = target
        try:
            return self.factory(**kwargs)
        except TypeError as exc:
            raise SettingsError(f"bad settings for method '{self.name}': {exc}") from exc


def _keywords(factory: Callable[..., Any]) -> set[str]:
    """Keyword arguments ``factory`` accepts (its signature; classes: their ``__init__``)."""
    try:
        prms = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in prms if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


# ---------------------------------------------------------------------------- the registry
def registry(*specs: MethodSpec) -> dict[str, MethodSpec]:
    """``{name: spec}`` in the given order; names must be unique and kinds known."""
    out: dict[str, MethodSpec] = {}
    for spec in specs:
        if spec.name in out:
            raise ValueError(f"method '{spec.name}' is registered twice")
        if spec.kind not in KINDS:
            raise ValueError(f"method '{spec.name}': kind must be one of {', '.join(KINDS)}")
        out[spec.name] = spec
    return out


def lookup(methods: Mapping[str, MethodSpec], name: str) -> MethodSpec:
    """The spec of method ``name`` (case and spaces ignored), or a SettingsError listing all.

    ``METHOD@LABEL`` (e.g. ``dflash@new``) is the same method under another name, so one bench
    can run it twice with different settings (``--params '{"dflash@new": {...}}'``)."""
    key = str(name or "").strip().lower()
    base, at, label = key.partition("@")
    if at and not label.strip():
        raise SettingsError(f"'{key}': a method label after '@' cannot be empty "
                            "(e.g. dflash@new)")
    if base not in methods:
        raise SettingsError(f"unknown method '{base}' (choose from: {', '.join(methods)})")
    return methods[base]


__all__ = ["KINDS", "MethodSpec", "ParamSpec", "lookup", "params_by_name", "registry"]
