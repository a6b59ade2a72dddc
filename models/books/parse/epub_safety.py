"""The checks an EPUB passes before any EPUB library sees its bytes.

Uploads are hostile until proven otherwise, so :func:`check_epub_archive` insists on:

- a zip at all, with the `mimetype` entry an EPUB has (else: not the format it claims);
- at most :data:`MAX_ENTRIES` entries, and all entries together (never one at a time: 190
  entries each under a per-entry floor pass any per-entry rule) at most the book's
  `unpacked_bytes` declared, expanding at most `unpacked_ratio` times (a zip bomb; an
  archive under :data:`RATIO_MIN_BYTES` in all harms nobody whatever its ratio). Python's
  zipfile stops inflating at the declared size and checks the CRC, so the declared sizes are
  binding, and every entry read here is inflated through :class:`Unpacked` besides, which
  counts all entries' bytes together and stops at the cap;
- no entry name with `..`, a leading `/` or a drive letter (path traversal);
- no `META-INF/encryption.xml` (DRM: the text is encrypted, there is nothing to read);
- every XML entry (container, OPF, NCX, XHTML) parsing with defusedxml, which refuses entity
  declarations (billion laughs) and external references (XXE) outright.
"""

from __future__ import annotations

import io
import re
import zipfile
import zlib

from models.books.parse.book import BookError
from models.books.parse.limits import BookLimits, BookTooLarge, Unpacked, unpacked_too_large

MAX_ENTRIES = 2_000
# The ratio is only judged on archives big enough to matter: a small EPUB of XHTML full of
# indentation may well compress 200:1 and harms nobody.
RATIO_MIN_BYTES = 1024 * 1024

_XML_SUFFIXES = (".xml", ".opf", ".ncx", ".xhtml", ".html", ".htm", ".svg", ".smil")


def check_epub_archive(data: bytes, limits: BookLimits) -> zipfile.ZipFile:
    """The checks that come before any EPUB library sees the bytes. Raises BookError
    (BookTooLarge past a cap)."""
    if not data.startswith(b"PK\x03\x04"):
        raise BookError("wrong_format", "the file is not an EPUB (an EPUB is a zip archive)")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise BookError("corrupt_epub", f"the EPUB is damaged: {exc}") from None
    if len(infos) > MAX_ENTRIES:
        raise BookTooLarge("archive_too_large", f"the EPUB has {len(infos):,} entries; the limit"
                           f" is {MAX_ENTRIES:,}", MAX_ENTRIES, "entries")
    unpacked = stored = 0
    for info in infos:
        name = info.filename
        if (name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name)
                or ".." in re.split(r"[/\\]", name)):
            raise BookError("unsafe_archive", f"the EPUB has an unsafe entry name '{name}'")
        unpacked += info.file_size
        stored += info.compress_size
    # Decided on the declared sizes before anything is inflated (they bind: see above).
    if unpacked > limits.unpacked_bytes:
        raise unpacked_too_large(limits.unpacked_bytes)
    if unpacked > RATIO_MIN_BYTES and unpacked > limits.unpacked_ratio * max(1, stored):
        raise BookTooLarge("archive_too_large", f"the EPUB's entries expand "
                           f"{unpacked // max(1, stored):,} times in all; the limit is "
                           f"{limits.unpacked_ratio:g} (a zip bomb?)", limits.unpacked_ratio,
                           "ratio")
    names = {i.filename for i in infos}
    if "META-INF/encryption.xml" in names:
        raise BookError("drm_protected",
                        "the EPUB is encrypted (DRM); only DRM-free books can be read")
    try:
        if zf.read("mimetype").strip() != b"application/epub+zip":
            raise BookError("wrong_format", "the zip is not an EPUB (wrong 'mimetype' entry)")
    except KeyError:
        raise BookError("wrong_format", "the zip is not an EPUB (no 'mimetype' entry)") from None
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise BookError("corrupt_epub", f"the EPUB is damaged: {exc}") from None
    if "META-INF/container.xml" not in names:
        raise BookError("corrupt_epub", "the EPUB has no META-INF/container.xml")
    reader = Unpacked(zf, limits.unpacked_bytes)
    for info in infos:
        if info.filename.lower().endswith(_XML_SUFFIXES):
            _check_xml(reader, info.filename)
    return zf


class _NoTree:
    """An XML parser's target that keeps nothing: the check needs the parse, not a tree (a
    tree of a 40 MB XHTML entry of empty spans took 650 MB; this, the entry's own bytes)."""

    def close(self) -> None:
        return None


def _check_xml(reader: Unpacked, name: str) -> None:
    # defusedxml loads when an EPUB is read
    from defusedxml import DefusedXmlException
    from defusedxml.ElementTree import DefusedXMLParser, ParseError

    raw = reader.read(name)
    try:
        parser = DefusedXMLParser(target=_NoTree(), forbid_dtd=False, forbid_entities=True,
                                  forbid_external=True)
        parser.feed(raw)
        parser.close()
    except DefusedXmlException:
        raise BookError("unsafe_xml", f"'{name}' declares XML entities or external references;"
                        " they are refused (entity expansion, XXE)") from None
    except ParseError as exc:
        # XHTML with HTML entities (&nbsp;) is not well-formed XML but readable as HTML:
        # only the package files must be strict XML.
        if not name.lower().endswith((".xhtml", ".html", ".htm", ".svg")):
            raise BookError("corrupt_epub", f"'{name}' is not well-formed XML: {exc}") from None
