"""A code-editing dev set built from MBPP: prompts that give a Python function and ask
for an edited version of it.

Editing is where prompt lookup pays most (the AdaPLD paper's headline): the reply repeats long
spans of the prompt's code with a few changes, so a drafter that keeps copying from the right
place can draft far past 10 tokens. Each MBPP row becomes one prompt of one edit kind (the kinds
follow the task ids in a seeded cyclic order, so every kind appears in any slice of six or more
consecutive rows; a kind the code does not allow falls through to the next one):

- ``rename_function``  — rename the tested function (snake_case fixed, camelCase, prefixed, ...);
- ``rename_variable``  — rename a parameter or local variable picked with :mod:`ast`;
- ``add_docstring``    — document a function (sometimes with the MBPP task text as its content);
- ``add_comments``     — comment the returns / loops / each step;
- ``add_type_hints``   — annotate parameters and return values;
- ``reformat``         — tabs to spaces, 4 <-> 2-space indentation, expand one-liners, PEP 8.

Instruction wording (several templates per kind), new names and the prompt layout (instruction
before / after, fenced or not, with or without a closing request) are drawn from a RNG seeded by
(seed, task id, kind), and the kind by (seed, task id): a row's prompt does not depend on the
slice it was loaded in, and consecutive rows cycle through the kinds. The data is
read from its file (``../shared/data/mbpp.jsonl``), never copied into the repository; ``start``
and ``limit`` pick disjoint slices for dev and held-out sets.

Bench hook: ``--data edit:PATH[:LIMIT[:START]]`` -> :func:`load_edit_spec`; ``python -m
specviz.editset PATH --limit N > edit.jsonl`` writes the same prompts as ``{"id", "category",
"prompt"}`` rows. What is read off the code (names, the tested function, indentation):
:mod:`specviz.editset_code`.
"""
from __future__ import annotations

import ast
import json
import random
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .bench import PromptItem
from .editset_code import (RESERVED, clean_code, has_one_liner, identifiers, indent_unit,
                           local_names, main_function)
from .errors import SpecvizError

CATEGORY = "code_edit"
KINDS = ("rename_function", "rename_variable", "add_docstring", "add_comments",
         "add_type_hints", "reformat")
VAR_WORDS = ("value", "total", "items", "count", "index", "result", "current", "values",
             "number", "text", "data", "acc", "limit", "pos", "seq", "elem", "size", "answer")

TEMPLATES = {
    "rename_function": (
        "Rename the function `{old}` to `{new}`.",
        "Change the name of {old} to {new}, and update every place where it is called.",
        "Please rename `{old}()` to `{new}()` and keep everything else exactly the same.",
        "Refactor: the function {old} should be called {new}.",
        "I'd like the function name `{new}` instead of `{old}`. Rewrite the code accordingly.",
    ),
    "rename_variable": (
        "Rename the variable `{old}` to `{new}` everywhere in {fn}.",
        "The name `{old}` is not descriptive; rename it to `{new}` throughout the code.",
        "Replace the identifier {old} with {new} (only that identifier, nothing else).",
        "In `{fn}`, change every use of `{old}` to `{new}`.",
    ),
    "rename_parameter": (
        "Rename the parameter `{old}` of `{fn}` to `{new}`.",
        "Change the argument name {old} to {new} in {fn}, including its uses in the body.",
        "`{fn}` takes an argument called `{old}`; call it `{new}` instead.",
    ),
    "add_docstring": (
        "Add a docstring to `{fn}` describing what it does, its arguments and its return value.",
        "Document the function {fn} with a Google-style docstring.",
        "Write a one-line docstring for every function in this code.",
        "Add a docstring to `{fn}` that says: \"{task}\"",
    ),
    "add_comments": (
        "Add a comment next to each return statement explaining what is returned.",
        "Add a short comment above every line of `{fn}` that is not obvious.",
        "Comment the code: explain each loop and condition in one line.",
        "Add explanatory comments to {fn}, but do not change any code.",
    ),
    "add_type_hints": (
        "Add type hints to the parameters and the return value of `{fn}`.",
        "Annotate every function with Python type hints (import from typing if needed).",
        "Make `{fn}` fully typed: annotate its arguments and its return type.",
        "Add PEP 484 type annotations to this code without changing its behaviour.",
    ),
}
REFORMATS = {
    "tabs": ("Replace the tab indentation with 4 spaces.",
             "Convert the tabs in this code to four spaces per indentation level."),
    "to2": ("Reindent the code with 2 spaces per level instead of 4.",
            "Change the indentation to two spaces."),
    "to4": ("Reindent the code with 4 spaces per level (PEP 8).",
            "Use four spaces for every indentation level."),
    "expand": ("Expand every one-line block (e.g. `if x: return y`) onto separate lines.",
               "Rewrite the code so that no block body sits on the same line as its header."),
    "pep8": ("Format this code according to PEP 8: spaces after commas and around operators.",
             "Clean up the formatting (PEP 8 style) without changing what the code does."),
}
LAYOUTS = (
    "{instruction}\n\n```python\n{code}\n```{close}",
    "```python\n{code}\n```\n\n{instruction}{close}",
    "Here is a Python function:\n\n{code}\n\n{instruction}{close}",
    "{instruction}\n\n{code}{close}",
    "Edit the following code. {instruction}\n\n```python\n{code}\n```{close}",
)
CLOSINGS = ("", "", "\n\nReturn the complete edited code.", "\n\nReply with the code only.",
            "\n\nShow the whole updated program.")


