"""HTML: chapters at `h1` headings, and the (X)HTML reader EPUB chapters go through too.

Text is pulled out with the stdlib `html.parser`, which expands nothing but the standard
HTML character references and fetches nothing.

What is read, beside the paragraphs (docs/books.md, "What is read"): a table row by row,
each cell a sentence of its own (:mod:`.tables`); a heading as a sentence (a full stop
after it, so it never runs into the paragraph under it); no note marker (an `<a>` marked
`epub:type="noteref"` or `role="doc-noteref"`, or a short link to a note in or around a
`<sup>`: "soft as cloth.¹" was read "soft as cloth. one"); the notes themselves
(`epub:type` footnote, endnote or rearnote, `role` doc-footnote or doc-endnote) after the
rest of the document, where a narrator reads them, not in the middle of a page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

from models.books.parse.book import Book, Chapter, one_line, with_front_matter
from models.books.parse.limits import Budget
from models.books.parse.tables import Cell, as_sentence, read_table

_BLOCK_TAGS = frozenset({"p", "div", "br", "li", "tr", "section", "article", "blockquote",
                         "h1", "h2", "h3", "h4", "h5", "h6", "pre", "dd", "dt", "figcaption",
                         "header", "footer", "aside", "hr", "table", "ul", "ol", "body",
                         "caption"})
_SKIP_TAGS = frozenset({"script", "style", "head", "noscript", "template", "svg", "math"})
_HEADING = re.compile(r"h[1-6]")
# `epub:type` / `role` values (less `doc-`) of a note and of a reference to one.
_NOTE_TYPES = frozenset({"footnote", "endnote", "rearnote"})
_NOTEREF_TYPES = frozenset({"noteref"})
# What a note's marker says: 1, 12, *, †, a, iv, [3], (3); several as "1,2" or "1-3".
_ONE_MARKER = r"[\[(]?(?:\d{1,4}|[*†‡§¶#]{1,3}|[A-Za-z]|[ivxlcdm]{1,6})[\])]?"
_MARKER = re.compile(rf"{_ONE_MARKER}(?:\s*[,–-]\s*{_ONE_MARKER})*")


@dataclass
class _Table:
    """A table being read: its rows so far, the row and the cell open now."""

    rows: list[list[Cell]] = field(default_factory=list)
    row: list[Cell] | None = None
    cell: list[str] | None = None
    cell_header: bool = False
    cell_span: int = 1
    in_head: bool = False

    def end_cell(self) -> None:
        if self.cell is not None:
            if self.row is None:
                self.row = []
            self.row.append(Cell(one_line("".join(self.cell)), self.cell_header,
                                 self.cell_span))
            self.cell = None

    def end_row(self) -> None:
        self.end_cell()
        if self.row is not None:
            self.rows.append(self.row)
            self.row = None


@dataclass
class _Mark:
    """Where a `<sup>` or a note link began in the text being collected: if it turns out to
    be a note marker, the text from here on is taken back out."""

    tag: str
    buf: list[str]
    at: int
    note_link: bool = False


def _types(attrs) -> set[str]:
    """The `epub:type` and `role` values of a tag, less any `doc-` prefix."""
    out: set[str] = set()
    for name, value in attrs:
        if name.lower() in ("epub:type", "role") and value:
            out.update(value.lower().replace("doc-", "").split())
    return out


def _links_to_note(tag: str, attrs) -> bool:
    """An `<a>` whose target is a place in a document (`#n1`, `notes.xhtml#n1`)."""
    return tag == "a" and any(name.lower() == "href" and value and "#" in value
                              for name, value in attrs)


def _span(attrs) -> int:
    value = next((v for n, v in attrs if n.lower() == "colspan" and v), "1")
    return min(int(value), 100) if value.strip().isdigit() and int(value) > 0 else 1


class _HtmlText(HTMLParser):
    """Blocks of text from (X)HTML: [(tag, text)], tag 'h1'/'h2'/... for headings, else 'p'.

    Also notes the <title> and whether the document declares itself a cover, TOC or
    copyright page (`epub:type`). Expands only HTML's own character references. With a
    budget, each block's words are counted as it ends: past the cap the reading stops there.
    A table's rows are blocks of their own, read by :func:`read_table`; note markers are left
    out and the notes come last (see the module's docstring).
    """

    def __init__(self, budget: Budget | None = None) -> None:
        super().__init__(convert_charrefs=True)
        self.budget = budget
        self.blocks: list[tuple[str, str]] = []
        self.title = ""
        self.doc_types: set[str] = set()
        self._buf: list[str] = []
        self._tag = "p"
        self._skip = 0
        self._in_title = False
        self._notes: list[tuple[str, str]] = []
        self._note_tag: str | None = None  # the element a note opened with, while in one
        self._note_depth = 0
        self._hidden = 0  # inside a note reference: not read
        self._marks: list[_Mark] = []
        self._tables: list[_Table] = []

    def _emit(self, tag: str, text: str) -> None:
        if self.budget:
            self.budget.add_words(text)
        (self._notes if self._note_tag else self.blocks).append((tag, text))

    def _flush(self) -> None:
        text = one_line("".join(self._buf))
        if text:
            self._emit("p" if self._tag == "caption" else self._tag,
                       as_sentence(text) if self._tag == "caption" else text)
        self._buf, self._tag = [], "p"

    def _cell(self) -> list[str] | None:
        """The open table cell's text, when a cell is open."""
        return self._tables[-1].cell if self._tables else None

    def _target(self) -> list[str]:
        cell = self._cell()
        return self._buf if cell is None else cell

    def handle_starttag(self, tag: str, attrs) -> None:
        tag = tag.lower().split(":")[-1]
        types = _types(attrs)
        self.doc_types.update(types)
        if tag == "title":
            self._in_title = True
        if tag in _SKIP_TAGS:
            self._skip += 1
            return
        if self._hidden or (tag == "a" and types & _NOTEREF_TYPES):
            self._hidden += tag == "a"
            return
        if types & _NOTE_TYPES and self._note_tag is None:
            self._flush()
            self._note_tag, self._note_depth = tag, 0
        if tag == self._note_tag:
            self._note_depth += 1
        self._start_mark(tag, attrs)
        if not self._table_start(tag, attrs) and tag in _BLOCK_TAGS:
            self._flush()
            if _HEADING.fullmatch(tag) or tag == "caption":
                self._tag = tag

    def handle_startendtag(self, tag: str, attrs) -> None:
        tag = tag.lower().split(":")[-1]
        if tag in ("td", "th") and self._tables:
            # An empty cell (`<td/>` in XHTML) still takes its column.
            self.handle_starttag(tag, attrs)
            self.handle_endtag(tag)
        elif tag in _BLOCK_TAGS and not self._hidden:
            if self._cell() is not None:
                self._target().append(" ")
            elif tag not in ("table", "tr", "caption"):
                self._flush()

    def handle_endtag(self, tag: str) -> None:
        tag = tag.lower().split(":")[-1]
        if tag == "title":
            self._in_title = False
        if tag in _SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
            return
        if self._hidden:
            self._hidden -= tag == "a"
            return
        if (tag == "a" or tag == "sup") and self._marks:
            self._end_mark(tag)
        if not self._table_end(tag) and tag in _BLOCK_TAGS:
            self._flush()
        if tag == self._note_tag:
            self._note_depth -= 1
            if self._note_depth <= 0:
                self._flush()
                self._note_tag = None

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif not self._skip and not self._hidden:
            self._target().append(data)

    def close(self) -> None:
        super().close()
        while self._tables:
            self._table_end("table")
        self._note_tag = None
        self._flush()
        self.blocks += self._notes
        self._notes = []

    # -- note markers ----------------------------------------------------------------------

    def _start_mark(self, tag: str, attrs) -> None:
        """A `<sup>` or a link to a note begins: remember where, to take a marker back."""
        if tag != "sup" and tag != "a":
            return
        link = _links_to_note(tag, attrs)
        if tag != "sup" and not link:
            return
        if self._marks and (link or self._marks[-1].tag == "a"):
            self._marks[-1].note_link = True  # a link in a <sup>, or a <sup> in a link
        target = self._target()
        self._marks.append(_Mark(tag, target, len(target)))

    def _end_mark(self, tag: str) -> None:
        """A `<sup>` or link ends: a note marker in it (a short link to a note inside or
        around a <sup>) is taken out of the text."""
        at = next((i for i in range(len(self._marks) - 1, -1, -1)
                   if self._marks[i].tag == tag), None)
        if at is None:
            return
        mark = self._marks.pop(at)
        del self._marks[at:]
        said = "".join(mark.buf[mark.at:]).strip()
        if mark.note_link and mark.buf is self._target() and _MARKER.fullmatch(said):
            del mark.buf[mark.at:]

    # -- tables ----------------------------------------------------------------------------

    def _table_start(self, tag: str, attrs) -> bool:
        """A table's tag begins (or a block inside a cell); False if `tag` is no table's."""
        if tag == "table":
            if self._cell() is None:
                self._flush()
            self._tables.append(_Table())
            return True
        if not self._tables:
            return False
        table = self._tables[-1]
        if tag in ("thead", "tbody", "tfoot"):
            table.in_head = tag == "thead"
        elif tag == "tr":
            table.end_row()
            table.row = []
        elif tag in ("td", "th"):
            table.end_cell()
            table.cell, table.cell_span = [], _span(attrs)
            table.cell_header = tag == "th" or table.in_head
        elif table.cell is not None and tag in _BLOCK_TAGS:
            table.cell.append(" ")
        else:
            return False
        return True

    def _table_end(self, tag: str) -> bool:
        """A table's tag ends; False if `tag` is no table's. A table's rows are read when it
        ends: as blocks, or (a table in a cell) as the enclosing cell's text."""
        if not self._tables:
            return False
        table = self._tables[-1]
        if tag == "table":
            table.end_row()
            self._tables.pop()
            rows = read_table(table.rows)
            outer = self._cell()
            if outer is not None:
                outer.append(f" {' '.join(rows)} ")
            else:
                self._flush()
                for row in rows:
                    self._emit("p", row)
        elif tag == "thead":
            table.in_head = False
        elif tag == "tr":
            table.end_row()
        elif tag in ("td", "th"):
            table.end_cell()
        elif table.cell is not None and tag in _BLOCK_TAGS:
            table.cell.append(" ")
        else:
            return tag in ("tbody", "tfoot")
        return True


def html_blocks(html: str, budget: Budget | None = None) -> _HtmlText:
    parser = _HtmlText(budget)
    parser.feed(html)
    parser.close()
    return parser


def spoken(blocks: list[tuple[str, str]]) -> list[str]:
    """The blocks' text as it is read: a heading ends a sentence (see the module's
    docstring)."""
    return [as_sentence(text) if _HEADING.fullmatch(tag) else text for tag, text in blocks]
def parse_html(html: str, fallback_title: str = "Untitled", budget: Budget | None = None) -> Book:
    """HTML: chapters start at `h1` (or `h2` under a single `h1` title); the blocks before the
    first chapter are front matter (`with_front_matter`)."""
    doc = html_blocks(html, budget)
    h1 = [t for tag, t in doc.blocks if tag == "h1"]
    h2 = [t for tag, t in doc.blocks if tag == "h2"]
    title = one_line(doc.title) or fallback_title
    level = "h1"
    if len(h1) == 1 and h2:
        title, level = h1[0], "h2"
    elif len(h1) == 1:
        title = one_line(doc.title) or h1[0]
    elif not h1 and h2:
        level = "h2"
    chapters: list[Chapter] = []
    current: tuple[str, list[str]] | None = None
    front: list[str] = []
    for tag, text in doc.blocks:
        if tag == level:
            if current:
                chapters.append(Chapter(current[0], "\n\n".join(current[1])))
            current = (text, [as_sentence(text)])
        elif tag == "h1" and level == "h2":
            continue  # the book's title, already taken
        elif current:
            current[1].extend(spoken([(tag, text)]))
        else:
            front.append(text)
    if current:
        chapters.append(Chapter(current[0], "\n\n".join(current[1])))
    return Book(title, "", with_front_matter("\n\n".join(front), chapters, title),
                source_format="html")
