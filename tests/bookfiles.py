"""Books built in the tests: good EPUBs with ebooklib, and every kind of bad upload by hand."""

from __future__ import annotations

import io
import zipfile

CHAPTERS = [
    ("The Harbour", "The boats came home at dusk. Gulls followed them over the water."),
    ("The Storm", "By midnight the wind had turned. Rain hammered on the roofs."),
    ("The Morning After", "The sea was calm again. Everyone walked down to the beach."),
]


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
              cover: bool = True, extra_docs: bool = True, front: str = "") -> bytes:
    """A real EPUB 3 (with NCX) written by ebooklib: cover, copyright page, nav, chapters;
    `front`: the body of a document before the chapters that the navigation does not name
    (a title page under a name no skip rule knows)."""
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
        doc.content = f"<h1>{ch_title}</h1>" + "".join(
            f"<p>{s.strip()}.</p>" for s in text.split(".") if s.strip())
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
