"""Plain text: "Chapter 1", "CHAPTER IV", "第三章" lines start chapters; the opening lines
(`THE SALT ROAD` / `by A. Newcomer`) give the title and author (:mod:`.titles`)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import chain

from models.books.parse.book import Book, Chapter, with_front_matter
from models.books.parse.limits import Budget
from models.books.parse.titles import labelled_title, opening_title

_WORD = re.compile(r"\w")

_TEXT_HEADING = re.compile(
    r"^[ \t]*(?:(?:chapter|CHAPTER|Chapter)[ \t]+(?:\d+|[IVXLCDMivxlcdm]+|[A-Za-z-]+)\b[^\n]*"
    r"|第[0-9〇零一二三四五六七八九十百千两]+[章回节][^\n]*)[ \t]*$",
    re.MULTILINE)


def split_at(text: str, headings: Iterable[re.Match],
             budget: Budget | None = None) -> tuple[str, list[Chapter]]:
    """`text` cut at `headings` (matches in it, in order, taken one at a time; a `title`
    group, if the pattern has one, is the chapter's title, else the whole match): the text
    before the first heading (front matter, for `with_front_matter`) and one chapter per
    heading. A chapter with nothing under its heading (a table of contents line) is left out
    but for the first: `finish` drops them all the same, and a file of a million heading
    lines is never a million chapters held. `budget` counts the chapters kept."""
    chapters: list[Chapter] = []
    front_end: int | None = None
    last: re.Match | None = None
    for m in chain(headings, [None]):
        if last is not None:
            end = m.start() if m is not None else len(text)
            body = text[last.end():end]
            if not chapters or _WORD.search(body):
                title = last.group("title") if "title" in last.re.groupindex else last.group(0)
                if budget and _WORD.search(body):
                    budget.add_chapter()
                # The listener hears the chapter's title before its text, as a narrator
                # reads it.
                chapters.append(Chapter(title.strip(), f"{title.strip()}.\n\n{body}"))
        elif m is not None:
            front_end = m.start()
        last = m
    if front_end is None:
        return text, []
    return text[:front_end], chapters


def is_text_heading(line: str) -> bool:
    """Whether `line` is a chapter heading of plain text ("Chapter 1", "第三章")."""
    return bool(_TEXT_HEADING.fullmatch(line))


def parse_text(text: str, fallback_title: str = "Untitled", budget: Budget | None = None) -> Book:
    """Plain text: "Chapter 1", "CHAPTER IV", "第三章" lines start chapters, else one; a
    title page's lines (a title, `by NAME`) give the title and author and are not read."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if budget:
        budget.add_words(text)
    title, author = fallback_title, ""
    opening = opening_title(text, is_text_heading)
    if opening:
        title, author, text = opening
    # A catalogue's own `Title:` and `Author:` lines say it better than a first line.
    labelled = labelled_title(text)
    if labelled:
        title, author = labelled[0], labelled[1] or author
    # A table of contents lists the headings with nothing between them: no chapters (see
    # split_at). Text before the first heading (a title, a preface) is front matter.
    front, chapters = split_at(text, _TEXT_HEADING.finditer(text), budget)
    return Book(title, author, with_front_matter(front, chapters, title),
                source_format="text")
