"""The README is the front door: short, and every page it and the docs point at exists.

The README keeps what a newcomer needs on one screen or two; everything else lives in docs/.
A relative link that names a missing file is a dead end for exactly that newcomer, so every
one in README.md and docs/*.md must resolve to a file in the checkout (anchors are not
checked: they follow headings, which may change wording without breaking a reader's way).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_README_LINES = 200

# Fenced blocks and inline code hold examples (`[break=300ms]`, shell, JSON), not links.
_FENCED = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
# [text](target) and [text](target "title"); images ![alt](src) too.
_LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def relative_links(md: Path) -> list[str]:
    text = _INLINE_CODE.sub("", _FENCED.sub("", md.read_text(encoding="utf-8")))
    targets = [m.group(1) for m in _LINK.finditer(text)]
    return [t for t in targets if not t.startswith("#") and not _EXTERNAL.match(t)]


def pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_is_under_200_lines():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < MAX_README_LINES, (
        f"README.md has {lines} lines; the front door stays under {MAX_README_LINES}: "
        "move the detail to a page in docs/ and link it")


def test_readme_links_every_docs_page():
    linked = {(README.parent / t.split("#", 1)[0]).resolve() for t in relative_links(README)}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md"))
                if p.resolve() not in linked and p.name != "api.md"]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


@pytest.mark.parametrize("md", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_that_exist(md: Path):
    missing = []
    for target in relative_links(md):
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path and not (md.parent / path).exists():
            missing.append(target)
    assert not missing, f"{md.relative_to(ROOT)} links to missing files: {missing}"


def test_link_finder_sees_links_and_skips_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[a](docs/a.md) [b](b.md#part) [web](https://example.com) [here](#x)\n"
                    "`[not](code.md)`\n```\n[not](fenced.md)\n```\n", encoding="utf-8")
    assert relative_links(page) == ["docs/a.md", "b.md#part"]
