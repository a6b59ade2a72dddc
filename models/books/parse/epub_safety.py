"""The checks an EPUB passes before any EPUB library sees its bytes.

Uploads are hostile until proven otherwise, so :func:`check_epub_archive` insists on:

- a zip at all, with the `mimetype` entry an EPUB has (else: not the format it claims);
- at most :data:`MAX_ENTRIES` entries, :data:`MAX_UNCOMPRESSED` bytes uncompressed in all, and
  no entry expanding more than :data:`MAX_RATIO` times (a zip bomb). Python's zipfile stops
  inflating at the declared size and checks the CRC, so the declared sizes are binding;
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

MAX_ENTRIES = 2_000
MAX_UNCOMPRESSED = 200 * 1024 * 1024
MAX_RATIO = 100
# Ratios are only judged on entries big enough to matter: a 2 KB CSS file of spaces may well
# compress 200:1 and harms nobody.
RATIO_MIN_BYTES = 1024 * 1024

_XML_SUFFIXES = (".xml", ".opf", ".ncx", ".xhtml", ".html", ".htm", ".svg", ".smil")


def check_epub_archive(data: bytes) -> zipfile.ZipFile:
    """The checks that come before any EPUB library sees the bytes. Raises BookError."""
    if not data.startswith(b"PK\x03\x04"):
        raise BookError("wrong_format", "the file is not an EPUB (an EPUB is a zip archive)")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise BookError("corrupt_epub", f"the EPUB is damaged: {exc}") from None
    if len(infos) > MAX_ENTRIES:
        raise BookError("archive_too_large",
                        f"the EPUB has {len(infos)} entries; the limit is {MAX_ENTRIES}")
    total = 0
    for info in infos:
        name = info.filename
        if (name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name)
                or ".." in re.split(r"[/\\]", name)):
            raise BookError("unsafe_archive", f"the EPUB has an unsafe entry name '{name}'")
        total += info.file_size
        if (info.file_size > RATIO_MIN_BYTES
                and info.file_size > MAX_RATIO * max(1, info.compress_size)):
            raise BookError("archive_too_large",
                            f"entry '{name}' expands {info.file_size // max(1, info.compress_size)}"
                            f" times; the limit is {MAX_RATIO} (a zip bomb?)")
    if total > MAX_UNCOMPRESSED:
        raise BookError("archive_too_large",
                        f"the EPUB expands to {total} bytes; the limit is {MAX_UNCOMPRESSED}")
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
    for info in infos:
        if info.filename.lower().endswith(_XML_SUFFIXES):
            _check_xml(zf, info.filename)
    return zf


def _check_xml(zf: zipfile.ZipFile, name: str) -> None:
    # defusedxml loads when an EPUB is read
    from defusedxml import DefusedXmlException
    from defusedxml.ElementTree import ParseError, fromstring

    try:
        raw = zf.read(name)
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise BookError("corrupt_epub", f"the EPUB entry '{name}' is damaged: {exc}") from None
    try:
        fromstring(raw, forbid_dtd=False, forbid_entities=True, forbid_external=True)
    except DefusedXmlException:
        raise BookError("unsafe_xml", f"'{name}' declares XML entities or external references;"
                        " they are refused (entity expansion, XXE)") from None
    except ParseError as exc:
        # XHTML with HTML entities (&nbsp;) is not well-formed XML but readable as HTML:
        # only the package files must be strict XML.
        if not name.lower().endswith((".xhtml", ".html", ".htm", ".svg")):
            raise BookError("corrupt_epub", f"'{name}' is not well-formed XML: {exc}") from None
