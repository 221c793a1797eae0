"""The README and the measured-results pages in docs/ link to each other by file and heading
anchor (GitHub's rule: lower case, punctuation dropped, spaces -> hyphens); every such link must
land on a file and heading that exist, and every docs page must be reachable from the README."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out, fence = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#{1,6} ", line):
            out.add(slug(line.lstrip("#")))
    return out


def pages() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def test_slug_follows_githubs_rule():
    assert slug("DFlash + AdaPLD: a learned block (issue 10, eighth session)") == \
        "dflash--adapld-a-learned-block-issue-10-eighth-session"
    assert slug("More passes over the same data: 2,000 steps") == \
        "more-passes-over-the-same-data-2000-steps"


def test_every_local_link_lands_on_a_file_and_heading():
    broken = []
    for page in pages():
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in pages()[1:] if f"docs/{p.name}" not in readme]
    assert not missing, missing
