"""Markdown: chapters at `#` headings, and the markup stripped to the text a narrator reads."""

from __future__ import annotations

import re

from models.books.parse.book import Book, Chapter, with_front_matter
from models.books.parse.limits import Budget
from models.books.parse.text import split_at

_MD_HEADING = re.compile(r"^(?P<hashes>#{1,6})[ \t]+(?P<title>.+?)[ \t#]*$", re.MULTILINE)
_MD_SETEXT = re.compile(r"^(?P<title>[^\n#>\-=*`|][^\n]*)\n(?P<rule>=+|-+)[ \t]*$", re.MULTILINE)


def _markdown_to_text(md: str) -> str:
    md = re.sub(r"^```.*?^```[ \t]*$", "", md, flags=re.MULTILINE | re.DOTALL)  # code blocks
    md = re.sub(r"<!--.*?-->", "", md, flags=re.DOTALL)
    md = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", md)  # images
    md = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", md)  # links keep their text
    md = re.sub(r"\[([^\]]+)\]\[[^\]]*\]", r"\1", md)
    md = re.sub(r"^\[[^\]]+\]:\s*\S+.*$", "", md, flags=re.MULTILINE)  # link definitions
    md = re.sub(r"<[^>\n]+>", "", md)  # inline HTML tags
    md = re.sub(r"^[ \t]*(?:[-*+]|\d+\.)[ \t]+", "", md, flags=re.MULTILINE)  # list markers
    md = re.sub(r"^[ \t]*>[ \t]?", "", md, flags=re.MULTILINE)  # quotes
    md = re.sub(r"^[ \t]*(?:[-*_][ \t]*){3,}$", "", md, flags=re.MULTILINE)  # rules
    md = re.sub(r"(\*\*|__|\*|_|~~|`)(?=\S)(.+?)(?<=\S)\1", r"\2", md)  # emphasis, code
    return md


def parse_markdown(md: str, fallback_title: str = "Untitled",
                   budget: Budget | None = None) -> Book:
    """Markdown: chapters start at `#` headings (or `##` under a single `#` title); the text
    between the title and the first chapter is front matter (`with_front_matter`)."""
    md = md.replace("\r\n", "\n").replace("\r", "\n")
    if budget:
        # Counted before the headings are listed: a heading is at least two words (`# A`),
        # so within the cap the list of them is bounded too.
        budget.add_words(md)
    md = _MD_SETEXT.sub(lambda m: ("# " if m["rule"][0] == "=" else "## ") + m["title"], md)
    md = re.sub(r"^```.*?^```[ \t]*$", "", md, flags=re.MULTILINE | re.DOTALL)
    headings = list(_MD_HEADING.finditer(md))
    h1 = [m for m in headings if len(m["hashes"]) == 1]
    h2 = [m for m in headings if len(m["hashes"]) == 2]
    title = fallback_title
    if len(h1) == 1 and h2:
        title = h1[0]["title"]
        md = md[: h1[0].start()] + md[h1[0].end():]
        level = 2
    else:
        level = 1 if h1 else 2
    headings = [m for m in _MD_HEADING.finditer(md) if len(m["hashes"]) == level]
    if len(h1) == 1 and not h2:
        title = h1[0]["title"]
    front, chapters = split_at(md, headings, budget)
    chapters = [Chapter(_markdown_to_text(c.title), _markdown_to_text(c.text)) for c in chapters]
    title = _markdown_to_text(title)
    return Book(title, "", with_front_matter(_markdown_to_text(front), chapters, title),
                source_format="markdown")
