"""What the code-editing dev set (:mod:`specviz.editset`) needs to know about an MBPP function
before it asks for an edit: cleaned text, the names it binds or uses, the tested function, its
parameters and locals, its indentation style and whether it has one-line blocks (all from
:mod:`ast`)."""
from __future__ import annotations

import ast
import builtins
import keyword
import re

RESERVED = set(dir(builtins)) | set(keyword.kwlist) | {"self", "cls", "_"}


def clean_code(code: str) -> str:
    """MBPP code with Unix line endings and no trailing whitespace or blank lines."""
    lines = code.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n")


def identifiers(tree: ast.AST) -> set[str]:
    """Every name the code binds or uses (names, arguments, functions, imports, attributes)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
    return out


def main_function(tree: ast.Module, test: str = "") -> ast.FunctionDef | None:
    """The function MBPP's first test calls, else the last top-level function."""
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    called = re.findall(r"([A-Za-z_]\w*)\s*\(", test)
    for name in called:
        for f in funcs:
            if f.name == name:
                return f
    return funcs[-1] if funcs else None


def local_names(fn: ast.FunctionDef) -> tuple[list[str], list[str]]:
    """(parameters, assigned local variables) of ``fn`` in order of appearance, without
    builtins, keywords, ``self`` / ``_`` and names of functions."""
    funcs = {n.name for n in ast.walk(fn) if isinstance(n, ast.FunctionDef)}
    args = fn.args
    params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    params += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    stores = [n.id for n in ast.walk(fn)
              if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    ok = lambda n: n not in RESERVED and n not in funcs  # noqa: E731
    params = [p for p in dict.fromkeys(params) if ok(p)]
    locals_ = [n for n in dict.fromkeys(stores) if ok(n) and n not in params]
    return params, locals_


def indent_unit(code: str) -> str:
    """The code's indentation style: "tabs", or the smallest space indent ("1", "2", "4", ...)."""
    widths = []
    for line in code.split("\n"):
        stripped = line.lstrip(" \t")
        if not stripped or stripped == line:
            continue
        if line[0] == "\t":
            return "tabs"
        widths.append(len(line) - len(stripped))
    return str(min(widths)) if widths else "0"


def has_one_liner(tree: ast.Module) -> bool:
    """Whether some block body (def / if / for / while / with) sits on its header's line."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.stmt) and isinstance(body, list) and body:
            if body[0].lineno == node.lineno:
                return True
    return False
