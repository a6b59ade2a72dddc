"""HTML: chapters at `h1` headings, and the (X)HTML reader EPUB chapters go through too.

Text is pulled out with the stdlib `html.parser`, which expands nothing but the standard
HTML character references and fetches nothing.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from models.books.parse.book import Book, Chapter, one_line, with_front_matter
from models.books.parse.limits import Budget

_BLOCK_TAGS = frozenset({"p", "div", "br", "li", "tr", "section", "article", "blockquote",
                         "h1", "h2", "h3", "h4", "h5", "h6", "pre", "dd", "dt", "figcaption",
                         "header", "footer", "aside", "hr", "table", "ul", "ol", "body"})
_SKIP_TAGS = frozenset({"script", "style", "head", "noscript", "template", "svg", "math"})


class _HtmlText(HTMLParser):
    """Blocks of text from (X)HTML: [(tag, text)], tag 'h1'/'h2'/... for headings, else 'p'.

    Also notes the <title> and whether the document declares itself a cover, TOC or
    copyright page (`epub:type`). Expands only HTML's own character references. With a
    budget, each block's words are counted as it ends: past the cap the reading stops there.
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

    def _flush(self) -> None:
        text = one_line("".join(self._buf))
        if text:
            if self.budget:
                self.budget.add_words(text)
            self.blocks.append((self._tag, text))
        self._buf, self._tag = [], "p"

    def handle_starttag(self, tag: str, attrs) -> None:
        tag = tag.lower().split(":")[-1]
        for name, value in attrs:
            if name.lower() in ("epub:type", "role") and value:
                self.doc_types.update(value.lower().replace("doc-", "").split())
        if tag == "title":
            self._in_title = True
        if tag in _SKIP_TAGS:
            self._skip += 1
        elif tag in _BLOCK_TAGS:
            self._flush()
            if re.fullmatch(r"h[1-6]", tag):
                self._tag = tag

    def handle_startendtag(self, tag: str, attrs) -> None:
        if tag.lower() in _BLOCK_TAGS:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        tag = tag.lower().split(":")[-1]
        if tag == "title":
            self._in_title = False
        if tag in _SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
        elif tag in _BLOCK_TAGS:
            self._flush()

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif not self._skip:
            self._buf.append(data)

    def close(self) -> None:
        super().close()
        self._flush()


def html_blocks(html: str, budget: Budget | None = None) -> _HtmlText:
    parser = _HtmlText(budget)
    parser.feed(html)
    parser.close()
    return parser


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
            current = (text, [f"{text}."])
        elif tag == "h1" and level == "h2":
            continue  # the book's title, already taken
        elif current:
            current[1].append(text)
        else:
            front.append(text)
    if current:
        chapters.append(Chapter(current[0], "\n\n".join(current[1])))
    return Book(title, "", with_front_matter("\n\n".join(front), chapters, title),
                source_format="html")
