"""The README is the course's front page and docs/ holds the rest (issue 40).

* README.md is at most 12,000 characters: what the course is, how to open and test it,
  the notebook table, where it runs, links to docs/;
* every page of docs/ links back to the README, and the README links every page;
* every relative link in README.md and docs/*.md points to a file that exists and, for a
  ``#fragment`` into a Markdown file, to one of its headings (GitHub's anchors).
"""
import re
from pathlib import Path

import pytest

from course_utils.course.badges import ROOT

README_LIMIT = 12_000
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(([^()\s]+)\)")  # [text](target), [![img](src)](target)
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.MULTILINE)


def _prose(text: str) -> str:
    """``text`` without its code blocks and code spans (a ``](`` there is not a link)."""
    return CODE.sub("", FENCE.sub("", text))


def _anchors(path: Path):
    """The anchors GitHub gives the headings of ``path``: lower case, punctuation dropped,
    spaces as hyphens, ``-1``, ``-2`` ... after a repeated one."""
    seen: dict[str, int] = {}
    for title in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        yield slug if n == 0 else f"{slug}-{n}"


def _links(path: Path) -> list[str]:
    return LINK.findall(_prose(path.read_text(encoding="utf-8")))


def test_the_readme_is_at_most_12000_characters():
    n = len((ROOT / "README.md").read_text(encoding="utf-8"))
    assert n <= README_LIMIT, f"README.md has {n} characters, over {README_LIMIT}: move the detail to docs/"


def test_every_docs_page_links_back_to_the_readme_and_the_readme_links_every_page():
    assert DOCS, "docs/ has no page"
    readme_links = set(_links(ROOT / "README.md"))
    for page in DOCS:
        head = "\n".join(page.read_text(encoding="utf-8").splitlines()[:5])
        assert page.read_text(encoding="utf-8").startswith("# "), f"{page.name}: starts with its title"
        assert "](../README.md)" in head, f"{page.name}: its first lines link back to ../README.md"
        assert f"docs/{page.name}" in readme_links, f"README.md does not link docs/{page.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_an_existing_file(page):
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:|^//", target):  # https:, mailto:, ...: not ours to check
            continue
        file_part, _, fragment = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target} (no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif fragment and dest.suffix == ".md" and fragment not in set(_anchors(dest)):
            broken.append(f"{target} (no heading #{fragment} in {dest.name})")
    assert broken == [], f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_the_link_checker_sees_links_and_anchors():
    page = ROOT / "docs" / "testing.md"
    assert "../README.md" in _links(page)
    assert "the-printed-numbers-are-the-same-on-every-machine" in set(_anchors(page))
    assert "course_utils-by-role" in set(_anchors(ROOT / "docs" / "maintaining.md"))
    assert LINK.findall(_prose("see `[a](b)` and\n```\n[c](d)\n```\n[e](f)")) == ["f"]
