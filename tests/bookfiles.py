"""Books built in the tests: good EPUBs with ebooklib, and every kind of bad upload by hand."""

from __future__ import annotations

import io
import zipfile

from models.books.parse import BookLimits

CHAPTERS = [
    ("The Harbour", "The boats came home at dusk. Gulls followed them over the water."),
    ("The Storm", "By midnight the wind had turned. Rain hammered on the roofs."),
    ("The Morning After", "The sea was calm again. Everyone walked down to the beach."),
]


def limits(**changes) -> BookLimits:
    """The caps a web process holds a book to, from the default settings and `changes`
    (`max_book_words=1000`)."""
    from app.settings import Settings
    from web.book_upload import book_limits

    return book_limits(Settings().with_(**changes))


def tiny_png() -> bytes:
    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format="image2pipe") as c:
        s = c.add_stream("png", rate=1)
        s.width, s.height, s.pix_fmt = 16, 16, "rgb24"
        frame = av.VideoFrame.from_ndarray(np.full((16, 16, 3), 200, np.uint8), format="rgb24")
        for p in [*s.encode(frame), *s.encode(None)]:
            c.mux(p)
    return buf.getvalue()


def make_epub(chapters=CHAPTERS, title: str = "Harbour Tales", author: str = "Ann Writer",
              cover: bool = True, extra_docs: bool = True, front: str = "",
              xhtml: bool = False) -> bytes:
    """A real EPUB 3 (with NCX) written by ebooklib: cover, copyright page, nav, chapters;
    `front`: the body of a document before the chapters that the navigation does not name
    (a title page under a name no skip rule knows); `xhtml`: each chapter's text is its
    body's markup as given (tables, notes), else sentences made paragraphs."""
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("urn:uuid:voxfarm-test-" + title.replace(" ", "-"))
    book.set_title(title)
    book.set_language("en")
    book.add_author(author)
    if cover:
        book.set_cover("cover.png", tiny_png())
    items = []
    if extra_docs:
        rights = epub.EpubHtml(title="Copyright", file_name="copyright.xhtml", lang="en")
        rights.content = "<h1>Copyright</h1><p>All rights reserved. Printed nowhere.</p>"
        book.add_item(rights)
        items.append(rights)
    if front:
        page = epub.EpubHtml(title="Opening", file_name="opening.xhtml", lang="en")
        page.content = front
        book.add_item(page)
        items.insert(0, page)
    docs = []
    for i, (ch_title, text) in enumerate(chapters, 1):
        doc = epub.EpubHtml(title=ch_title, file_name=f"chap_{i:02d}.xhtml", lang="en")
        doc.content = f"<h1>{ch_title}</h1>" + (text if xhtml else "".join(
            f"<p>{s.strip()}.</p>" for s in text.split(".") if s.strip()))
        book.add_item(doc)
        docs.append(doc)
    if extra_docs:
        empty = epub.EpubHtml(title="Blank", file_name="blank.xhtml", lang="en")
        empty.content = "<div> </div>"
        book.add_item(empty)
        items.append(empty)
    book.toc = [epub.Link(d.file_name, t, f"c{i}") for i, (d, (t, _)) in
                enumerate(zip(docs, chapters, strict=True))]
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    before = 2 if front and extra_docs else 1  # the opening page and the copyright page
    book.spine = ["nav", *items[:before], *docs, *items[before:]]
    out = io.BytesIO()
    epub.write_epub(out, book)
    return out.getvalue()


# A chapter as a history book writes it: a sentence with a note marker (EPUB 3's noteref),
# a table with a header row, markers as <sup> links both ways round, a footnote in the
# middle of the page and one at its end; and a superscript that is no marker (m²).
HARVEST_XHTML = (
    '<p>The sacks were soft as cloth.<sup><a epub:type="noteref" href="#n1" id="r1">1</a>'
    '</sup> Each season the farm weighed its grain.</p>'
    '<table><caption>Harvests at Low Field</caption>'
    '<thead><tr><th>Year</th><th>Bushels</th><th>Price</th></tr></thead>'
    '<tbody><tr><td>1961</td><td>412</td><td>$3.10</td></tr>'
    '<tr><td>1962</td><td>398</td><td>$3.25</td></tr></tbody></table>'
    '<aside epub:type="footnote" id="n1"><p>Jute sacks, bought in town.</p></aside>'
    '<p>The field measured 900 m<sup>2</sup> in all.<a href="#n2"><sup>2</sup></a> Prices '
    'rose after the flood.<sup><a role="doc-noteref" href="#n3">[3]</a></sup></p>'
    '<p>The farm was sold in the spring.</p>'
    '<aside epub:type="footnote" id="n2"><p>Measured by the county surveyor.</p></aside>'
    '<aside role="doc-footnote" id="n3"><p>The river rose twice that year.</p></aside>'
)
HARVEST_CHAPTERS = [("The Harvest Years", HARVEST_XHTML)]


