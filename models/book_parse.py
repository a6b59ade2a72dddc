"""Books in, chapters out: EPUB, Markdown, HTML and plain text to a `Book` of (title, text).

Pure: bytes and a file name in, a `Book` or a `BookError` out; no network, no Redis.

Uploads are hostile until proven otherwise, so an EPUB passes our own checks before ebooklib
opens it (:func:`check_epub_archive`):

- it is a zip at all, with the `mimetype` entry an EPUB has (else: not the format it claims);
- at most :data:`MAX_ENTRIES` entries, :data:`MAX_UNCOMPRESSED` bytes uncompressed in all, and
  no entry expanding more than :data:`MAX_RATIO` times (a zip bomb). Python's zipfile stops
  inflating at the declared size and checks the CRC, so the declared sizes are binding;
- no entry name with `..`, a leading `/` or a drive letter (path traversal);
- no `META-INF/encryption.xml` (DRM: the text is encrypted, there is nothing to read);
- every XML entry (container, OPF, NCX, XHTML) parses with defusedxml, which refuses entity
  declarations (billion laughs) and external references (XXE) outright.

Remote references are never fetched: ebooklib reads only zip entries, lxml runs with network
access off, and text is pulled out with the stdlib `html.parser`, which expands nothing but
the standard HTML character references.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import json
import posixpath
import re
import zipfile
from dataclasses import dataclass, field
from html.parser import HTMLParser

MAX_ENTRIES = 2_000
MAX_UNCOMPRESSED = 200 * 1024 * 1024
MAX_RATIO = 100
# Ratios are only judged on entries big enough to matter: a 2 KB CSS file of spaces may well
# compress 200:1 and harms nobody.
RATIO_MIN_BYTES = 1024 * 1024
MAX_TITLE_CHARS = 200

EXTENSIONS = {".epub": "epub", ".txt": "text", ".text": "text", ".md": "markdown",
              ".markdown": "markdown", ".html": "html", ".htm": "html", ".xhtml": "html"}


class BookError(ValueError):
    """The upload cannot become a book. `code` says why, for the API's error body."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Chapter:
    title: str
    text: str


@dataclass
class Book:
    title: str
    author: str
    chapters: list[Chapter]
    cover: bytes | None = None
    cover_mime: str | None = None
    language: str | None = None
    source_format: str = "json"
    warnings: list[str] = field(default_factory=list)

    def digest(self) -> str:
        """A hash of what is spoken and shown: same book, same digest, whatever the file."""
        h = hashlib.sha256()
        h.update(json.dumps([self.title, self.author,
                             [[c.title, c.text] for c in self.chapters]],
                            ensure_ascii=False).encode())
        if self.cover:
            h.update(hashlib.sha256(self.cover).digest())
        return h.hexdigest()

    def to_json(self) -> dict:
        return {"title": self.title, "author": self.author, "language": self.language,
                "cover_mime": self.cover_mime if self.cover else None,
                "source_format": self.source_format,
                "chapters": [{"title": c.title, "text": c.text} for c in self.chapters]}

    @property
    def words(self) -> int:
        return sum(len(c.text.split()) for c in self.chapters)


def parse_book(data: bytes, filename: str) -> Book:
    """Parse an upload by its extension. Raises BookError."""
    ext = posixpath.splitext(filename.lower())[1]
    kind = EXTENSIONS.get(ext)
    if kind is None:
        raise BookError("unsupported_format",
                        f"'{filename}' is not a book file; send .epub, .txt, .md or .html")
    stem = posixpath.splitext(posixpath.basename(filename.replace("\\", "/")))[0]
    if kind == "epub":
        book = parse_epub(data)
    else:
        text = _decode_text(data, filename)
        if kind == "markdown":
            book = parse_markdown(text, fallback_title=stem)
        elif kind == "html":
            book = parse_html(text, fallback_title=stem)
        else:
            book = parse_text(text, fallback_title=stem)
    return finish(book)


def finish(book: Book) -> Book:
    """Drop chapters without body text, bound titles; a book with nothing to read but its
    headings is an error. The same rule for every format: a chapter that is only its title
    (a heading with nothing under it, a table of contents line) is no chapter."""
    chapters = []
    for ch in book.chapters:
        text = _tidy(ch.text)
        if not re.search(r"\w", _body_of(Chapter(ch.title, text))):
            continue
        title = _one_line(ch.title)[:MAX_TITLE_CHARS] or f"Chapter {len(chapters) + 1}"
        chapters.append(Chapter(title, text))
    if not chapters:
        raise BookError("no_text", "the book has no text to read")
    book.chapters = chapters
    book.title = _one_line(book.title)[:MAX_TITLE_CHARS] or "Untitled"
    book.author = _one_line(book.author)[:MAX_TITLE_CHARS]
    return book


