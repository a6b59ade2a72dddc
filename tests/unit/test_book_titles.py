"""A plain-text or Markdown book's title and author from its opening lines or front matter,
and those lines not read as its text."""

from __future__ import annotations

import pytest

from models.books.parse import parse_book
from models.books.parse.titles import byline, display_case
from tests import bookfiles

LIMITS = bookfiles.limits()
BODY = "The road ran white with salt. Carts came down it every morning."


def parsed(text: str, name: str):
    return parse_book(text.encode(), name, LIMITS)


def read(book) -> str:
    return " ".join(c.text for c in book.chapters)


@pytest.mark.parametrize("opening", [
    "THE SALT ROAD\nby A. Newcomer\n\n",
    "THE SALT ROAD\n\nby A. Newcomer\n\n",
    "\n\nThe Salt Road\nA Story of the Coast\nBY A. NEWCOMER\n\n",
])
def test_a_text_books_title_and_author_come_from_its_opening_lines(opening):
    book = parsed(opening + BODY, "saltroad.txt")
    assert (book.title, book.author) == ("The Salt Road", "A. Newcomer")
    # One chapter, named as the book, and the title page is not read as its text.
    assert [c.title for c in book.chapters] == ["The Salt Road"]
    assert read(book) == BODY


def test_a_text_books_title_page_before_its_chapters():
    book = parsed(f"THE SALT ROAD\nby A. Newcomer\n\nChapter 1\n{BODY}\n\nChapter 2\nMore.\n",
                  "saltroad.txt")
    assert (book.title, book.author) == ("The Salt Road", "A. Newcomer")
    assert [c.title for c in book.chapters] == ["Chapter 1", "Chapter 2"]
    assert "SALT ROAD" not in read(book) and "Newcomer" not in read(book)


def test_a_text_books_own_title_and_author_lines_name_it():
    text = ("The Project Gutenberg eBook of The Salt Road\n\nThis ebook is for the use of "
            "anyone anywhere.\n\nTitle: The Salt Road\n\nAuthor: A. Newcomer\n\n"
            f"Release date: May 1, 2024\n\n{BODY}\n")
    book = parsed(text, "pg1234.txt")
    assert (book.title, book.author) == ("The Salt Road", "A. Newcomer")
    assert BODY in read(book)


@pytest.mark.parametrize("text", [
    BODY,  # prose from the first line
    f"Chapter 1\n{BODY}",  # a chapter heading first
    "THE SALT ROAD",  # a title and nothing else: then it is the text
    "Dear Tom,\nThe carts came down today.\n",  # a letter's opening is no title
    f"by A. Newcomer\n\n{BODY}",  # a byline alone is no title
])
def test_text_without_a_title_page_keeps_the_file_name_and_every_word(text):
    book = parsed(text, "saltroad.txt")
    assert (book.title, book.author) == ("saltroad", "")
    assert read(book).replace(".", " ").split() == text.replace(".", " ").split()


@pytest.mark.parametrize("md", [
    f"# The Salt Road\n\n*by A. Newcomer*\n\n{BODY}\n",
    f"The Salt Road\n=============\n\nby A. Newcomer\n\n{BODY}\n",
    f"---\ntitle: \"The Salt Road\"\nauthor: A. Newcomer\nlang: en\n---\n\n{BODY}\n",
    f"---\ntitle: The Salt Road\nauthor:\n  - A. Newcomer\n---\n# The Salt Road\n\n{BODY}\n",
    f"THE SALT ROAD\n_by A. Newcomer_\n\n{BODY}\n",
])
def test_a_markdown_books_title_and_author(md):
    book = parsed(md, "saltroad.md")
    assert (book.title, book.author) == ("The Salt Road", "A. Newcomer")
    text = read(book)
    assert "Newcomer" not in text and "title:" not in text and "---" not in text
    assert BODY in text


def test_markdown_byline_under_the_title_with_chapters():
    md = (f"# The Salt Road\n\n*by A. Newcomer*\n\n## Morning\n\n{BODY}\n\n"
          "## Evening\n\nThe carts went home.\n")
    book = parsed(md, "saltroad.md")
    assert (book.title, book.author) == ("The Salt Road", "A. Newcomer")
    assert [c.title for c in book.chapters] == ["Morning", "Evening"]
    assert "Newcomer" not in read(book)


@pytest.mark.parametrize("line, name", [
    ("by A. Newcomer", "A. Newcomer"), ("*By Ann Writer*", "Ann Writer"),
    ("BY J. R. R. TOLKIEN", "J. R. R. TOLKIEN"), ("by the sea we walked for many long hours", None),
    ("bystanders", None), ("by 1961", None),
])
def test_what_a_byline_is(line, name):
    assert byline(line) == name


@pytest.mark.parametrize("text, shown", [
    ("THE SALT ROAD", "The Salt Road"), ("WAR AND PEACE", "War and Peace"),
    ("THE KING'S ROAD", "The King's Road"), ("A. NEWCOMER", "A. Newcomer"),
    ("The Salt Road", "The Salt Road"), ("eBook of iOS", "eBook of iOS"), ("盐路", "盐路"),
])
def test_a_title_in_capitals_is_shown_in_title_case(text, shown):
    assert display_case(text) == shown
