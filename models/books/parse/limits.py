"""The caps one book is held to while it is read, and the counting that enforces them.

A book is bounded before it is held: words and chapters are counted as the text comes out of
the file, and an EPUB's entries are inflated through :class:`Unpacked`, which counts the
bytes of every entry together. The first count past its cap raises :class:`BookTooLarge`
(the API's 413, naming the cap), so a hostile upload stops at the cap instead of being parsed
whole and refused afterwards. The caps come from the settings (read at the entry point and
passed down as a :class:`BookLimits`); this module holds no default of its own.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass

from models.books.parse.book import Book, BookError, count_words

# An entry is inflated this much at a time, so the count stops within a read of its cap.
_READ_BYTES = 256 * 1024


@dataclass(frozen=True)
class BookLimits:
    """The caps of one book (the settings' `max_book_*`)."""

    words: int
    chapters: int
    unpacked_bytes: int
    # Unpacked bytes per byte stored, over all of an archive's entries together.
    unpacked_ratio: float


class BookTooLarge(BookError):
    """The book is over one of its caps: `limit` is the cap, `unit` what it counts."""

    def __init__(self, code: str, message: str, limit: float, unit: str) -> None:
        super().__init__(code, message)
        self.limit = limit
        self.unit = unit

    def __reduce__(self):  # keep the fields when the error crosses a process boundary
        return (type(self), (self.code, self.message, self.limit, self.unit))


def too_many_words(limit: int) -> BookTooLarge:
    return BookTooLarge("too_many_words", f"the book has more than {limit:,} words, the most "
                        "one book may have; split it into volumes", limit, "words")


def too_many_chapters(limit: int) -> BookTooLarge:
    return BookTooLarge("too_many_chapters", f"the book has more than {limit:,} chapters, the "
                        "most one book may have; split it into volumes", limit, "chapters")


def unpacked_too_large(limit: int) -> BookTooLarge:
    return BookTooLarge("archive_too_large", f"the EPUB expands to more than {limit:,} bytes, "
                        "the most one book may unpack to", limit, "bytes")


class Budget:
    """What one upload has used of its words and chapters so far; each count past a cap
    raises :class:`BookTooLarge` at once."""

    def __init__(self, limits: BookLimits) -> None:
        self.limits = limits
        self.words = 0
        self.chapters = 0

    def add_words(self, text: str) -> None:
        self.words += count_words(text, stop_after=self.limits.words - self.words)
        if self.words > self.limits.words:
            raise too_many_words(self.limits.words)

    def add_chapter(self) -> None:
        self.chapters += 1
        if self.chapters > self.limits.chapters:
            raise too_many_chapters(self.limits.chapters)


class Unpacked:
    """Inflates zip entries, counting the bytes of all of them together against one cap: no
    entry is judged alone, so many entries each small enough pass no more than one big one."""

    def __init__(self, zf: zipfile.ZipFile, limit: int) -> None:
        self.zf = zf
        self.limit = limit
        self.total = 0

    def read(self, name: str) -> bytes:
        """The entry's bytes (KeyError if none); BookTooLarge once the total passes the cap,
        within one read of it (the rest of the entry is never inflated)."""
        parts = []
        try:
            with self.zf.open(name) as fh:
                while chunk := fh.read(_READ_BYTES):
                    self.total += len(chunk)
                    if self.total > self.limit:
                        raise unpacked_too_large(self.limit)
                    parts.append(chunk)
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
            raise BookError("corrupt_epub", f"the EPUB entry '{name}' is damaged: {exc}") from None
        return b"".join(parts)


def check_book(book: Book, limits: BookLimits) -> Book:
    """The book, if its words and chapters are within the caps (else BookTooLarge): the
    exact rule on what is read aloud, after the counts made while reading stopped nothing."""
    if len(book.chapters) > limits.chapters:
        raise too_many_chapters(limits.chapters)
    words = 0
    for chapter in book.chapters:
        words += count_words(chapter.text, stop_after=limits.words - words)
        if words > limits.words:
            raise too_many_words(limits.words)
    return book