# -- plain text, Markdown, HTML ------------------------------------------------------------


_BINARY_MAGIC = (b"PK\x03\x04", b"%PDF", b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"\x1f\x8b",
                 b"7z\xbc\xaf", b"Rar!")
# UTF-32 before UTF-16: FF FE 00 00 starts with FF FE.
_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe\x00\x00", "utf-32-le"),
         (b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))
# Control characters text does not have (whitespace and form feed are text).
_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")
# Bytes looked at to tell encodings apart; deciding on a prefix keeps a 50 MB upload cheap.
_SNIFF_BYTES = 256 * 1024


def _decode_text(data: bytes, filename: str) -> str:
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


_TEXT_HEADING = re.compile(
    r"^[ \t]*(?:(?:chapter|CHAPTER|Chapter)[ \t]+(?:\d+|[IVXLCDMivxlcdm]+|[A-Za-z-]+)\b[^\n]*"
    r"|第[0-9〇零一二三四五六七八九十百千两]+[章回节][^\n]*)[ \t]*$",
    re.MULTILINE)


def _split_at(text: str, headings: list[re.Match], fallback_title: str) -> list[Chapter]:
    if not headings:
        return [Chapter(fallback_title, text)]
    chapters = []
    front = text[: headings[0].start()]
    if re.search(r"\w", front):
        chapters.append(Chapter(fallback_title, front))
    for i, m in enumerate(headings):
        end = headings[i + 1].start() if i + 1 < len(headings) else len(text)
        title = m.group("title") if "title" in m.re.groupindex else m.group(0)
        body = text[m.end():end]
        # The listener hears the chapter's title before its text, as a narrator reads it.
        chapters.append(Chapter(title.strip(), f"{title.strip()}.\n\n{body}"))
    return chapters


def parse_text(text: str, fallback_title: str = "Untitled") -> Book:
    """Plain text: "Chapter 1", "CHAPTER IV", "第三章" lines start chapters, else one."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    headings = list(_TEXT_HEADING.finditer(text))
    # A table of contents lists the headings with nothing between them; _split_at keeps the
    # empty chapters it makes and finish() drops them, so the real chapters remain.
    chapters = _split_at(text, headings, fallback_title)
    return Book(fallback_title, "", chapters, source_format="text")


def _body_of(ch: Chapter) -> str:
    """The chapter's text after the title it opens with (the heading a narrator reads)."""
    text = ch.text.lstrip()
    words = ch.title.split()
    if not words:
        return text
    # Matched word by word: the text may space or wrap the title differently.
    opening = re.match(r"\s+".join(map(re.escape, words)), text)
    return text[opening.end():] if opening else text


_MD_HEADING = re.compile(r"^(?P<hashes>#{1,6})[ \t]+(?P<title>.+?)[ \t#]*$", re.MULTILINE)
_MD_SETEXT = re.compile(r"^(?P<title>[^\n#>\-=*`|][^\n]*)\n(?P<rule>=+|-+)[ \t]*$", re.MULTILINE)


def _markdown_to_text(md: str) -> str:
    md = re.sub(r"^```.*?^```[ \t]*$", "", md, flags=re.MULTILINE | re.DOTALL)  # code blocks
    md = re.sub(r"<!--.*?-->", "", md, flags=re.DOTALL)
    md = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", md)  # images
    md = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", md)  # links keep their text
    md = re.sub(r"\[([^\]]+)\]\[[^\]]*\]", r"\1", md)
    md = re.sub(r"^\[[^\]]+\]:\s*\S+.*$", "", md, flags=re.MULTILINE)  # link definitions
    md = re.sub(r"<[^>\n]+>", "", md)  # inline HTML tags
    md = re.sub(r"^[ \t]*(?:[-*+]|\d+\.)[ \t]+", "", md, flags=re.MULTILINE)  # list markers
    md = re.sub(r"^[ \t]*>[ \t]?", "", md, flags=re.MULTILINE)  # quotes
    md = re.sub(r"^[ \t]*(?:[-*_][ \t]*){3,}$", "", md, flags=re.MULTILINE)  # rules
    md = re.sub(r"(\*\*|__|\*|_|~~|`)(?=\S)(.+?)(?<=\S)\1", r"\2", md)  # emphasis, code
    return md


