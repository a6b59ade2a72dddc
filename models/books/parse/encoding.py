"""The text of a .txt/.md/.html upload, whatever its encoding; binary data is refused."""

from __future__ import annotations

import codecs
import re

from models.books.parse.book import BookError

_BINARY_MAGIC = (b"PK\x03\x04", b"%PDF", b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"\x1f\x8b",
                 b"7z\xbc\xaf", b"Rar!")
# UTF-32 before UTF-16: FF FE 00 00 starts with FF FE.
_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe\x00\x00", "utf-32-le"),
         (b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))
# Control characters text does not have (whitespace and form feed are text).
_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")
# Bytes looked at to tell encodings apart; deciding on a prefix keeps a 50 MB upload cheap.
_SNIFF_BYTES = 256 * 1024


def decode_text(data: bytes, filename: str) -> str:
    """The text of a .txt/.md/.html upload: UTF-8 (BOM or not), UTF-16 or UTF-32 with a BOM,
    UTF-16 without one (told by where its NUL bytes fall), else a legacy encoding as
    charset-normalizer finds it (Windows-1252/Latin-1 preferred when it fits as well as any:
    the usual legacy encoding of English text). Binary data is refused."""
    binary = BookError("wrong_format", f"'{filename}' is binary, not the text file it claims")
    if data.startswith(_BINARY_MAGIC):
        raise binary
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data[len(bom):].decode(encoding)
            except UnicodeDecodeError:
                raise BookError("wrong_format", f"'{filename}' starts like {encoding.upper()} "
                                "text but is not valid " + encoding.upper()) from None
    head = data[:4096]
    if b"\x00" in head:
        text = _utf16_without_bom(data, head)
        if text is None:
            raise binary
        return text
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    text = _legacy_text(data)
    if text is None:
        raise BookError("wrong_format", f"'{filename}' is not text in an encoding we read "
                        "(UTF-8, UTF-16, or a legacy one such as Windows-1252 or GBK)")
    if not _plausible(text):
        raise binary
    return text


def _plausible(text: str) -> bool:
    """Text, not binary that happened to decode: at most one control character in 1000."""
    sample = text[:_SNIFF_BYTES]
    return len(_CONTROLS.findall(sample)) <= len(sample) // 1000


def _utf16_without_bom(data: bytes, head: bytes) -> str | None:
    """UTF-16 text has NUL bytes where binary has them anywhere: ASCII letters, spaces and
    newlines in UTF-16LE are a letter then a NUL, so NULs fall on odd offsets (even ones in
    UTF-16BE). Chinese has fewer (一, U+4E00, puts one on the other side), so the side with
    more NULs is tried first and the text must then read as text. Binary data has its NULs
    on both sides, or too few of them (random bytes: 1 in 256); UTF-8 with a stray NUL has
    few NULs and still reads as UTF-8."""
    head = head[: len(head) // 2 * 2]
    odd, even = head[1::2].count(0), head[0::2].count(0)
    if odd + even < len(head) // 100:
        return None
    if odd + even < len(head) // 10:
        try:
            codecs.getincrementaldecoder("utf-8")().decode(head)  # a cut last char is fine
            return None
        except UnicodeDecodeError:
            pass
    for encoding in ("utf-16-le", "utf-16-be") if odd > even else ("utf-16-be", "utf-16-le"):
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError:  # odd length, or a lone surrogate: not this one
            continue
        if _plausible(text):
            return text
    return None


def _legacy_text(data: bytes) -> str | None:
    # charset-normalizer loads when an encoding must be guessed
    from charset_normalizer import from_bytes

    # The non-ASCII bytes are what tell encodings apart: the detector gets the lines that
    # have them, not megabytes of ASCII around a single "café".
    sample, size = [], 0
    for line in data.split(b"\n"):
        if not line.isascii():
            sample.append(line)
            size += len(line) + 1
            if size >= _SNIFF_BYTES:
                break
    matches = [m for m in from_bytes(b"\n".join(sample)[:_SNIFF_BYTES])
               if not m.encoding.startswith(("utf_16", "utf_32"))]
    if not matches:
        return None
    # The detector drops cp1252 for Cyrillic, Greek, Hebrew, Arabic and CJK text. Where it
    # keeps it as readable, cp1252 is the answer even when another code page ranks above it:
    # short Western text fits several equally well, and mac_latin2 or cp1250 can even score
    # French a little better ("cafť" for "café").
    western = any("cp1252" in m.could_be_from_charset for m in matches if m.chaos <= 0.2)
    for encoding in ["cp1252"] * western + [m.encoding for m in matches]:
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:  # the sample fitted, the whole file does not
            continue
    return None
