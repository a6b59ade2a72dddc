"""A book's caps, decided while it is read: an EPUB's entries counted together (no per-entry
floor to slip under), words and chapters counted as the text comes out of the file."""

from __future__ import annotations

import io
import random
import zipfile

import pytest

from models.books.parse import (
    Book,
    BookTooLarge,
    Chapter,
    check_book,
    count_words,
    finish,
    parse_book,
)
from models.books.parse.limits import Unpacked
from tests import bookfiles

LIMITS = bookfiles.limits()


def refusal(data: bytes, name: str, **caps) -> BookTooLarge:
    with pytest.raises(BookTooLarge) as err:
        parse_book(data, name, bookfiles.limits(**caps))
    return err.value


# -- an EPUB's entries, all together -----------------------------------------------------


def test_the_190_entry_bomb_is_refused_on_its_entries_together():
    # Each entry is just under the 1 MiB floor a per-entry ratio check had; together they are
    # 181 MiB of text from 324 KB. Refused on the declared sizes, before any entry inflates.
    err = refusal(bookfiles.many_entry_bomb(), "b.epub")
    assert (err.code, err.unit, err.limit) == ("archive_too_large", "bytes",
                                               LIMITS.unpacked_bytes)


def test_many_small_entries_are_judged_by_their_ratio_together():
    # 190 entries of 100 KB: each far under any per-entry floor, 19 MB in all (under the
    # unpacked cap), but the archive expands hundreds of times.
    data = bookfiles.many_entry_bomb(entry_bytes=100 * 1024)
    err = refusal(data, "b.epub")
    assert (err.code, err.unit, err.limit) == ("archive_too_large", "ratio",
                                               LIMITS.unpacked_ratio)


def _opf_naming_one_chapter(times: int, chapter_words: int) -> bytes:
    """An EPUB whose manifest names one chapter entry `times` times: its declared size counts
    once, yet a reader that follows the manifest inflates it `times` times."""
    src = bookfiles.make_epub([("One", bookfiles.varied_words(chapter_words))], cover=False,
                              extra_docs=False)
    opf = zipfile.ZipFile(io.BytesIO(src)).read("EPUB/content.opf").decode()
    items = "".join(f'<item href="chap_01.xhtml" id="again_{i}" '
                    'media-type="application/xhtml+xml"/>' for i in range(times))
    return bookfiles.rezip(src, replace={
        "EPUB/content.opf": opf.replace("</manifest>", items + "</manifest>").encode()})


def test_entries_read_again_count_again():
    data = _opf_naming_one_chapter(times=40, chapter_words=20_000)
    size = zipfile.ZipFile(io.BytesIO(data)).getinfo("EPUB/chap_01.xhtml").file_size
    cap = 10 * size  # the archive declares ~1x; the manifest reads it 41 times
    assert parse_book(data, "b.epub", bookfiles.limits(max_book_unpacked_bytes=50 * size))
    err = refusal(data, "b.epub", max_book_unpacked_bytes=cap)
    assert (err.code, err.unit, err.limit) == ("archive_too_large", "bytes", cap)


def test_the_reader_stops_within_one_read_of_the_cap():
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(5):
            z.writestr(f"e{i}", b"x" * 300_000)
    reader = Unpacked(zipfile.ZipFile(out), 1_000_000)
    assert len(reader.read("e0")) + len(reader.read("e1")) + len(reader.read("e2")) == 900_000
    with pytest.raises(BookTooLarge):
        reader.read("e3")
    assert reader.total <= 1_000_000 + 256 * 1024


def test_a_real_book_with_pictures_is_within_the_caps():
    book = parse_book(bookfiles.make_epub(), "b.epub", LIMITS)
    assert len(book.chapters) == 3