def parse_markdown(md: str, fallback_title: str = "Untitled") -> Book:
    """Markdown: chapters start at `#` headings (or `##` under a single `#` title)."""
    md = md.replace("\r\n", "\n").replace("\r", "\n")
    md = _MD_SETEXT.sub(lambda m: ("# " if m["rule"][0] == "=" else "## ") + m["title"], md)
    md = re.sub(r"^```.*?^```[ \t]*$", "", md, flags=re.MULTILINE | re.DOTALL)
    headings = list(_MD_HEADING.finditer(md))
    h1 = [m for m in headings if len(m["hashes"]) == 1]
    h2 = [m for m in headings if len(m["hashes"]) == 2]
    title = fallback_title
    if len(h1) == 1 and h2:
        title = h1[0]["title"]
        md = md[: h1[0].start()] + md[h1[0].end():]
        level = 2
    else:
        level = 1 if h1 else 2
    headings = [m for m in _MD_HEADING.finditer(md) if len(m["hashes"]) == level]
    if len(h1) == 1 and not h2:
        title = h1[0]["title"]
    chapters = _split_at(md, headings, title)
    chapters = [Chapter(_markdown_to_text(c.title), _markdown_to_text(c.text)) for c in chapters]
    return Book(_markdown_to_text(title), "", chapters, source_format="markdown")


_BLOCK_TAGS = frozenset({"p", "div", "br", "li", "tr", "section", "article", "blockquote",
                         "h1", "h2", "h3", "h4", "h5", "h6", "pre", "dd", "dt", "figcaption",
                         "header", "footer", "aside", "hr", "table", "ul", "ol", "body"})
_SKIP_TAGS = frozenset({"script", "style", "head", "noscript", "template", "svg", "math"})
_SKIP_TYPES = ("cover", "toc", "copyright-page", "landmarks", "page-list", "titlepage")


