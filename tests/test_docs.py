"""README and docs/: README stays short, and every relative link points at a file that exists
(and, for a link into a markdown file with #anchor, at a heading of that file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} +(.+?) *#*$", text, re.M)}


def _links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


def test_readme_is_at_most_300_lines():
    n = len((REPO / "README.md").read_text().splitlines())
    assert n <= 300, f"README.md has {n} lines; move detail to a page under docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_at_existing_files(page):
    broken = []
    for target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(REPO)})")
    assert not broken, f"{page.relative_to(REPO)}: broken links: " + "; ".join(broken)


def test_every_docs_page_is_linked_from_readme():
    linked = {(REPO / t.partition("#")[0]).resolve() for t in _links(REPO / "README.md")}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"docs pages README does not link: {missing}"
