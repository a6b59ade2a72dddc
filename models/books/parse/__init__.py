"""Books in, chapters out: EPUB, Markdown, HTML and plain text to a `Book` of (title, text).

Pure: bytes and a file name in, a `Book` or a `BookError` out; no network, no Redis.

One module a format (:mod:`.text`, :mod:`.markdown`, :mod:`.html`, :mod:`.epub`), the checks
an EPUB passes before ebooklib opens it (:mod:`.epub_safety`: zip bombs, path traversal,
DRM, XML entities and external references), the decoding of text uploads
(:mod:`.encoding`), the `Book` they all return with the rule that tidies it (:mod:`.book`),
and the caps a book is held to while it is read (:mod:`.limits`: words, chapters, an
archive's unpacked bytes and ratio; past one, `BookTooLarge`). :func:`parse_book` picks the
format by the file's extension.
"""

from __future__ import annotations

import posixpath

from models.books.parse.book import (
    MAX_TITLE_CHARS,
    Book,
    BookError,
    Chapter,
    count_words,
    finish,
    with_tags,
)
from models.books.parse.encoding import decode_text
from models.books.parse.epub import parse_epub
from models.books.parse.epub_safety import MAX_ENTRIES, RATIO_MIN_BYTES, check_epub_archive
from models.books.parse.html import html_blocks, parse_html
from models.books.parse.limits import BookLimits, BookTooLarge, Budget, check_book
from models.books.parse.markdown import parse_markdown
from models.books.parse.text import parse_text

__all__ = [
    "EXTENSIONS", "MAX_ENTRIES", "MAX_TITLE_CHARS", "RATIO_MIN_BYTES", "Book", "BookError",
    "BookLimits", "BookTooLarge", "Chapter", "check_book", "check_epub_archive", "count_words",
    "finish", "extensions_text", "html_blocks", "not_a_book_file", "parse_book", "parse_epub",
    "parse_html", "parse_markdown", "parse_text", "with_tags",
]

EXTENSIONS = {".epub": "epub", ".txt": "text", ".text": "text", ".md": "markdown",
              ".markdown": "markdown", ".html": "html", ".htm": "html", ".xhtml": "html"}


def extensions_text() -> str:
    """Every book file extension, as a refusal names them: ".epub, .txt, ... or .xhtml"."""
    *rest, last = EXTENSIONS
    return f"{', '.join(rest)} or {last}"


def not_a_book_file(filename: str) -> BookError:
    """The refusal of an upload whose extension is no book's (415 `unsupported_format`)."""
    return BookError("unsupported_format",
                     f"'{filename}' is not a book file; send {extensions_text()}")


def parse_book(data: bytes, filename: str, limits: BookLimits) -> Book:
    """Parse an upload by its extension, held to `limits` while it is read. Raises BookError
    (BookTooLarge past a cap)."""
    ext = posixpath.splitext(filename.lower())[1]
    kind = EXTENSIONS.get(ext)
    if kind is None:
        raise not_a_book_file(filename)
    stem = posixpath.splitext(posixpath.basename(filename.replace("\\", "/")))[0]
    budget = Budget(limits)
    if kind == "epub":
        book = parse_epub(data, limits, budget)
    else:
        text = decode_text(data, filename)
        if kind == "markdown":
            book = parse_markdown(text, fallback_title=stem, budget=budget)
        elif kind == "html":
            book = parse_html(text, fallback_title=stem, budget=budget)
        else:
            book = parse_text(text, fallback_title=stem, budget=budget)
    return check_book(finish(book), limits)