class _HtmlText(HTMLParser):
    """Blocks of text from (X)HTML: [(tag, text)], tag 'h1'/'h2'/... for headings, else 'p'.

    Also notes the <title> and whether the document declares itself a cover, TOC or
    copyright page (`epub:type`). Expands only HTML's own character references.
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[tuple[str, str]] = []
        self.title = ""
        self.doc_types: set[str] = set()
        self._buf: list[str] = []
        self._tag = "p"
        self._skip = 0
        self._in_title = False

    def _flush(self) -> None:
        text = _one_line("".join(self._buf))
        if text:
            self.blocks.append((self._tag, text))
        self._buf, self._tag = [], "p"

    def handle_starttag(self, tag: str, attrs) -> None:
        tag = tag.lower().split(":")[-1]
        for name, value in attrs:
            if name.lower() in ("epub:type", "role") and value:
                self.doc_types.update(value.lower().replace("doc-", "").split())
        if tag == "title":
            self._in_title = True
        if tag in _SKIP_TAGS:
            self._skip += 1
        elif tag in _BLOCK_TAGS:
            self._flush()
            if re.fullmatch(r"h[1-6]", tag):
                self._tag = tag

    def handle_startendtag(self, tag: str, attrs) -> None:
        if tag.lower() in _BLOCK_TAGS:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        tag = tag.lower().split(":")[-1]
        if tag == "title":
            self._in_title = False
        if tag in _SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
        elif tag in _BLOCK_TAGS:
            self._flush()

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif not self._skip:
            self._buf.append(data)

    def close(self) -> None:
        super().close()
        self._flush()


def html_blocks(html: str) -> _HtmlText:
    parser = _HtmlText()
    parser.feed(html)
    parser.close()
    return parser


def parse_html(html: str, fallback_title: str = "Untitled") -> Book:
    """HTML: chapters start at `h1` (or `h2` under a single `h1` title)."""
    doc = html_blocks(html)
    h1 = [t for tag, t in doc.blocks if tag == "h1"]
    h2 = [t for tag, t in doc.blocks if tag == "h2"]
    title = _one_line(doc.title) or fallback_title
    level = "h1"
    if len(h1) == 1 and h2:
        title, level = h1[0], "h2"
    elif len(h1) == 1:
        title = _one_line(doc.title) or h1[0]
    elif not h1 and h2:
        level = "h2"
    chapters: list[Chapter] = []
    current: tuple[str, list[str]] | None = None
    front: list[str] = []
    for tag, text in doc.blocks:
        if tag == level:
            if current:
                chapters.append(Chapter(current[0], "\n\n".join(current[1])))
            current = (text, [f"{text}."])
        elif tag == "h1" and level == "h2":
            continue  # the book's title, already taken
        elif current:
            current[1].append(text)
        else:
            front.append(text)
    if current:
        chapters.append(Chapter(current[0], "\n\n".join(current[1])))
    if any(re.search(r"\w", t) for t in front):
        chapters.insert(0, Chapter(title, "\n\n".join(front)))
    return Book(title, "", chapters, source_format="html")


# -- EPUB ------------------------------------------------------------------------------------


_XML_SUFFIXES = (".xml", ".opf", ".ncx", ".xhtml", ".html", ".htm", ".svg", ".smil")
_SKIP_NAMES = re.compile(r"(^|[/_\-.])(cover|copyright|toc|nav|titlepage|title-page)"
                         r"([/_\-.]|\d|$)", re.IGNORECASE)


def check_epub_archive(data: bytes) -> zipfile.ZipFile:
    """The checks that come before any EPUB library sees the bytes. Raises BookError."""
    import zlib

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
    import zlib

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


def parse_epub(data: bytes) -> Book:
    zf = check_epub_archive(data)
    zf.close()
    import warnings

    import ebooklib
    from ebooklib import epub

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            book = epub.read_epub(io.BytesIO(data), {"ignore_ncx": False})
    except BookError:
        raise
    except Exception as exc:  # ebooklib raises anything from KeyError to EpubException
        raise BookError("corrupt_epub",
                        f"the EPUB cannot be read: {exc.__class__.__name__}: {exc}") from None

    def meta(name: str) -> str:
        values = book.get_metadata("DC", name)
        return _one_line(values[0][0]) if values and values[0][0] else ""

    toc_titles = _toc_titles(book.toc)
    skip = _guide_skips(book)
    chapters: list[Chapter] = []
    for idref, _linear in book.spine:
        item = book.get_item_with_id(idref)
        if item is None or item.get_type() != ebooklib.ITEM_DOCUMENT:
            continue
        name = item.get_name()
        if isinstance(item, epub.EpubNav) or name in skip or _SKIP_NAMES.search(
                posixpath.basename(name)):
            continue
        doc = html_blocks(item.get_content().decode("utf-8", errors="replace"))
        if doc.doc_types & set(_SKIP_TYPES):
            continue
        text = "\n\n".join(t for _, t in doc.blocks)
        if not any(re.search(r"\w", t) for tag, t in doc.blocks if tag == "p"):
            continue  # no text but headings (a part-title page): no body, as in finish()
        heading = next((t for tag, t in doc.blocks if tag in ("h1", "h2", "h3")), "")
        title = toc_titles.get(name) or heading or _one_line(doc.title)
        if title and not text.startswith(title):
            text = f"{title}.\n\n{text}"
        chapters.append(Chapter(title, text))

    cover, cover_mime = _cover(book)
    language = meta("language") or None
    return Book(meta("title"), meta("creator"), chapters, cover=cover, cover_mime=cover_mime,
                language=language, source_format="epub")


def _toc_titles(toc) -> dict[str, str]:
    """href (without fragment) -> the first title the navigation gives it."""
    out: dict[str, str] = {}

    def walk(entries) -> None:
        for entry in entries:
            if isinstance(entry, tuple | list) and len(entry) == 2:
                section, children = entry
                _add(section)
                walk(children)
            else:
                _add(entry)

    def _add(link) -> None:
        href = getattr(link, "href", None)
        title = getattr(link, "title", None)
        if href and title:
            out.setdefault(href.split("#")[0], _one_line(title))

    walk(toc or [])
    return out


def _guide_skips(book) -> set[str]:
    skip = set()
    for ref in getattr(book, "guide", []) or []:
        if str(ref.get("type", "")).lower() in ("cover", "toc", "copyright-page", "title-page"):
            skip.add(str(ref.get("href", "")).split("#")[0])
    return skip


def _cover(book) -> tuple[bytes | None, str | None]:
    import ebooklib

    candidates = list(book.get_items_of_type(ebooklib.ITEM_COVER))
    cover_ids = [v[1].get("content") for v in book.get_metadata("OPF", "cover") if v[1]]
    candidates += [i for i in book.get_items_of_type(ebooklib.ITEM_IMAGE)
                   if i.get_id() in cover_ids or "cover" in i.get_name().lower()]
    for item in candidates:
        mime = getattr(item, "media_type", "") or ""
        if mime in ("image/jpeg", "image/png"):
            return item.get_content(), mime
    return None, None


# -- helpers -------------------------------------------------------------------------------


def _one_line(s: str) -> str:
    return re.sub(r"\s+", " ", s or "").strip()


def _tidy(text: str) -> str:
    text = re.sub(r"[ \t\u00a0]+", " ", text.replace("\r\n", "\n"))
    text = re.sub(r"\n[ \t]+", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()
