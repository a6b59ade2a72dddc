"""Tables as a narrator reads them: a row cell by cell, each cell a sentence of its own, a
data cell after its column's header ("Year: 1961. Bushels: 412. Price: $3.10.").

Why cells are sentences: a table's cells are separate values. Run together as a paragraph's
words they join ("1961" and "412" in adjacent cells were one number, 1,961,412) and the
header row was one word ("YearBushelsPrice"). The text frontend cuts and pauses at a
sentence's end (models/text/segmenting.py), so a full stop after each cell is a pause it
honours. A comma would not do: numbers are read with commas of their own ("one thousand,
nine hundred and sixty-one"), and a listener could not tell where one cell ends.

Why headers before each cell: a column of figures means nothing without its name, and a
listener cannot glance back up at the header row. So a first row made only of header cells
(`<th>`, or the rows of `<thead>`; in Markdown the row above the `---` line) names the
columns and is not read on its own; each data cell is read as "Name: value.". A header cell
in a data row (the row's own name) is read as it is. A table of one header row and nothing
else is read as that row. Empty cells are skipped (with their header).

The HTML reader (:mod:`.html`) and the Markdown reader (:mod:`.markdown`) collect the cells;
this module holds the one rule both read them by.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from models.books.parse.book import one_line

# The end of a sentence already there (closing quotes and brackets may follow it).
_ENDS_SENTENCE = re.compile(r"[.!?…。！？][\"'”’)\]」』）]*$")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]$")


@dataclass(frozen=True)
class Cell:
    """One cell as the file gives it: its text, whether it is a header cell, and how many
    columns it spans."""

    text: str
    header: bool = False
    span: int = 1


def as_sentence(text: str) -> str:
    """`text` ending a sentence: a full stop added unless it ends one already (`。` after
    Chinese or Japanese, whose segmenter ends sentences there)."""
    text = one_line(text)
    if not text or _ENDS_SENTENCE.search(text):
        return text
    return text + ("。" if _CJK.search(text) else ".")


def _column_names(first: list[Cell]) -> list[str]:
    """The name of each column from a header row (a cell spanning two columns names both)."""
    names: list[str] = []
    for cell in first:
        names += [one_line(cell.text).rstrip(":：").strip()] * max(1, cell.span)
    return names


def _read_cell(cell: Cell, name: str) -> str:
    text = one_line(cell.text)
    if name and not cell.header and name.lower() != text.lower():
        text = f"{name}: {text}"
    return as_sentence(text)


def read_table(rows: list[list[Cell]]) -> list[str]:
    """What is read of a table: one string a row, each cell a sentence (see the module's
    docstring for the rule). Rows with no text are left out."""
    rows = [row for row in rows if any(one_line(c.text) for c in row)]
    names: list[str] = []
    if len(rows) > 1 and all(c.header for c in rows[0] if one_line(c.text)):
        names, rows = _column_names(rows[0]), rows[1:]
    spoken = []
    for row in rows:
        parts, column = [], 0
        for cell in row:
            if one_line(cell.text):
                parts.append(_read_cell(cell, names[column] if column < len(names) else ""))
            column += max(1, cell.span)
        if parts:
            spoken.append(" ".join(parts))
    return spoken
