"""GIVEN the README and the pages of docs/ WHEN a reader opens them THEN the README stays short and
readable, its table of contents and every relative link (file and #anchor) lead somewhere real, and
every docs page can be reached from the README."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where links and headings live."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation other than '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a file, repeated headings numbered as GitHub does (-1, -2...)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = anchor(INLINE_CODE.sub(lambda m: m.group(0)[1:-1], heading))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    return LINK.findall(prose(path.read_text(encoding="utf-8")))


def test_readme_is_short_and_no_line_is_long():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300
    assert [i for i, line in enumerate(lines, 1) if len(line) > 200] == []


def test_table_of_contents_links_to_readme_headings():
    text = README.read_text(encoding="utf-8")
    toc = re.search(r"^## Contents\n(.*?)^## ", text, re.MULTILINE | re.DOTALL)
    assert toc, "README.md has no '## Contents' section"
    targets = re.findall(r"\]\(#([^)]+)\)", toc.group(1))
    assert len(targets) >= 10
    assert [t for t in targets if t not in anchors(README)] == []


def test_every_relative_link_resolves_to_a_file_and_heading():
    broken = []
    for page in [README, *DOCS]:
        for target in links(page):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            file_part, _, fragment = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


def test_readme_stays_inside_the_repository():
    outside = [t for t in links(README) if not t.startswith(("http://", "https://", "mailto:", "#"))]
    assert [t for t in outside if REPO not in (README.parent / t.partition("#")[0]).resolve().parents] == []


def test_readme_names_both_commands_and_links_every_docs_page():
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text and "make test" in text
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links(README) if t.startswith("docs/")}
    assert DOCS and [p.name for p in DOCS if p.resolve() not in linked] == []
