"""Plain text: "Chapter 1", "CHAPTER IV", "第三章" lines start chapters."""

from __future__ import annotations

import re

from models.books.parse.book import Book, Chapter, with_front_matter

_TEXT_HEADING = re.compile(
    r"^[ \t]*(?:(?:chapter|CHAPTER|Chapter)[ \t]+(?:\d+|[IVXLCDMivxlcdm]+|[A-Za-z-]+)\b[^\n]*"
    r"|第[0-9〇零一二三四五六七八九十百千两]+[章回节][^\n]*)[ \t]*$",
    re.MULTILINE)


def split_at(text: str, headings: list[re.Match]) -> tuple[str, list[Chapter]]:
    """`text` cut at `headings` (matches in it; a `title` group, if the pattern has one, is
    the chapter's title, else the whole match): the text before the first heading (front
    matter, for `with_front_matter`) and one chapter per heading."""
    if not headings:
        return text, []
    chapters = []
    for i, m in enumerate(headings):
        end = headings[i + 1].start() if i + 1 < len(headings) else len(text)
        title = m.group("title") if "title" in m.re.groupindex else m.group(0)
        body = text[m.end():end]
        # The listener hears the chapter's title before its text, as a narrator reads it.
        chapters.append(Chapter(title.strip(), f"{title.strip()}.\n\n{body}"))
    return text[: headings[0].start()], chapters


def parse_text(text: str, fallback_title: str = "Untitled") -> Book:
    """Plain text: "Chapter 1", "CHAPTER IV", "第三章" lines start chapters, else one."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    headings = list(_TEXT_HEADING.finditer(text))
    # A table of contents lists the headings with nothing between them; split_at keeps the
    # empty chapters it makes and finish() drops them, so the real chapters remain. Text
    # before the first heading (a title, a preface) is front matter.
    front, chapters = split_at(text, headings)
    return Book(fallback_title, "", with_front_matter(front, chapters, fallback_title),
                source_format="text")
