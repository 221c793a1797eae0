"""The package's layering, read from the source: no import cycle among specviz modules, the core
(engine, trace, verification, models, costs, ...) imports nothing above it, no private name is
imported across modules, and ``import specviz`` changes no environment variable.

Every import counts: top-level, inside functions and under ``TYPE_CHECKING``; relative imports
are resolved. ``from P import x`` counts as importing ``P`` (running its ``__init__``) and, when
``P.x`` is a module, ``P.x`` as well -- so a submodule importing its own package's ``__init__``
while that ``__init__`` imports the submodule is a cycle.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specviz"

#: the core: what a decoding run needs; it may import only itself and the drafter interface
CORE = {f"specviz.{m}" for m in ("engine", "trace", "trace_schema", "verify", "tree", "kvcache",
                                 "errors", "models", "costs", "numerics", "kernels", "attention",
                                 "metrics", "trace_checks")}
CORE_MAY_IMPORT = CORE | {"specviz", "specviz.drafters.base"}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package by its own name)."""
    return {module_name(p, package.parent): p for p in sorted(package.rglob("*.py"))}


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that module ``name`` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            out.add(source)
            out.update(f"{source}.{a.name}" for a in node.names)
    return {m for m in out if m in modules and m != name}


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search, no recursion)."""
    state: dict[str, int] = {}          # 1 = on the current path, 2 = done
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def core_violations(graph: dict[str, set[str]]) -> list[str]:
    return [f"{m} imports {o}" for m in sorted(CORE & set(graph))
            for o in sorted(graph[m] - CORE_MAY_IMPORT)]


def private_imports(paths: list[Path]) -> list[str]:
    """``from x import _y`` anywhere in ``paths`` (dunder names such as __version__ are fine)."""
    out = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                source = "." * node.level + (node.module or "")
                out += [f"{p.relative_to(ROOT)}:{node.lineno}: from {source} import {a.name}"
                        for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def project_sources() -> list[Path]:
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "pages").rglob("*.py"), ROOT / "app.py",
             *(ROOT / "tests").rglob("*.py")]
    return sorted(p for p in files if p.exists())


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph(package_modules()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_core_imports_nothing_above_it():
    bad = core_violations(import_graph(package_modules()))
    assert not bad, "the core imports above itself:\n" + "\n".join(bad)


def test_no_private_name_is_imported_across_modules():
    bad = private_imports(project_sources())
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_importing_specviz_sets_no_environment_variable():
    code = ("import os; e = dict(os.environ); import specviz; "
            "assert dict(os.environ) == e, sorted(set(os.environ.items()) ^ set(e.items()))")
    # a bare environment: a variable the test process already holds (conftest sets some, and so
    # would an import of specviz in this process) must not hide one set on import
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_the_checks_see_a_cycle_and_a_layer_breach():
    """The checks themselves: a two-module cycle is found, a core module importing the
    analysis layer is reported."""
    graph = {"specviz.a": {"specviz.b"}, "specviz.b": {"specviz.a"}, "specviz.c": set()}
    assert find_cycle(graph) == ["specviz.a", "specviz.b", "specviz.a"]
    assert find_cycle({"specviz.a": {"specviz.b"}, "specviz.b": set()}) is None
    assert core_violations({"specviz.trace": {"specviz.analysis.lossless"}}) == \
        ["specviz.trace imports specviz.analysis.lossless"]