def harvest_epub() -> bytes:
    """An EPUB whose chapter holds a table and footnotes (:data:`HARVEST_XHTML`)."""
    return make_epub(HARVEST_CHAPTERS, title="Low Field", author="Ann Writer", cover=False,
                     xhtml=True)


def rezip(epub_bytes: bytes, add: dict[str, bytes] | None = None,
          replace: dict[str, bytes] | None = None) -> bytes:
    """The EPUB with entries added or replaced (for DRM, XXE, traversal variants)."""
    src = zipfile.ZipFile(io.BytesIO(epub_bytes))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = (replace or {}).get(info.filename, src.read(info.filename))
            dst.writestr(info, data)
        for name, data in (add or {}).items():
            dst.writestr(name, data)
    return out.getvalue()


def zip_bomb() -> bytes:
    """A valid-looking EPUB whose one entry inflates 1,000 times (50 MiB from 50 KiB)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr(zipfile.ZipInfo("mimetype"), b"application/epub+zip")
        z.writestr("OEBPS/bomb.xhtml", b"\0" * (50 * 1024 * 1024))
    return out.getvalue()


def many_entry_bomb(entries: int = 190, entry_bytes: int = 1024 * 1024 - 4096) -> bytes:
    """An EPUB that came to a client: `entries` XHTML entries each just under 1 MiB of words
    (under any per-entry floor of a ratio check), 181 MiB of text and 38 million words in
    all from a few hundred KB."""
    words = b"word " * ((entry_bytes - 40) // 5)
    page = b"<html><body><p>" + words + b"</p></body></html>"
    return rezip(make_epub(cover=False), add={f"EPUB/more_{i:03d}.xhtml": page
                                               for i in range(entries)})


_VOCABULARY: list[str] = []


def varied_words(count: int, seed: int = 0) -> str:
    """`count` words of prose that compresses like prose (not like one word repeated)."""
    import random

    if not _VOCABULARY:
        made = random.Random(0)
        _VOCABULARY.extend("".join(made.choice("etaoinshrdlucmfwypvbgk")
                                   for _ in range(made.randint(2, 9))) for _ in range(5000))
    rng = random.Random(seed)
    sentences, left = [], count
    while left > 0:
        n = min(left, rng.randint(6, 18))
        sentences.append(" ".join(rng.choices(_VOCABULARY, k=n)).capitalize() + ".")
        left -= n
    return " ".join(sentences)


def chapters_text(chapters: int, words_each: int = 12) -> str:
    """A plain-text book of `chapters` "Chapter N" headings, each over its own words."""
    return "\n\n".join(f"Chapter {i + 1}\n\n{varied_words(words_each, seed=i)}"
                        for i in range(chapters))


def traversal_epub() -> bytes:
    return rezip(make_epub(), add={"../../etc/evil.xhtml": b"<p>pwned</p>"})


def drm_epub() -> bytes:
    return rezip(make_epub(), add={"META-INF/encryption.xml": (
        b'<?xml version="1.0"?><encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:'
        b'container"/>')})


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
<html xmlns="http://www.w3.org/1999/xhtml"><body><p>&lol3;</p></body></html>"""

XXE = b"""<?xml version="1.0"?>
<!DOCTYPE html [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<html xmlns="http://www.w3.org/1999/xhtml"><body><p>&secret;</p></body></html>"""


def entity_epub(payload: bytes = BILLION_LAUGHS) -> bytes:
    return rezip(make_epub(), replace={"EPUB/chap_01.xhtml": payload})


def corrupt_epub() -> bytes:
    """A real EPUB cut in half: the zip's central directory is gone."""
    data = make_epub()
    return data[: len(data) // 2]
