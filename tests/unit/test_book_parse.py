"""Chapter detection and the upload checks, on books built in the test."""

from __future__ import annotations

import pytest

from models.books.parse import Book, BookError, Chapter, finish, parse_book
from models.books.parse.book import is_title_page
from tests import bookfiles

LIMITS = bookfiles.limits()


def titles(book) -> list[str]:
    return [c.title for c in book.chapters]


def test_epub_spine_nav_titles_metadata_and_cover():
    book = parse_book(bookfiles.make_epub(), "harbour.epub", LIMITS)
    assert (book.title, book.author, book.language) == ("Harbour Tales", "Ann Writer", "en")
    # cover page, copyright page, the nav document and the blank page are skipped
    assert titles(book) == [t for t, _ in bookfiles.CHAPTERS]
    assert "Gulls followed them over the water" in book.chapters[0].text
    assert book.cover_mime == "image/png" and book.cover.startswith(b"\x89PNG")


def test_plain_text_english_roman_and_chinese_headings():
    text = ("My Novel\n\nA short preface here.\n\nChapter 1\nIt began.\n\nCHAPTER IV\n"
            "It went on.\n\n第三章 归来\n他回来了。\n")
    book = parse_book(text.encode(), "novel.txt", LIMITS)
    assert titles(book) == ["Chapter 1", "CHAPTER IV", "第三章 归来"]
    # The opening line is the book's title (its tag, not read); the preface before the
    # first heading is front matter: read at the start of the first chapter (it holds a
    # sentence), not a chapter of its own.
    assert book.title == "My Novel"
    assert book.chapters[0].text.startswith("A short preface here.\n\nChapter 1.")
    assert "他回来了" in book.chapters[2].text


def test_plain_text_without_headings_is_one_chapter():
    book = parse_book(b"Just a story. Nothing else.", "story.txt", LIMITS)
    assert titles(book) == ["story"] and book.chapters[0].text == "Just a story. Nothing else."


def test_plain_text_table_of_contents_lines_make_no_empty_chapters():
    text = "Contents\nChapter 1\nChapter 2\n\nChapter 1\nOne happens.\n\nChapter 2\nTwo.\n"
    book = parse_book(text.encode(), "b.txt", LIMITS)
    assert [c.text.split(".", 1)[1].strip() for c in book.chapters[-2:]] == ["One happens.",
                                                                             "Two."]


def test_markdown_headings_under_a_title():
    md = ("# The Book\n\n## First\nSome *emphasis* and a [link](http://x).\n\n"
          "## Second\n```\ncode()\n```\nMore text.\n")
    book = parse_book(md.encode(), "b.md", LIMITS)
    assert book.title == "The Book" and titles(book) == ["First", "Second"]
    assert "Some emphasis and a link." in book.chapters[0].text
    assert "code()" not in book.chapters[1].text


def test_html_h1_chapters_skip_scripts():
    html = ("<html><head><title>T</title><script>var x = 1;</script></head><body>"
            "<h1>One</h1><p>Alpha &amp; omega.</p><h1>Two</h1><p>Beta.</p></body></html>")
    book = parse_book(html.encode(), "b.html", LIMITS)
    assert book.title == "T" and titles(book) == ["One", "Two"]
    assert "Alpha & omega." in book.chapters[0].text and "var x" not in book.chapters[0].text


@pytest.mark.parametrize("make, name, code", [
    (bookfiles.zip_bomb, "b.epub", "archive_too_large"),
    (bookfiles.traversal_epub, "b.epub", "unsafe_archive"),
    (bookfiles.drm_epub, "b.epub", "drm_protected"),
    (bookfiles.entity_epub, "b.epub", "unsafe_xml"),
    (lambda: bookfiles.entity_epub(bookfiles.XXE), "b.epub", "unsafe_xml"),
    (bookfiles.corrupt_epub, "b.epub", "corrupt_epub"),
    (lambda: bookfiles.rezip(bookfiles.make_epub(), replace={
        "EPUB/content.opf": b"<package><oops></package>"}), "b.epub", "corrupt_epub"),
    (lambda: b"plain words", "b.epub", "wrong_format"),
    (bookfiles.make_epub, "b.txt", "wrong_format"),
    (lambda: b"\n \n", "b.md", "no_text"),
])
def test_bad_uploads(make, name, code):
    with pytest.raises(BookError) as err:
        parse_book(make(), name, LIMITS)
    assert err.value.code == code


# -- text encodings ------------------------------------------------------

FRENCH = "Le café était fermé. Nous sommes rentrés à pied, sans un mot, jusqu'à la gare."
QUOTES = "\u201cIt\u2019s late,\u201d she said \u2014 and the caf\u00e9 closed \u2026 for good."
ZH = "他回来了。他走进屋里，坐下来喝茶。外面下着雨，院子里很安静。"


