"""Every relative link in README.md and docs/*.md leads to a file that exists, and a link with
an anchor to a heading of that file (GitHub's heading ids), so that moving a page or renaming
a section cannot leave a dead link behind."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
#: [text](target) and ![alt](target), with an optional "title"
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", flags=re.M)


def prose(text: str) -> str:
    """``text`` without fenced code blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's id for a heading: markup dropped, lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The ids of ``path``'s headings; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: Counter[str] = Counter()
    ids = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        ids.add(base if not seen[base] else f"{base}-{seen[base]}")
        seen[base] += 1
    return ids


def links(path: Path) -> list[str]:
    return [target for target in LINK.findall(prose(path.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def test_the_pages_exist_and_have_links() -> None:
    assert (ROOT / "docs").is_dir() and len(PAGES) > 1
    assert links(ROOT / "README.md"), "README.md links to no page"


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    dead = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve() if file else page
        if not resolved.exists():
            dead.append(f"{target}: no file {resolved}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            dead.append(f"{target}: no heading with id {anchor!r} in {resolved.relative_to(ROOT)}")
    assert not dead, f"{page.relative_to(ROOT)} has dead links:\n" + "\n".join(dead)


def test_the_checker_sees_what_github_sees(tmp_path: Path) -> None:
    """The parsing above, on a page with a code block, a code span, a link in a table and
    headings with code and punctuation."""
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## Opening a trace: `tpubench trace`\n\n## Prices (`tpubench/analysis/prices.py`)\n\n"
        '## Title\n\n| a | [b](other.md#x) |\n\n```python\nrows[["a"]](1)\n```\n\n`[c](d)` and '
        '[e](https://example.com) and ![f](img.png "alt")\n'
    )
    assert links(page) == ["other.md#x", "img.png"]
    assert anchors(page) == {"title", "title-1", "opening-a-trace-tpubench-trace", "prices-tpubenchanalysispricespy"}