@dataclass
class Edit:
    """One edit request: its kind, the instruction text and what it names (old/new, fn)."""

    kind: str
    instruction: str
    detail: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------- new names
def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head.lower() + "".join(w[:1].upper() + w[1:].lower() for w in rest if w)


def function_name_options(old: str) -> list[str]:
    """Plausible new names for a function: snake_case fixed, camelCase, prefixed, suffixed."""
    base = old.lower().strip("_") or "func"
    opts = [base if base != old else "", _camel(old) if "_" in old.strip("_") else ""]
    opts += [f"{p}_{base}" for p in ("compute", "get", "calc", "find")]
    opts += [f"{base}_{s}" for s in ("impl", "v2", "helper", "fn")]
    return [o for o in opts if o and o != old]


def variable_name_options(old: str) -> list[str]:
    """Plausible new names for a variable: a descriptive word, or the old name extended."""
    base = old.strip("_") or "var"
    return [w for w in VAR_WORDS if w != old] + [f"{base}_value", f"new_{base}", f"{base}_list"]


def fresh_name(options: list[str], taken: set[str], rng: random.Random) -> str | None:
    """A seeded pick among ``options`` that collides with no identifier or reserved word."""
    free = [o for o in options if o not in taken and o not in RESERVED and o.isidentifier()]
    return rng.choice(free) if free else None


# ---------------------------------------------------------------------------- edits per kind
def _fill(kind: str, rng: random.Random, **names) -> str:
    return rng.choice(TEMPLATES[kind]).format(**names)


def rename_function(tree, fn, rng, task: str) -> Edit | None:
    """Rename ``fn`` (not when a variable shares its name: the edit would be ambiguous)."""
    if fn.name in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                   and isinstance(n.ctx, ast.Store)}:
        return None
    new = fresh_name(function_name_options(fn.name), identifiers(tree), rng)
    if new is None:
        return None
    detail = {"old": fn.name, "new": new, "fn": fn.name}
    return Edit("rename_function", _fill("rename_function", rng, **detail), detail)


def rename_variable(tree, fn, rng, task: str) -> Edit | None:
    """Rename a parameter or local variable of ``fn`` (the parameter wording half the time)."""
    params, locals_ = local_names(fn)
    if not params and not locals_:
        return None
    old = rng.choice(params + locals_)
    new = fresh_name(variable_name_options(old), identifiers(tree), rng)
    if new is None:
        return None
    detail = {"old": old, "new": new, "fn": fn.name, "parameter": old in params}
    tmpl = "rename_parameter" if old in params and rng.random() < 0.5 else "rename_variable"
    return Edit("rename_variable", _fill(tmpl, rng, **detail), detail)


def _task_sentence(task: str) -> str:
    """The MBPP task as a docstring sentence ("Write a function to find x." -> "Find x.")."""
    s = re.sub(r"^write an? (python )?function (to|that) ", "", task.strip(), flags=re.I)
    s = s.replace('"', "'").rstrip(".") + "."
    return s[:1].upper() + s[1:]


def simple_edit(kind: str):
    """An edit whose instruction only names the function (docstrings, comments, type hints)."""
    def make(tree, fn, rng, task: str) -> Edit:
        """Fill one of the kind's templates with the function name (and the MBPP task)."""
        detail = {"fn": fn.name, "task": _task_sentence(task)}
        return Edit(kind, _fill(kind, rng, **detail), {"fn": fn.name})
    return make


def reformat(tree, fn, rng, task: str, code: str = "") -> Edit:
    """Pick a reformatting the code actually needs (tabs, indent width, one-liners), else PEP 8."""
    unit = indent_unit(code)
    styles = {"tabs": ["tabs"], "4": ["to2"], "0": []}.get(unit, ["to4"])
    if has_one_liner(tree):
        styles.append("expand")
    style = rng.choice(styles) if styles and rng.random() >= 0.2 else "pep8"
    return Edit("reformat", rng.choice(REFORMATS[style]), {"fn": fn.name, "style": style})


MAKERS = {"rename_function": rename_function, "rename_variable": rename_variable,
          "add_docstring": simple_edit("add_docstring"),
          "add_comments": simple_edit("add_comments"),
          "add_type_hints": simple_edit("add_type_hints")}


