"""The book every format parses to, and the one rule that tidies it (:func:`finish`)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

MAX_TITLE_CHARS = 200
# Words are counted a slice at a time: `str.split()` on a whole 100 MB text builds a list of
# millions of strings (hundreds of MB) only to take its length.
_WORD_SLICE = 64 * 1024


class BookError(ValueError):
    """The upload cannot become a book. `code` says why, for the API's error body."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __reduce__(self):  # keep the fields when the error crosses a process boundary
        return (type(self), (self.code, self.message))


@dataclass(frozen=True)
class Chapter:
    title: str
    text: str


@dataclass
class Book:
    title: str
    author: str
    chapters: list[Chapter]
    cover: bytes | None = None
    cover_mime: str | None = None
    language: str | None = None
    source_format: str = "json"
    warnings: list[str] = field(default_factory=list)

    def digest(self) -> str:
        """A hash of what is spoken and shown: same book, same digest, whatever the file."""
        h = hashlib.sha256()
        h.update(json.dumps([self.title, self.author,
                             [[c.title, c.text] for c in self.chapters]],
                            ensure_ascii=False).encode())
        if self.cover:
            h.update(hashlib.sha256(self.cover).digest())
        return h.hexdigest()

    def to_json(self) -> dict:
        return {"title": self.title, "author": self.author, "language": self.language,
                "cover_mime": self.cover_mime if self.cover else None,
                "source_format": self.source_format,
                "chapters": [{"title": c.title, "text": c.text} for c in self.chapters]}

    @property
    def words(self) -> int:
        return sum(count_words(c.text) for c in self.chapters)


def count_words(text: str, stop_after: int | None = None) -> int:
    """The whitespace-separated words of `text` (as `len(text.split())`), counted a slice at a
    time; once over `stop_after` the count stops there (the caller only needs to know)."""
    if len(text) <= _WORD_SLICE:
        return len(text.split())
    words, joined = 0, False
    for start in range(0, len(text), _WORD_SLICE):
        piece = text[start:start + _WORD_SLICE]
        words += len(piece.split())
        if joined and not piece[0].isspace():
            words -= 1  # the slice cut a word in two
        joined = not piece[-1].isspace()
        if stop_after is not None and words > stop_after:
            break
    return words


def finish(book: Book) -> Book:
    """Drop chapters without body text, bound titles; a book with nothing to read but its
    headings is an error. The same rule for every format: a chapter that is only its title
    (a heading with nothing under it, a table of contents line) is no chapter."""
    chapters: list[Chapter] = []
    for ch in book.chapters:
        text = _tidy(ch.text)
        if not re.search(r"\w", _body_of(Chapter(ch.title, text))):
            continue
        title = one_line(ch.title)[:MAX_TITLE_CHARS] or f"Chapter {len(chapters) + 1}"
        chapters.append(Chapter(title, text))
    if not chapters:
        raise BookError("no_text", "the book has no text to read")
    book.chapters = chapters
    book.title = one_line(book.title)[:MAX_TITLE_CHARS] or "Untitled"
    book.author = one_line(book.author)[:MAX_TITLE_CHARS]
    return book


def with_tags(book: Book, title: str = "", author: str = "") -> Book:
    """`book` with the title and author its tags carry replaced by those given (a user's
    over the file's), each bounded as :func:`finish` bounds them; an empty one keeps the
    book's."""
    if one_line(title):
        book.title = one_line(title)[:MAX_TITLE_CHARS]
    if one_line(author):
        book.author = one_line(author)[:MAX_TITLE_CHARS]
    return book


# Front matter: what stands between a book's title and its first chapter heading. Lines a
# title page holds (a subtitle, a byline, "A Novel") are no reading: at most this many lines
# of at most this many words each, none ending a sentence. Anything else (a preface without
# a heading, an epigraph) is read, at the start of the first chapter, in the file's order.
TITLE_PAGE_MAX_LINES = 3
TITLE_PAGE_MAX_WORDS = 12
_SENTENCE_END = re.compile(r"[.!?…。！？][\"'”’)\]]*$")


def is_title_page(text: str) -> bool:
    """Whether `text` holds only title-page lines (a subtitle, a byline), nothing to read."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return 0 < len(lines) <= TITLE_PAGE_MAX_LINES and all(
        len(line.split()) <= TITLE_PAGE_MAX_WORDS and not _SENTENCE_END.search(line)
        for line in lines)


def with_front_matter(front: str, chapters: list[Chapter], title: str) -> list[Chapter]:
    """`chapters` with the text before the first of them (`front`) placed by the one rule of
    every format: none, or only title-page lines, is dropped; anything else opens the first
    chapter. With no chapter at all, `front` is the whole book: one chapter called `title`."""
    if not chapters:
        return [Chapter(title, front)] if re.search(r"\w", front) else []
    if not re.search(r"\w", front) or is_title_page(front):
        return chapters
    first = chapters[0]
    return [Chapter(first.title, f"{front.strip()}\n\n{first.text}"), *chapters[1:]]


def _body_of(ch: Chapter) -> str:
    """The chapter's text after the title it opens with (the heading a narrator reads)."""
    text = ch.text.lstrip()
    words = ch.title.split()
    if not words:
        return text
    # Matched word by word: the text may space or wrap the title differently.
    opening = re.match(r"\s+".join(map(re.escape, words)), text)
    return text[opening.end():] if opening else text


def one_line(s: str) -> str:
    """`s` with every run of whitespace (newlines too) made one space, and stripped."""
    return re.sub(r"\s+", " ", s or "").strip()


def _tidy(text: str) -> str:
    text = re.sub(r"[ \t\u00a0]+", " ", text.replace("\r\n", "\n"))
    text = re.sub(r"\n[ \t]+", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()
