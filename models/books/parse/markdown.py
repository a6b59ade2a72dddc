"""Markdown: chapters at `#` headings, and the markup stripped to the text a narrator reads.

The title and author come from the front matter (`title:`, `author:`), a single `#` title
and a `by NAME` line under it, or the opening lines as in plain text (:mod:`.titles`). A
pipe table is read row by row, each cell a sentence after its column's header
(:mod:`.tables`); a footnote's marker (`[^1]`) is not read, its text (`[^1]: ...`) is read
at the end of the chapter that holds it.
"""

from __future__ import annotations

import re

from models.books.parse.book import Book, Chapter, with_front_matter
from models.books.parse.limits import Budget
from models.books.parse.tables import Cell, read_table
from models.books.parse.text import split_at
from models.books.parse.titles import byline, display_case, front_matter, opening_title

_MD_HEADING = re.compile(r"^(?P<hashes>#{1,6})[ \t]+(?P<title>.+?)[ \t#]*$", re.MULTILINE)
_MD_SETEXT = re.compile(r"^(?P<title>[^\n#>\-=*`|][^\n]*)\n(?P<rule>=+|-+)[ \t]*$", re.MULTILINE)
# A `#` title as the file's first line, and the first line after it (a byline, perhaps).
_TOP_TITLE = re.compile(r"\A\s*#[ \t]+[^\n]*\n(?:[ \t]*\n)*(?P<line>[^\n]*)(?:\n|\Z)")
_NOTE_TEXT = re.compile(r"^\[\^[^\]\s]+\]:[ \t]*(?P<text>.*)$", re.MULTILINE)
_NOTE_MARK = re.compile(r"\[\^[^\]\s]+\]")
_TABLE_RULE_CELL = re.compile(r":?-+:?")


def _cells(line: str) -> list[str]:
    """A pipe table row's cells (`| a | b |` or `a | b`; `\\|` is a pipe in a cell)."""
    line = line.strip()
    line = line[1:] if line.startswith("|") else line
    line = line[:-1] if line.endswith("|") and not line.endswith("\\|") else line
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)]


def _is_table_rule(line: str) -> bool:
    """The line under a pipe table's header row: `|---|:--:|`, `--- | ---`."""
    return "|" in line and all(_TABLE_RULE_CELL.fullmatch(c) for c in _cells(line))


def _pipe_tables(md: str) -> str:
    """`md` with each pipe table replaced by what is read of it, a paragraph a row."""
    if "|" not in md:
        return md
    lines, out, i = md.split("\n"), [], 0
    while i < len(lines):
        if "|" in lines[i] and i + 1 < len(lines) and _is_table_rule(lines[i + 1]):
            rows = [[Cell(c, header=True) for c in _cells(lines[i])]]
            i += 2
            while i < len(lines) and "|" in lines[i] and lines[i].strip():
                rows.append([Cell(c) for c in _cells(lines[i])])
                i += 1
            out += ["", "\n\n".join(read_table(rows)), ""]
        else:
            out.append(lines[i])
            i += 1
    return "\n".join(out)


def _markdown_to_text(md: str) -> str:
    md = re.sub(r"^```.*?^```[ \t]*$", "", md, flags=re.MULTILINE | re.DOTALL)  # code blocks
    notes = [m["text"].strip() for m in _NOTE_TEXT.finditer(md) if m["text"].strip()]
    md = _NOTE_MARK.sub("", _NOTE_TEXT.sub("", md))
    md = "\n\n".join([_pipe_tables(md), *notes])
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


def _title_page(md: str) -> tuple[str | None, str, str]:
    """(the title of the opening lines, the author, `md` without those lines): a byline
    under a `#` title as the first line, or the opening lines as plain text's
    (:func:`opening_title`) when the file does not open with a heading."""
    top = _TOP_TITLE.match(md)
    if top:
        author = byline(top["line"])
        if author:
            return None, display_case(author), md[:top.start("line")] + md[top.end():]
        return None, "", md
    opening = opening_title(md, lambda line: line.startswith("#"))
    if opening:
        return opening
    return None, "", md


def parse_markdown(md: str, fallback_title: str = "Untitled",
                   budget: Budget | None = None) -> Book:
    """Markdown: chapters start at `#` headings (or `##` under a single `#` title); the text
    between the title and the first chapter is front matter (`with_front_matter`). The
    title and author: the front matter's, else the title page's (:func:`_title_page`), else
    a single `#` title, else `fallback_title`."""
    md = md.replace("\r\n", "\n").replace("\r", "\n")
    if budget:
        # Counted before the headings are listed: a heading is at least two words (`# A`),
        # so within the cap the list of them is bounded too.
        budget.add_words(md)
    meta, md = front_matter(md)
    md = _MD_SETEXT.sub(lambda m: ("# " if m["rule"][0] == "=" else "## ") + m["title"], md)
    md = re.sub(r"^```.*?^```[ \t]*$", "", md, flags=re.MULTILINE | re.DOTALL)
    page_title, author, md = _title_page(md)
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
    title = _markdown_to_text(meta.get("title") or page_title or title)
    author = _markdown_to_text(meta.get("author") or meta.get("authors")
                               or meta.get("creator") or author)
    return Book(title, author, with_front_matter(_markdown_to_text(front), chapters, title),
                source_format="markdown")
