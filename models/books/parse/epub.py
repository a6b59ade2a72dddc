"""EPUB: the spine's documents in reading order, titled by the navigation, with the cover.

The bytes pass :func:`check_epub_archive` before ebooklib opens them. Remote references are
never fetched: ebooklib reads only zip entries, lxml runs with network access off, and the
text is pulled out with :func:`html_blocks` (the stdlib `html.parser`).

Bounded while read: ebooklib inflates every entry it reads through one :class:`Unpacked`
(a manifest naming one entry a thousand times counts it a thousand times), and the words and
chapters are counted per document as the spine is walked, so a book past a cap stops there.
"""

from __future__ import annotations

import io
import posixpath
import re
import warnings

from models.books.parse.book import Book, BookError, Chapter, one_line, with_front_matter
from models.books.parse.epub_safety import check_epub_archive
from models.books.parse.html import html_blocks, spoken
from models.books.parse.limits import BookLimits, Budget, Unpacked

_SKIP_NAMES = re.compile(r"(^|[/_\-.])(cover|copyright|toc|nav|titlepage|title-page)"
                         r"([/_\-.]|\d|$)", re.IGNORECASE)
# epub:type / role values of a document that is no chapter.
_SKIP_TYPES = ("cover", "toc", "copyright-page", "landmarks", "page-list", "titlepage")


def _read_epub(data: bytes, unpacked_bytes: int):
    """ebooklib's `read_epub`, every entry it reads inflated through one :class:`Unpacked`."""
    # ebooklib loads when an EPUB is read
    from ebooklib import epub

    class BoundedReader(epub.EpubReader):
        unpacked: Unpacked | None = None

        def read_file(self, name: str) -> bytes:
            if self.unpacked is None or self.unpacked.zf is not self.zf:
                self.unpacked = Unpacked(self.zf, unpacked_bytes)
            return self.unpacked.read(posixpath.normpath(name))

    reader = BoundedReader(io.BytesIO(data), {"ignore_ncx": False})
    book = reader.load()
    reader.process()
    return book


def parse_epub(data: bytes, limits: BookLimits, budget: Budget | None = None) -> Book:
    zf = check_epub_archive(data, limits)
    zf.close()
    budget = budget or Budget(limits)
    # ebooklib loads when an EPUB is read
    import ebooklib
    from ebooklib import epub

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            book = _read_epub(data, limits.unpacked_bytes)
    except BookError:
        raise
    except Exception as exc:  # ebooklib raises anything from KeyError to EpubException
        raise BookError("corrupt_epub",
                        f"the EPUB cannot be read: {exc.__class__.__name__}: {exc}") from None

    def meta(name: str) -> str:
        values = book.get_metadata("DC", name)
        return one_line(values[0][0]) if values and values[0][0] else ""

    toc_titles = _toc_titles(book.toc)
    skip = _guide_skips(book)
    chapters: list[Chapter] = []
    # Front matter: the documents before the first one the navigation names (a title page
    # under another name, a dedication), when it names any. Their paragraphs, not their
    # headings (the book's title again, "Dedication"), go through `with_front_matter`.
    front: list[str] = []
    for idref, _linear in book.spine:
        item = book.get_item_with_id(idref)
        if item is None or item.get_type() != ebooklib.ITEM_DOCUMENT:
            continue
        name = item.get_name()
        if isinstance(item, epub.EpubNav) or name in skip or _SKIP_NAMES.search(
                posixpath.basename(name)):
            continue
        doc = html_blocks(item.get_content().decode("utf-8", errors="replace"), budget)
        if doc.doc_types & set(_SKIP_TYPES):
            continue
        text = "\n\n".join(spoken(doc.blocks))
        if not any(re.search(r"\w", t) for tag, t in doc.blocks if tag == "p"):
            continue  # no text but headings (a part-title page): no body, as in finish()
        if toc_titles and not chapters and name not in toc_titles:
            front += [t for tag, t in doc.blocks if tag == "p"]
            continue
        heading = next((t for tag, t in doc.blocks if tag in ("h1", "h2", "h3")), "")
        title = toc_titles.get(name) or heading or one_line(doc.title)
        if title and not text.startswith(title):
            text = f"{title}.\n\n{text}"
        budget.add_chapter()
        chapters.append(Chapter(title, text))

    cover, cover_mime = _cover(book)
    language = meta("language") or None
    title = meta("title")
    return Book(title, meta("creator"), with_front_matter("\n\n".join(front), chapters, title),
                cover=cover, cover_mime=cover_mime, language=language, source_format="epub")


def _toc_titles(toc) -> dict[str, str]:
    """href (without fragment) -> the first title the navigation gives it."""
    out: dict[str, str] = {}

    def walk(entries) -> None:
        for entry in entries:
            if isinstance(entry, tuple | list) and len(entry) == 2:
                section, children = entry
                _add(section)
                walk(children)
            else:
                _add(entry)

    def _add(link) -> None:
        href = getattr(link, "href", None)
        title = getattr(link, "title", None)
        if href and title:
            out.setdefault(href.split("#")[0], one_line(title))

    walk(toc or [])
    return out


def _guide_skips(book) -> set[str]:
    skip = set()
    for ref in getattr(book, "guide", []) or []:
        if str(ref.get("type", "")).lower() in ("cover", "toc", "copyright-page", "title-page"):
            skip.add(str(ref.get("href", "")).split("#")[0])
    return skip


def _cover(book) -> tuple[bytes | None, str | None]:
    # ebooklib loads when an EPUB is read
    import ebooklib

    candidates = list(book.get_items_of_type(ebooklib.ITEM_COVER))
    cover_ids = [v[1].get("content") for v in book.get_metadata("OPF", "cover") if v[1]]
    candidates += [i for i in book.get_items_of_type(ebooklib.ITEM_IMAGE)
                   if i.get_id() in cover_ids or "cover" in i.get_name().lower()]
    for item in candidates:
        mime = getattr(item, "media_type", "") or ""
        if mime in ("image/jpeg", "image/png"):
            return item.get_content(), mime
    return None, None