def make_edit(code: str, kind: str, rng: random.Random, task: str = "",
              test: str = "") -> Edit | None:
    """An edit of ``kind`` for ``code`` (None when the code does not allow it)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    fn = main_function(tree, test)
    if fn is None:
        return None
    if kind == "reformat":
        return reformat(tree, fn, rng, task, code)
    return MAKERS[kind](tree, fn, rng, task)


def render_prompt(code: str, edit: Edit, rng: random.Random) -> str:
    """Put the code and the instruction together in one of several layouts."""
    return rng.choice(LAYOUTS).format(instruction=edit.instruction, code=code,
                                      close=rng.choice(CLOSINGS))


# ---------------------------------------------------------------------------- the dev set
@dataclass
class EditPrompt:
    """One dev-set prompt with what it asks for (tests and reports use ``edit``)."""

    item: PromptItem
    edit: Edit
    code: str
    task_id: int


def read_rows(path: str | Path, start: int = 0) -> list[dict]:
    """The MBPP rows of a JSONL file from row ``start`` on (0-based, in file order)."""
    path = Path(path)
    if not path.exists():
        raise SpecvizError(f"MBPP file {path} does not exist")
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SpecvizError(f"{path}:{i + 1} is not valid JSON ({exc.msg})") from exc
    if any(not isinstance(r, dict) or "code" not in r for r in rows):
        raise SpecvizError(f"{path} is not MBPP (every row needs a 'code' field)")
    return rows[start:]


def kinds_for(task_id: int, seed: int) -> list[str]:
    """The kinds to try for a task, in order: a seeded cyclic order of KINDS starting at the
    task's turn (so consecutive task ids get different kinds)."""
    order = list(KINDS)
    random.Random(f"editset-order-{seed}").shuffle(order)
    turn = task_id % len(order)
    return order[turn:] + order[:turn]


def edit_prompt(row: dict, index: int, seed: int, source: str = "") -> EditPrompt | None:
    """The dev-set prompt for one MBPP row (None when no edit kind applies to its code)."""
    code = clean_code(str(row["code"]))
    task_id = int(row.get("task_id", index))
    test = str((row.get("test_list") or [""])[0])
    for kind in kinds_for(task_id, seed):
        rng = random.Random(f"editset-{seed}-{task_id}-{kind}")
        edit = make_edit(code, kind, rng, str(row.get("text", "")), test)
        if edit is not None:
            item = PromptItem(f"edit-{task_id}-{kind}", CATEGORY,
                              render_prompt(code, edit, rng), source)
            return EditPrompt(item, edit, code, task_id)
    return None


def build_edit_set(path: str | Path, limit: int | None = None, seed: int = 0,
                   start: int = 0) -> list[EditPrompt]:
    """Up to ``limit`` edit prompts from the MBPP rows from ``start`` on (rows whose code allows
    no edit are skipped); deterministic for a seed."""
    if limit is not None and limit <= 0:
        raise SpecvizError("the edit set limit must be at least 1")
    if start < 0:
        raise SpecvizError("the edit set start must be >= 0")
    out: list[EditPrompt] = []
    for i, row in enumerate(read_rows(path, start), start):
        if limit is not None and len(out) >= limit:
            break
        ep = edit_prompt(row, i, seed, Path(path).name)
        if ep is not None:
            out.append(ep)
    if not out:
        raise SpecvizError(f"no edit prompts could be built from {path}")
    return out


def load_edit_prompts(path: str | Path, limit: int | None = None, seed: int = 0,
                      start: int = 0) -> list[PromptItem]:
    """The code-editing dev set as bench prompts (category ``code_edit``)."""
    return [ep.item for ep in build_edit_set(path, limit, seed, start)]


def parse_edit_spec(spec: str) -> tuple[str, int | None, int]:
    """``edit:PATH[:LIMIT[:START]]`` -> (path, limit, start)."""
    if not spec.startswith("edit:"):
        raise SpecvizError(f"an edit set spec starts with 'edit:', got {spec!r}")
    parts = spec[len("edit:"):].split(":")
    nums: list[int] = []
    while len(parts) > 1 and len(nums) < 2 and parts[-1].strip().isdigit():
        nums.insert(0, int(parts.pop()))
    path = ":".join(parts)
    if not path:
        raise SpecvizError(f"the edit set spec {spec!r} names no file")
    return path, (nums[0] if nums else None), (nums[1] if len(nums) > 1 else 0)


def load_edit_spec(spec: str, seed: int = 0) -> list[PromptItem]:
    """The bench hook: ``--data edit:../shared/data/mbpp.jsonl:30`` (first 30 rows' prompts),
    ``edit:...:30:500`` (30 prompts from row 500 on)."""
    path, limit, start = parse_edit_spec(spec)
    return load_edit_prompts(path, limit, seed, start)


def main(argv: list[str] | None = None) -> int:
    """Write the dev set as ``{"id", "category", "prompt", "kind"}`` JSONL on stdout."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m specviz.editset", description=main.__doc__)
    ap.add_argument("path", help="MBPP jsonl, e.g. ../shared/data/mbpp.jsonl")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        eps = build_edit_set(args.path, args.limit, args.seed, args.start)
    except SpecvizError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for ep in eps:
        print(json.dumps({"id": ep.item.id, "category": ep.item.category,
                          "prompt": ep.item.text, "kind": ep.edit.kind}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
