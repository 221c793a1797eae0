"""The repository reads as a product, not as a record of how it was built: no tracked text file
talks about work sessions ("the last session", "session 12"), tracker issues ("issue 10",
"issues #3"), a "continuation" of the work, or sections of a specification that is not in the
repository ("METHODS §2"). Dates and plain words say the same: "measured on 2026-12-05", "the
drafter bundled before", "the DFlash goals".

Checked: every file ``git ls-files`` lists (tracked, or new and not ignored) under README.md, docs/, specviz/, pages/, app.py,
scripts/, recipes/, experiments/, tests/ and .ci/ that is text (UTF-8, no NUL byte), and the
*.md, *.json and *.csv files under results/. This file is left out (it has to spell the words).
Each hit is printed as ``path:line: text``."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve()

#: where the rule applies (``git ls-files`` pathspecs) ...
TRACKED = ["README.md", "docs", "specviz", "pages", "app.py", "scripts", "recipes",
           "experiments", "tests", ".ci"]
#: ... and under results/, only the files people read
RESULTS_SUFFIXES = (".md", ".json", ".csv")

ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
            "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|"
            "twentieth")
#: the words about how the project was built, each with the reason it is refused
PATTERNS = {
    "a work session": re.compile(
        rf"\b(?:{ORDINALS}|this|last|previous|next|earlier|later|same|a later)\s+sessions?\b",
        re.IGNORECASE),
    "a numbered session": re.compile(r"\bsessions?\s+#?\d+", re.IGNORECASE),
    "a tracker issue": re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE),
    # "continuation" alone is a product word (the tokens a lookup copies after its match); the
    # work's continuations come counted or numbered
    "a continuation of the work": re.compile(
        rf"\b(?:{ORDINALS}|this|last|previous|next|earlier|later|each|every)\s+continuations?\b"
        r"|\bcontinuations?\s+#?\d+", re.IGNORECASE),
    "a section of a specification outside the repository": re.compile(r"METHODS\s*§",
                                                                      re.IGNORECASE),
}


@pytest.fixture(autouse=True)
def _fresh_adapld_experience():
    """Overrides conftest's: these tests read files only, so they import no part of specviz."""
    yield


def tracked_files() -> list[Path]:
    """Every checked file, from ``git ls-files``: tracked, or new and not ignored (so a page not
    yet committed is checked too, and build outputs and ignored runs are left out)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                              "--", *TRACKED, "results"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:  # not a git checkout
        pytest.skip(f"git ls-files failed: {exc}")
    files = []
    for name in out.decode("utf-8", "surrogateescape").split("\0"):
        if not name:
            continue
        path = ROOT / name
        if path.resolve() == SELF or not path.is_file():
            continue
        if name.startswith("results/") and not name.endswith(RESULTS_SUFFIXES):
            continue
        files.append(path)
    return files


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file (a NUL byte, or not UTF-8)."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def hits(text: str) -> list[tuple[int, str, str]]:
    """(line number, the reason, the line) for every line that uses one of the words."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        for reason, pattern in PATTERNS.items():
            if pattern.search(line):
                out.append((number, reason, line.strip()))
                break
    return out


@pytest.mark.parametrize("line, expected", [
    ("as measured in the ninth session", "a work session"),
    ("the last session's bench", "a work session"),
    ("Earlier sessions' benches ran on AMD", "a work session"),
    ("left for a later session", "a work session"),
    ("see session 12", "a numbered session"),
    ("(issue 10, item 3)", "a tracker issue"),
    ("Issues 10, 11 and 14", "a tracker issue"),
    ("fixes issue #4", "a tracker issue"),
    ("each continuation of the drafter", "a continuation of the work"),
    ("(fifth continuation)", "a continuation of the work"),
    ("see continuation 3", "a continuation of the work"),
    ("specs in METHODS §2", "a section of a specification outside the repository"),
])
def test_the_words_are_found(line, expected):
    assert [reason for _, reason, _ in hits(line)] == [expected]


@pytest.mark.parametrize("line", [
    "Each browser tab keeps its own Session and KV cache",
    "Session(target, drafter, prompt).step() runs one round",
    "measured on 2026-12-05, the drafter bundled before",
    "the same prompts, one run; a tissue of lies 10 times",
    "the copied continuation after the matched n-gram",
    "a span's continuation is drafted",
])
def test_product_words_pass(line):
    assert hits(line) == []


def test_no_words_about_how_the_project_was_built():
    found = []
    for path in tracked_files():
        text = text_of(path)
        if text is None:
            continue
        rel = path.relative_to(ROOT).as_posix()
        found += [f"{rel}:{number}: {line}  [{reason}]" for number, reason, line in hits(text)]
    assert not found, (f"{len(found)} line(s) talk about how the project was built; say it in "
                       "product words (dates, 'the drafter bundled before', 'the DFlash "
                       "goals'):\n" + "\n".join(found))