# -- words -----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_words_counted_in_slices_are_the_words_split(seed):
    rng = random.Random(seed)
    spaces = [" ", "  ", "\n", "\t", "\u3000", "\u00a0 "]
    text = "".join(rng.choice(["word", "x", "长句子", *spaces]) for _ in range(120_000))
    assert count_words(text) == len(text.split())
    assert count_words(text, stop_after=10) > 10


@pytest.mark.parametrize("name, make", [
    ("b.txt", lambda words: bookfiles.varied_words(words)),
    ("b.md", lambda words: "# Book\n\n" + bookfiles.varied_words(words)),
    ("b.html", lambda words: f"<h1>Book</h1><p>{bookfiles.varied_words(words)}</p>"),
    ("b.epub", lambda words: bookfiles.make_epub([("One", bookfiles.varied_words(words))])),
])
def test_a_book_over_the_word_cap_is_refused(name, make):
    data = make(3_000)
    data = data if isinstance(data, bytes) else data.encode()
    assert parse_book(data, name, bookfiles.limits(max_book_words=4_000))
    err = refusal(data, name, max_book_words=2_000)
    assert (err.code, err.unit, err.limit) == ("too_many_words", "words", 2_000)


def test_the_word_cap_is_the_words_read_aloud():
    book = parse_book(bookfiles.varied_words(1_000).encode(), "b.txt", LIMITS)
    assert book.words == 1_000
    assert parse_book(bookfiles.varied_words(1_000).encode(), "b.txt",
                      bookfiles.limits(max_book_words=1_000)).words == 1_000


# -- chapters --------------------------------------------------------------------------------


@pytest.mark.parametrize("name, make", [
    ("b.txt", lambda n: bookfiles.chapters_text(n).encode()),
    ("b.md", lambda n: "\n\n".join(f"# Part {i}\n\n{bookfiles.varied_words(9, i)}"
                                   for i in range(n)).encode()),
    ("b.html", lambda n: "".join(f"<h1>Part {i}</h1><p>{bookfiles.varied_words(9, i)}</p>"
                                 for i in range(n)).encode()),
    ("b.epub", lambda n: bookfiles.make_epub([(f"Part {i}", bookfiles.varied_words(9, i))
                                              for i in range(n)])),
])
def test_a_book_over_the_chapter_cap_is_refused(name, make):
    data = make(12)
    assert len(parse_book(data, name, bookfiles.limits(max_book_chapters=12)).chapters) == 12
    err = refusal(data, name, max_book_chapters=11)
    assert (err.code, err.unit, err.limit) == ("too_many_chapters", "chapters", 11)


def test_a_table_of_contents_is_no_chapters():
    # The headings listed before the chapters count for nothing: 12 chapters, 24 headings.
    toc = "\n".join(f"Chapter {i + 1}" for i in range(12))
    data = f"Contents\n\n{toc}\n\n{bookfiles.chapters_text(12)}".encode()
    book = parse_book(data, "b.txt", bookfiles.limits(max_book_chapters=12))
    assert len(book.chapters) == 12


def test_a_million_heading_lines_hold_no_million_chapters():
    # Under the word cap (a heading is a word or two) but a heading a line: the chapters
    # without text are never held, so the file is a single chapter's book.
    data = ("第一章\n" * 200_000 + "第二章\n" + bookfiles.varied_words(50)).encode()
    book = parse_book(data, "b.txt", LIMITS)
    assert [c.title for c in book.chapters] == ["第二章"]


def test_a_json_book_is_held_to_the_same_caps():
    book = finish(Book("T", "", [Chapter(f"C{i}", bookfiles.varied_words(100, i))
                                 for i in range(5)]))
    assert check_book(book, bookfiles.limits(max_book_words=500, max_book_chapters=5))
    with pytest.raises(BookTooLarge) as err:
        check_book(book, bookfiles.limits(max_book_words=499))
    assert err.value.code == "too_many_words"
    with pytest.raises(BookTooLarge) as err:
        check_book(book, bookfiles.limits(max_book_chapters=4))
    assert err.value.code == "too_many_chapters"
