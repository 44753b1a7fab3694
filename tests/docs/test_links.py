"""Every relative link in README.md, CHANGELOG.md and docs/**/*.md resolves: the file exists, and a #fragment names
a heading of the target page (GitHub's anchor rule)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
FENCED = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def pages() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in found if p.is_file() and "api" not in p.relative_to(ROOT).parts[:2]]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*?|__?", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCED.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(text):
        s = slug(heading)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    out.update(re.findall(r'<a (?:name|id)="([^"]+)"', text))
    return out


def links(page: Path) -> list[str]:
    text = FENCED.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, mailto: ...


def test_there_are_pages_and_links():
    assert len(pages()) > 10
    assert sum(len(links(p)) for p in pages()) > 50


def test_slug_follows_github():
    assert slug("Measured: every scheme, `posenc lab --preset schemes`") == \
        "measured-every-scheme-posenc-lab---preset-schemes"
    assert slug("What the effects show, against the published results (Press et al. 2022, Table 2)") == \
        "what-the-effects-show-against-the-published-results-press-et-al-2022-table-2"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and unquote(fragment) not in anchors(dest):
            broken.append(f"{target}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
