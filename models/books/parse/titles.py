"""A plain-text or Markdown book's title and author, from its opening lines or front matter.

An EPUB says its title and author in its package; a TXT or Markdown file says them the way a
printed book's title page does: `THE SALT ROAD` then `by A. Newcomer`, or `# The Salt Road`
then `*by A. Newcomer*`, or a YAML front matter block (`title:`, `author:`). Without this
the audiobook was tagged with the file's name and no author.

The lines taken are title-page lines and are not read (the rule every format follows for
front matter, models/books/parse/book.py: a narrator skips the title page); they are the
book's tags. A title in capitals (`THE SALT ROAD`) is tagged in title case (`The Salt
Road`): a player's list should not shout.
"""

from __future__ import annotations

import re

from models.books.parse.book import is_title_page, one_line

# `by A. Newcomer`, `*by A. Newcomer*`, `BY A. NEWCOMER`, `_By Ann Writer_`.
_BYLINE = re.compile(r"^[*_\s]*by[ \t]+(?P<name>.+?)[*_\s]*$", re.IGNORECASE)
# A name: a few words (two authors and their "and" fit), starting with a capital.
MAX_NAME_WORDS = 6
# Words a title in title case leaves small (but as its first or last word).
_SMALL = frozenset("a an and as at but by for from in into nor of on or the to with".split())
_FRONT_MATTER = re.compile(r"\A\ufeff?---[ \t]*\n(?P<body>.*?)\n(?:---|\.\.\.)[ \t]*(?:\n|\Z)",
                           re.DOTALL)
_FIELD = re.compile(r"^(?P<key>[A-Za-z_]+)[ \t]*:[ \t]*(?P<value>.*)$")
# How much of a file's start is searched for its title page.
_OPENING_CHARS = 4000
# A file's own catalogue lines, as Project Gutenberg's texts open: `Title: ...`, `Author: ...`.
_LABELLED = re.compile(r"^(?P<key>Title|Author)[ \t]*:[ \t]*(?P<value>\S[^\n]*?)[ \t]*$",
                       re.MULTILINE | re.IGNORECASE)
_LIST_ITEM = re.compile(r"^[ \t]+-[ \t]+(?P<value>.+)$")


def byline(line: str) -> str | None:
    """The name in a byline (`by NAME`, emphasised or not), or None if `line` is none."""
    m = _BYLINE.match(line.strip())
    if not m:
        return None
    name = m["name"].strip()
    if (len(name.split()) > MAX_NAME_WORDS or not re.search(r"[^\W\d_]", name)
            or name[0].islower()):
        return None
    return name


def display_case(text: str) -> str:
    """`text` as a tag shows it: a title or name in capitals in title case, else as it is."""
    text = one_line(text)
    letters = [c for c in text if c.isalpha()]
    if not letters or not all(c.isupper() for c in letters if c.lower() != c.upper()):
        return text
    words = text.lower().split(" ")
    last = len(words) - 1
    return " ".join(w if 0 < i < last and w in _SMALL else w[:1].upper() + w[1:]
                    for i, w in enumerate(words))


def _paragraphs(text: str) -> list[tuple[list[str], int]]:
    """The first two paragraphs of `text` (runs of non-blank lines), each with where in
    `text` it ends. Only the opening is looked at: a title page is a few short lines, and a
    long file is not split into lines to find them."""
    out: list[tuple[list[str], int]] = []
    for m in re.finditer(r"(?:^[ \t]*\S[^\n]*(?:\n|\Z))+", text[:_OPENING_CHARS],
                         re.MULTILINE):
        out.append(([line.strip() for line in m.group().splitlines()], m.end()))
        if len(out) == 2:
            break
    return out


def opening_title(text: str, is_heading=lambda line: False) -> tuple[str, str, str] | None:
    """(title, author, the text after them) from plain text's opening lines, or None.

    The first paragraph is a title page when it is title-page lines only (at most 3 short
    lines, none ending a sentence or a clause, none a chapter heading by `is_heading`): its
    first line is the title, a `by NAME` line in it the author; the next paragraph gives the
    author when it is a byline alone. None when the opening is prose, or nothing would be
    left to read."""
    paragraphs = _paragraphs(text)
    if not paragraphs:
        return None
    lines, end = paragraphs[0]
    if (not is_title_page("\n".join(lines)) or any(is_heading(line) for line in lines)
            or byline(lines[0]) or any(line.endswith((",", ";", ":")) for line in lines)):
        return None
    author = next((name for name in map(byline, lines[1:]) if name), None)
    if author is None and len(paragraphs) > 1 and len(paragraphs[1][0]) == 1:
        author = byline(paragraphs[1][0][0])
        if author:
            end = paragraphs[1][1]
    rest = text[end:]
    if not re.search(r"\w", rest):
        return None
    return display_case(lines[0]), display_case(author or ""), rest


def labelled_title(text: str) -> tuple[str, str] | None:
    """(title, author) from `Title:` and `Author:` lines near the start of `text` (a
    Project Gutenberg text's header), or None without a `Title:` line."""
    found: dict[str, str] = {}
    for m in _LABELLED.finditer(text[:2 * _OPENING_CHARS]):
        if len(m["value"].split()) <= 2 * MAX_NAME_WORDS:
            found.setdefault(m["key"].lower(), m["value"])
    if "title" not in found:
        return None
    return display_case(found["title"]), display_case(found.get("author", ""))


def front_matter(md: str) -> tuple[dict[str, str], str]:
    """A Markdown file's YAML front matter (`---` lines around `key: value` lines) as
    {key: value} for its plain fields, a list (`author: [A, B]` or `- A` lines) joined with
    ", ", and the file without it. No front matter: ({}, md)."""
    m = _FRONT_MATTER.match(md)
    if not m:
        return {}, md
    fields: dict[str, list[str]] = {}
    key = None
    for line in m["body"].splitlines():
        item = _LIST_ITEM.match(line)
        field = _FIELD.match(line)
        if item and key:
            fields[key].append(_unquote(item["value"]))
        elif field:
            key, value = field["key"].lower(), field["value"].strip()
            if value.startswith("[") and value.endswith("]"):
                fields[key] = [_unquote(v) for v in value[1:-1].split(",") if v.strip()]
            else:
                fields[key] = [_unquote(value)] if value else []
    return ({k: ", ".join(v for v in values if v) for k, values in fields.items()},
            md[m.end():])


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) > 1 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return one_line(value)