@pytest.mark.parametrize("data, text", [
    (FRENCH.encode("utf-8"), FRENCH),
    (b"\xef\xbb\xbf" + FRENCH.encode("utf-8"), FRENCH),
    (FRENCH.encode("latin-1"), FRENCH),
    ("Short café note.".encode("latin-1"), "Short café note."),
    # charset-normalizer ranks mac_latin2 ("cafť") above cp1252 for this one
    (FRENCH[:48].encode("latin-1"), FRENCH[:48]),
    (QUOTES.encode("cp1252"), QUOTES),
    (FRENCH.encode("utf-16-le"), FRENCH),
    (FRENCH.encode("utf-16-be"), FRENCH),
    (b"\xff\xfe" + FRENCH.encode("utf-16-le"), FRENCH),
    (b"\xfe\xff" + FRENCH.encode("utf-16-be"), FRENCH),
    # 一 (U+4E00) puts a NUL on the other side from the newline's and space's
    ("他回来了。\n一切 都很安静。".encode("utf-16-le"), "他回来了。\n一切 都很安静。"),
    (ZH.encode("gb18030"), ZH),
], ids=["utf-8", "utf-8-bom", "latin-1", "latin-1-short", "latin-1-bait", "cp1252-quotes",
        "utf-16le-no-bom", "utf-16be-no-bom", "utf-16le-bom", "utf-16be-bom", "utf-16le-chinese",
        "gbk"])
def test_plain_text_in_common_encodings(data, text):
    book = parse_book(data, "story.txt", LIMITS)
    assert book.chapters[0].text == text


@pytest.mark.parametrize("data", [
    bookfiles.tiny_png(), bookfiles.make_epub(), b"%PDF-1.7\n" + bytes(range(256)) * 8,
    bytes(range(256)) * 64,  # every byte value: NULs and controls, no text pattern
    bytes(b % 250 + 1 for b in range(20_000)),  # no NUL at all, mostly control bytes
    b"Mostly text\x00 with a stray NUL, as UTF-8 never has it.",
], ids=["png", "zip", "pdf", "all-bytes", "controls", "utf-8-with-nul"])
def test_binary_named_txt_is_still_refused(data):
    with pytest.raises(BookError) as err:
        parse_book(data, "story.txt", LIMITS)
    assert err.value.code == "wrong_format"


# -- chapters without body text ------------------------------------------

HEADINGS_ONLY = {
    "txt": ("b.txt", b"Chapter 1\n\nChapter 2\n\nCHAPTER III\n"),
    "md": ("b.md", b"# Chapter 1\n\n# Chapter 2\n\n# Chapter 3\n"),
    "md-under-a-title": ("b.md", b"# The Book\n\n## One\n\n## Two\n"),
    "md-setext": ("b.md", b"One\n===\n\nTwo\n===\n"),
    "html": ("b.html", b"<h1>Chapter 1</h1><h1>Chapter 2</h1>"),
    "html-under-a-title": ("b.html", b"<h1>The Book</h1><h2>One</h2><h2>Two</h2>"),
}


@pytest.mark.parametrize("kind", HEADINGS_ONLY)
def test_book_of_headings_alone_has_no_text(kind):
    name, data = HEADINGS_ONLY[kind]
    with pytest.raises(BookError) as err:
        parse_book(data, name, LIMITS)
    assert err.value.code == "no_text"


def test_epub_of_headings_alone_has_no_text():
    data = bookfiles.make_epub([("Chapter 1", ""), ("Chapter 2", "")], cover=False,
                               extra_docs=False)
    with pytest.raises(BookError) as err:
        parse_book(data, "b.epub", LIMITS)
    assert err.value.code == "no_text"


def test_json_book_of_titles_alone_has_no_text():
    book = Book("T", "", [Chapter("Chapter 1", "Chapter 1."), Chapter("Two", "  Two  "),
                          Chapter("Three", "")])
    with pytest.raises(BookError) as err:
        finish(book)
    assert err.value.code == "no_text"


@pytest.mark.parametrize("name, data", [
    ("b.txt", b"Chapter 1\n\nChapter 2\nIt rained.\n\nChapter 3\n"),
    ("b.md", b"# Chapter 1\n\n# Chapter 2\nIt rained.\n\n# Chapter 3\n"),
    ("b.html", b"<h1>Chapter 1</h1><h1>Chapter 2</h1><p>It rained.</p><h1>Chapter 3</h1>"),
])
def test_title_only_chapters_are_dropped_in_every_format(name, data):
    book = parse_book(data, name, LIMITS)
    assert titles(book) == ["Chapter 2"] and "It rained." in book.chapters[0].text


