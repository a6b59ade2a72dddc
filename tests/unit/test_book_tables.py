"""What a listener hears of a book's tables and note markers: the parser's text through the
text frontend, as the book pool plans it (segments' text is what is spoken)."""

from __future__ import annotations

import pytest

from models.books.parse import parse_book
from models.books.parse.tables import Cell, read_table
from models.text.frontend import prepare
from tests import bookfiles

LIMITS = bookfiles.limits()


def spoken(text: str) -> str:
    """Every segment's text, in order: what the voice says."""
    return " ".join(s.text for s in prepare(text, "en-us"))


@pytest.fixture(scope="module")
def harvest() -> str:
    book = parse_book(bookfiles.harvest_epub(), "harvest.epub", LIMITS)
    assert [c.title for c in book.chapters] == ["The Harvest Years"]
    return book.chapters[0].text


def test_a_table_row_is_read_cell_by_cell_with_its_headers(harvest):
    said = spoken(harvest)
    # Cells never join into one number, and the header row is not one word.
    assert "million" not in said and "YearBushelsPrice" not in harvest
    # A year under its "Year" header is read as a year.
    assert ("Year: nineteen sixty-one. Bushels: four hundred and twelve. Price: three "
            "dollars and ten cents.") in said
    assert ("Year: nineteen sixty-two. Bushels: three hundred and ninety-eight. Price: "
            "three dollars and twenty-five cents.") in said
    # The header row is read with each cell, not once more on its own; the caption is.
    assert said.count("Bushels") == 2 and "Harvests at Low Field." in said


def test_each_cell_ends_a_segment_sentence_so_the_voice_pauses_there(harvest):
    segments = [s.text for s in prepare(harvest, "en-us")]
    # Every cell's sentence ends where the next begins (a segment never ends mid-cell).
    for cell in ("Year: nineteen sixty-one.",
                 "Bushels: four hundred and twelve.", "Price: three dollars and ten cents."):
        assert any(cell in s for s in segments), segments


def test_note_markers_are_not_read_and_the_notes_come_at_the_chapters_end(harvest):
    said = spoken(harvest)
    assert "soft as cloth. Each season" in said  # not "soft as cloth. one Each season"
    assert "in all. Prices rose after the flood. The farm" in said  # <a><sup>2</sup></a>, [3]
    assert "three" not in said.split("after the flood.")[1].split("sold")[0]
    # A superscript that is no note's marker is still read (square metres).
    assert "m2" in harvest
    # The notes, each where it stood in the page before, now after the chapter's text.
    last = said.index("sold in the spring")
    for note in ("Jute sacks, bought in town.", "Measured by the county surveyor.",
                 "The river rose twice that year."):
        assert said.index(note) > last, note


def test_a_heading_ends_its_sentence(harvest):
    segments = [s.text for s in prepare(harvest, "en-us")]
    assert segments[0].startswith("The Harvest Years. The sacks")


@pytest.mark.parametrize("rows, read", [
    # No header row: cells in order, each a sentence.
    ([[Cell("1961"), Cell("412")], [Cell("1962"), Cell("398")]], ["1961. 412.", "1962. 398."]),
    # A row's own header cell is read as it is; a header spanning two columns names both.
    ([[Cell("", True), Cell("Prices", True, span=2)],
      [Cell("Wheat", True), Cell("$3"), Cell("$4")]], ["Wheat. Prices: $3. Prices: $4."]),
    # A table of a header row alone is read as that row; empty cells are skipped.
    ([[Cell("Year", True), Cell("", True), Cell("Price?", True)]], ["Year. Price?"]),
    # A cell that ends a sentence already keeps its own mark.
    ([[Cell("Notes", True)], [Cell("Wet year!")]], ["Notes: Wet year!"]),
])
def test_the_table_rule(rows, read):
    assert read_table(rows) == read


def test_html_tables_nested_and_headerless_rows_stay_apart():
    html = ("<html><head><title>Ledger</title></head><body><h1>Ledger</h1>"
            "<p>The accounts follow.</p><table><tr><td>1961</td><td>412</td>"
            "<td><p>sold</p><table><tr><td>7</td><td>8</td></tr></table></td></tr></table>"
            "<p>The end.</p></body></html>")
    text = parse_book(html.encode(), "ledger.html", LIMITS).chapters[0].text
    assert "1961. 412. sold 7. 8." in text and "The accounts follow." in text
    assert "million" not in spoken(text)


def test_an_empty_cell_keeps_the_columns_under_their_headers():
    html = ("<html><body><h1>Ledger</h1><p>The accounts follow.</p><table>"
            "<tr><th>Year</th><th>Rye</th><th>Oats</th></tr>"
            "<tr><td>1961</td><td/><td>40</td></tr><tr><td>1962</td><td></td><td>38</td></tr>"
            "</table></body></html>")
    text = parse_book(html.encode(), "ledger.html", LIMITS).chapters[0].text
    assert "Year: 1961. Oats: 40." in text and "Year: 1962. Oats: 38." in text


def test_markdown_pipe_tables_and_footnotes():
    md = ("# Ledger\n\nThe grain was weighed.[^1] Then it was sold.\n\n"
          "| Year | Bushels |\n|------|--------:|\n| 1961 | 412 |\n| 1962 | 398 |\n\n"
          "The end of the ledger.\n\n[^1]: On the mill's own scale.\n")
    text = parse_book(md.encode(), "ledger.md", LIMITS).chapters[0].text
    assert "Year: 1961. Bushels: 412." in text and "Year: 1962. Bushels: 398." in text
    said = spoken(text)
    assert "weighed. Then it was sold." in said and "|" not in said
    assert said.index("On the mill's own scale.") > said.index("The end of the ledger.")
