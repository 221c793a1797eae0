"""The README and the pages under docs/ (docs/methods/, docs/results-log/ included) link to each
other by file and heading anchor (GitHub's rule: lower case, punctuation dropped, spaces ->
hyphens, a repeated heading gets -1, -2, ...); every such link must land on a file and heading
that exist, every docs page must be linked from the README, and every page opens with a title
and a sentence that says what it is for."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.fixture(autouse=True)
def _fresh_adapld_experience():
    """Overrides conftest's: these tests read files only, so they import no part of specviz."""
    yield


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out, seen, fence = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#{1,6} ", line):
            base = slug(line.lstrip("#"))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    """The link targets of a page, outside code (fenced blocks and `inline code` link nothing)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return LINK.findall(text)


def docs_pages() -> list[Path]:
    """Every markdown page under docs/, sub-folders included."""
    return sorted(DOCS.rglob("*.md"))


def pages() -> list[Path]:
    return [ROOT / "README.md"] + docs_pages()


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def test_slug_follows_githubs_rule():
    assert slug("DFlash + AdaPLD: a learned block (2026-12-05)") == \
        "dflash--adapld-a-learned-block-2026-12-05"
    assert slug("More passes over the same data: 2,000 steps") == \
        "more-passes-over-the-same-data-2000-steps"


def test_repeated_headings_get_numbered_anchors(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Title\n\n## Bench\n\n```\n## not a heading\n```\n\n## Bench\n",
                    encoding="utf-8")
    assert anchors(page) == {"title", "bench", "bench-1"}


def test_links_inside_code_are_not_links(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# T\n\nsee `P[n, j](a)` and [z](z.md)\n\n```\n[x](y.md)\n```\n",
                    encoding="utf-8")
    assert links(page) == ["z.md"]


def test_every_local_link_lands_on_a_file_and_heading():
    broken = []
    for page in pages():
        for target in links(page):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{name(page)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{name(page)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")
              if not re.match(r"[a-z]+:", t) and t.partition("#")[0]}
    missing = [name(p) for p in docs_pages() if p.resolve() not in linked]
    assert not missing, missing


def test_every_page_opens_with_what_it_is_for():
    """A title, then a paragraph (not a list, table, heading or code) before anything else."""
    bad = []
    for page in pages():
        lines = [ln for ln in page.read_text(encoding="utf-8").splitlines() if ln.strip()]
        if len(lines) < 2 or not lines[0].startswith("# "):
            bad.append(f"{name(page)}: no '# title' line first")
            continue
        first = lines[1].lstrip()
        if first.startswith(("#", "- ", "* ", "|", "```", ">", "<!--", "![")) or \
                re.match(r"\d+\.", first) or len(first.split()) < 6:
            bad.append(f"{name(page)}: the title is not followed by a sentence: {lines[1]!r}")
    assert not bad, "\n".join(bad)