def test_epub_title_only_chapters_are_dropped():
    data = bookfiles.make_epub([("Chapter 1", ""), ("Chapter 2", "It rained. Then it cleared"),
                                ("Chapter 3", "")], cover=False, extra_docs=False)
    assert titles(parse_book(data, "b.epub", LIMITS)) == ["Chapter 2"]


def test_a_chapter_whose_text_starts_like_its_title_keeps_it():
    book = finish(Book("T", "", [Chapter("The", "The end came quickly."),
                                 Chapter("Chapter 1", "Chapter 12 is later.")]))
    assert titles(book) == ["The", "Chapter 1"]


def test_epub_document_of_headings_alone_is_dropped_whatever_its_toc_title():
    data = bookfiles.make_epub([("One", ""), ("The Storm", "Rain hammered on the roofs")],
                               cover=False, extra_docs=False)
    # The navigation names the page "One"; its headings say more, but are still headings.
    data = bookfiles.rezip(data, replace={"EPUB/chap_01.xhtml": (
        b'<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml"><body>'
        b"<h1>Part One</h1><h2>In which nothing happens</h2></body></html>")})
    assert titles(parse_book(data, "b.epub", LIMITS)) == ["The Storm"]


# -- front matter: the text between the book's title and its first chapter -----------------

GULL_CHAPTERS = [("The Lamp", "The lamp burned all night. Ships passed the rock safely."),
                 ("The Fog", "Then the fog came. Nobody could see the light."),
                 ("The Rescue", "A boat found the rock at dawn. Everyone was saved.")]


def gull_rock(fmt: str, front: list[str]) -> tuple[bytes, str]:
    """The same book in `fmt`: a title, the `front` lines, three chapters."""
    if fmt == "epub":
        page = "<h1>The Keeper of Gull Rock</h1>" + "".join(f"<p>{p}</p>" for p in front)
        return bookfiles.make_epub(GULL_CHAPTERS, title="The Keeper of Gull Rock",
                                   cover=False, extra_docs=False, front=page), "b.epub"
    if fmt == "md":
        body = "".join(f"## {t}\n\n{x}\n\n" for t, x in GULL_CHAPTERS)
        lines = "".join(f"*{p}*\n\n" if len(p.split()) < 6 else f"{p}\n\n" for p in front)
        return f"# The Keeper of Gull Rock\n\n{lines}{body}".encode(), "b.md"
    if fmt == "html":
        body = "".join(f"<h2>{t}</h2><p>{x}</p>" for t, x in GULL_CHAPTERS)
        lines = "".join(f"<p><em>{p}</em></p>" for p in front)
        return (f"<html><body><h1>The Keeper of Gull Rock</h1>{lines}{body}</body></html>"
                .encode(), "b.html")
    body = "".join(f"Chapter {i}: {t}\n{x}\n\n" for i, (t, x) in enumerate(GULL_CHAPTERS, 1))
    lines = "".join(f"{p}\n" for p in front)
    return f"The Keeper of Gull Rock\n{lines}\n{body}".encode(), "b.txt"


@pytest.mark.parametrize("fmt", ["md", "html", "txt", "epub"])
def test_a_subtitle_before_the_first_chapter_is_no_chapter_in_any_format(fmt):
    data, name = gull_rock(fmt, ["A Tale of the Northern Light", "by Ann Writer"])
    book = parse_book(data, name, LIMITS)
    assert len(book.chapters) == 3, titles(book)
    assert titles(book)[0].endswith("The Lamp")
    text = " ".join(c.text for c in book.chapters)
    assert "Northern Light" not in text and "Ann Writer" not in text


@pytest.mark.parametrize("fmt", ["md", "html", "txt", "epub"])
def test_front_matter_that_reads_opens_the_first_chapter_in_any_format(fmt):
    preface = "This story was told to me by my grandfather. He kept the light for forty years."
    data, name = gull_rock(fmt, [preface])
    book = parse_book(data, name, LIMITS)
    assert len(book.chapters) == 3, titles(book)
    first = book.chapters[0].text
    # Read in the file's order: the preface, then the chapter's title and its text.
    assert preface in first and first.index(preface) < first.index("The lamp burned")
    assert preface not in book.chapters[1].text


@pytest.mark.parametrize("front, title_page", [
    ("A Novel", True), ("*The Keeper*\n\nby Ann Writer", True),
    ("It was a dark night.", False), ("\u201cThe sea keeps what it takes.\u201d", False),
    ("one two three four five six seven eight nine ten eleven twelve thirteen", False),
    ("a\nb\nc\nd", False), ("", False),
])
def test_what_counts_as_title_page_lines(front, title_page):
    assert is_title_page(front) is title_page
