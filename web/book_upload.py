"""A book as a request sends it (POST /v1/books): an upload read and parsed, or JSON chapters
read, each checked against the book's caps before anything is written (web/books.py stores
and prepares what this accepts).

Where an upload's parsing runs: in a child process (app/services/book_parse.py), never on
the web's threads that encode listeners' audio, nor in the web's memory. One upload per web
process holds the parse turn at a time (`_parse_turn`); the next waits for it at most
`book_parse_wait_s` (then 503) with its body still in Werkzeug's spooled upload file, so
uploads that wait hold no copy of their bytes. A book is held to its caps while it is read
(models/books/parse/limits.py): past one it stops there and the answer is 413 naming the cap.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from flask import request
from werkzeug.datastructures import FileStorage

from app.offload import OffloadTimeout
from app.services.book_parse import parse_upload
from app.settings import Settings
from models.books.parse import (
    EXTENSIONS,
    Book,
    BookError,
    BookLimits,
    BookTooLarge,
    Chapter,
    check_book,
    finish,
    not_a_book_file,
    with_tags,
)
from models.errors import BreakTooLong
from models.text.segmenting import check_breaks
from models.text.ssml import looks_like_ssml
from models.voices import Voice
from web.errors import ApiError
from web.helpers import break_error, farm, json_body, parse, ssml_or_422, voice_or_422
from web.schemas.requests import BookFields, BookRequest, BookUpload

# Parse errors that mean "this is not the kind of file it says": 415; the rest 422.
_STATUS = {"unsupported_format": 415, "wrong_format": 415}


def _json_book(req: BookRequest, voice: Voice) -> Book:
    chapters = []
    for i, ch in enumerate(req.chapters):
        text = ch.text
        # A chapter may be SSML (`text_type: ssml`, or a <speak> root): checked now, with
        # the error's place in the chapter's own text, so the book never fails on a worker.
        runs = ssml_or_422(text, ch.text_type, voice, req.speed, field=f"chapters[{i}].text")
        if runs is not None and not looks_like_ssml(text):
            text = f"<speak>{text}</speak>"  # the workers know SSML by its root
        chapters.append(Chapter(ch.title, text))
    return finish(Book(req.title or "Untitled", req.author, chapters))


def _voice(fields: BookFields) -> Voice:
    return voice_or_422(farm().settings.default_voice if fields.voice is None
                        else fields.voice)


def _breaks_within_cap(book: Book) -> Book:
    """The book, if no break tag in it is over the cap (else BreakTooLong): refused at
    upload, as on a job, rather than failing on a worker later."""
    for chapter in book.chapters:
        check_breaks(chapter.text)
    return book


def book_limits(settings: Settings) -> BookLimits:
    """A book's caps, from the settings."""
    return BookLimits(words=settings.max_book_words, chapters=settings.max_book_chapters,
                      unpacked_bytes=settings.max_book_unpacked_bytes,
                      unpacked_ratio=settings.max_book_unpacked_ratio)


def _too_large(exc: BookTooLarge, field: str) -> ApiError:
    return ApiError(413, exc.code, exc.message, field=field, limit=exc.limit, unit=exc.unit)


_parse_turn_lock = threading.Lock()
_parse_turn: threading.BoundedSemaphore | None = None


def _parse_turn_now() -> threading.BoundedSemaphore:
    """The one parse turn of this process, made on first use: after gevent's monkey-patching
    (a gevent semaphore under the gevent workers; only greenlets of the hub take it)."""
    global _parse_turn
    with _parse_turn_lock:
        if _parse_turn is None:
            _parse_turn = threading.BoundedSemaphore(1)
        return _parse_turn


def _parse_file(upload: FileStorage, name: str, settings: Settings) -> tuple[Book, bytes]:
    """The uploaded file parsed in a child process, once this upload has the parse turn, and
    its bytes (stored once the book is accepted)."""
    turn = _parse_turn_now()
    if not turn.acquire(timeout=settings.book_parse_wait_s):
        raise OffloadTimeout(f"no parse turn within {settings.book_parse_wait_s} s")
    try:
        data = upload.read()
        upload.close()
        book = parse_upload(data, name, book_limits(settings), settings.book_parse_timeout_s)
    finally:
        turn.release()
    return _breaks_within_cap(book), data


@dataclass(frozen=True)
class Submission:
    """A book as the request sent it, read and checked against its caps; nothing written."""

    fields: BookFields  # voice, speed, formats as asked
    voice: Voice
    book: Book
    # An upload's bytes and file extension, stored beside the book; None for JSON chapters.
    source: tuple[bytes, str] | None


def uploaded_book(settings: Settings) -> Submission:
    """The book of a multipart upload (field `file`), parsed and checked; 4xx if it is none."""
    upload = request.files.get("file")
    if upload is None:
        raise ApiError(422, "missing_field", "send the book as the multipart field 'file'",
                       field="file")
    form = request.form.to_dict()
    form["formats"] = ",".join(request.form.getlist("formats"))
    # A form sends every field as a string, and an empty one means the default.
    fields = parse(BookUpload, {k: value for k, value in form.items() if value != ""})
    voice = _voice(fields)
    name = upload.filename or ""
    ext = name.lower().rsplit(".", 1)[-1] if "." in name else ""
    if f".{ext}" not in EXTENSIONS:
        refusal = not_a_book_file(name)
        raise ApiError(415, refusal.code, refusal.message, field="file",
                       valid=list(EXTENSIONS))
    try:
        book, data = _parse_file(upload, name, settings)
    except BookTooLarge as exc:
        raise _too_large(exc, "file") from None
    except BookError as exc:
        raise ApiError(_STATUS.get(exc.code, 422), exc.code, exc.message,
                       field="file") from None
    except BreakTooLong as exc:
        raise break_error(exc, "file") from None
    # The title and author asked for are the tags, over what the file says of itself.
    return Submission(fields, voice, with_tags(book, fields.title, fields.author),
                      source=(data, ext))


def json_chapters_book(settings: Settings) -> Submission:
    """The book of a JSON request (its chapters), read and checked; 4xx if it is none."""
    fields = parse(BookRequest, json_body(request))
    voice = _voice(fields)
    limits = book_limits(settings)
    try:
        # The caps first, on the chapters as sent (their markup counts), before any
        # chapter's SSML is read; then exactly, on the book as it will be read.
        check_book(Book("", "", [Chapter(c.title, c.text) for c in fields.chapters]),
                   limits)
        book = _breaks_within_cap(check_book(_json_book(fields, voice), limits))
    except BookTooLarge as exc:
        raise _too_large(exc, "chapters") from None
    except BookError as exc:
        raise ApiError(422, exc.code, exc.message, field="chapters") from None
    except BreakTooLong as exc:
        raise break_error(exc, "chapters") from None
    return Submission(fields, voice, book, source=None)
