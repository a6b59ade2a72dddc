"""The books API, v1: submit a book, watch it render, fetch its audio, cancel or retry it.

    POST   /v1/books                      multipart `file` (.epub .txt .md .html) or JSON
                                          chapters; `voice`, `speed`, `formats`
    GET    /v1/books/{id}                 state, per-chapter progress, throughput, ETA
    GET    /v1/books/{id}/audio?format=m4b|mp3
    GET    /v1/books/{id}/chapters/{n}/audio
    GET    /v1/books/{id}/manifest
    DELETE /v1/books/{id}                 cancel (or delete a finished book): files removed
    POST   /v1/books/{id}/retry           render only what is missing

The request only validates and parses (to refuse a bad book with a clear 4xx before writing
anything); the split into segments and the rendering run on the workers. Reading the book a
request sends (an upload parsed in a child process, one parse turn per web process, or JSON
chapters) and holding it to its caps is web/book_upload.py.
"""

from __future__ import annotations

import json
import time
from typing import cast
from urllib.parse import quote

from flask import Blueprint, Response, jsonify, request, send_file, url_for

from app.broker.queueing import resume, send_assemble, send_prepare
from app.farm import Farm
from app.offload import offload
from app.stores.books import (
    book_download_name,
    book_id_for,
    captions_download_name,
    captions_file,
    chapter_download_name,
    chapter_file,
    output_key,
    packaging,
    prefix,
)
from app.stores.states import BookState
from models.text import captions
from web import apidoc as doc
from web import idempotency
from web.auth import current_key, owner_id
from web.book_upload import Submission, json_chapters_book, uploaded_book
from web.errors import ApiError
from web.helpers import farm, given_args, iso_time, parse
from web.schemas import responses
from web.schemas.constants import BOOK_AUDIO_TYPES
from web.schemas.requests import (
    BookAudioQuery,
    BookCaptionsQuery,
    BookRequest,
    BookUpload,
)

books_api = Blueprint("books", __name__)
_BOOK = doc.json(responses.Book, "the book, with per-chapter progress")


@books_api.before_request
def _book_upload_limit() -> None:
    # Books are far bigger than a job's text: this blueprint's own body limit (413 past it).
    request.max_content_length = farm().settings.max_book_bytes


def book_view(rec: dict) -> dict:
    """A book's answer (`responses.Book`): validated against the model the document shows."""
    bid = rec["id"]
    started = rec["rendering_at"]
    rendering = rec["state"] == BookState.RENDERING
    end = rec["rendered_at"] or (None if rendering else rec["finished_at"])
    elapsed = max(1e-6, (end or time.time()) - started) if started else None
    rate = rec["done"] / elapsed if elapsed and rec["done"] else 0.0
    eta = None
    if rendering and rate:
        eta = round((rec["total"] - rec["done"]) / rate, 1)
    elif rec["state"] == BookState.DONE:
        eta = 0.0
    pack = packaging(rec) if rec["chapter_list"] else None
    if rec["state"] == BookState.ASSEMBLING and pack:
        eta = pack["eta_s"]  # packaging what rendering left
    done = rec["state"] == BookState.DONE
    return responses.Book.answer(**{
        "id": bid,
        "state": rec["state"],
        "title": rec["title"],
        "author": rec["author"],
        "voice": rec["voice"],
        "speed": rec["speed"],
        "formats": rec["formats"],
        "words": rec["words"],
        "segments": {"done": rec["done"], "total": rec["total"]},
        "chapters": [{
            "index": c["index"], "title": c["title"],
            "segments": {"done": c["done"], "total": c["total"]},
            **({"audio": url_for("books.chapter_audio", book_id=bid, n=c["index"])}
               if done and "chapters" in rec["formats"] else {}),
        } for c in rec["chapter_list"]],
        "audio_seconds": rec["audio_seconds"],
        # Audio seconds rendered per wall-clock second of rendering (x real time).
        "throughput": round(rec["audio_seconds"] / elapsed, 2) if elapsed else None,
        "eta_s": eta,
        "packaging": pack,
        "duration_s": rec["duration_s"],
        "error": rec["error"],
        "created_at": iso_time(rec["created_at"]),
        "started_at": iso_time(rec["started_at"]),
        "finished_at": iso_time(rec["finished_at"]),
        "links": {
            "self": url_for("books.get_book", book_id=bid),
            "manifest": url_for("books.manifest", book_id=bid),
            **{f: url_for("books.audio", book_id=bid, format=f)
               for f in BOOK_AUDIO_TYPES if f in rec["formats"]},
            "retry": url_for("books.retry", book_id=bid),
        },
    })


def _book_or_404(book_id: str) -> dict:
    rec = farm().books.get(book_id)
    if rec is None:
        raise ApiError(404, "book_not_found", f"no book with id '{book_id}'")
    return rec


# -- submission ------------------------------------------------------------------------------


@doc.route(books_api, "/v1/books", "post", idempotency.documented(doc.op(
    "books", "createBook", "Submit a book (multipart `file`, or JSON chapters) to render", {
        "202": doc.json(responses.Book, "accepted: rendering starts"),
        "200": doc.json(responses.Book, "the same book was submitted before"),
        "400": doc.error("the body is not valid JSON"),
        "413": doc.error("the upload is too large (`request_too_large`), or the book is over "
                         "a cap: `too_many_words`, `too_many_chapters` or "
                         "`archive_too_large`, with `limit` and `unit`"),
        "415": doc.error("not a book file or not a supported body type"),
        "422": doc.error("a field is wrong or the book has nothing to speak"),
        "503": doc.UNAVAILABLE},
    body={"multipart/form-data": BookUpload, "application/json": BookRequest})))
@idempotency.idempotent("books")
def create_book() -> Response:
    f = farm()
    if request.mimetype == "multipart/form-data":
        submission = uploaded_book(f.settings)
    elif request.is_json:
        submission = json_chapters_book(f.settings)
    else:
        raise ApiError(415, "unsupported_media_type", "send the book as multipart/form-data "
                       "(field 'file') or as JSON chapters")

    settings = f.settings
    book_id = book_id_for(submission.book.digest(), voice=submission.voice.name,
                          speed=submission.fields.speed, acoustic_model=settings.acoustic_model,
                          vocoder=settings.vocoder, owner=owner_id(),
                          farm_name=settings.farm_name)
    existing = f.books.get(book_id)
    if existing is None or existing["state"] == BookState.CANCELED:
        created = _create_and_prepare(f, book_id, submission)
    else:
        created = False
        _submitted_again(f, book_id, existing, submission.fields.formats)
    resp = jsonify(book_view(cast(dict, f.books.get(book_id))))  # read above
    resp.status_code = 202 if created else 200
    resp.headers["Location"] = url_for("books.get_book", book_id=book_id)
    return resp


def _create_and_prepare(f: Farm, book_id: str, submission: Submission) -> bool:
    """Store the book and its record, and send it to be prepared; False if a concurrent
    identical submit created it first."""
    book, voice, fields = submission.book, submission.voice, submission.fields
    # 429 past the key's work running at once; the place is the book's once created.
    with f.work_slot(current_key()) as slot:
        # Everything is valid: only now is anything written. Files first
        # (content-addressed, so a concurrent identical submit writes the same bytes),
        # then the record.
        base = prefix(book_id)
        f.store.put(base + "book.json",
                    json.dumps(book.to_json(), ensure_ascii=False).encode())
        if book.cover:
            f.store.put(base + "cover", book.cover)
        if submission.source:
            data, ext = submission.source
            f.store.put(base + f"source.{ext}", data)
        created = f.books.create(book_id, title=book.title, author=book.author,
                                 voice=voice.name, speed=fields.speed, formats=fields.formats,
                                 chapters=len(book.chapters), words=book.words,
                                 sample_rate=voice.sample_rate,
                                 source_format=book.source_format, owner=owner_id())
        if created:
            slot.started(book_id)
            send_prepare(f.celery, book_id)
    return created


def _submitted_again(f: Farm, book_id: str, existing: dict, formats: tuple[str, ...]) -> None:
    """A book the farm already has, submitted again: packaged in the formats it lacks, or
    nudged on if it stalled; otherwise left as it is."""
    if f.books.add_formats(book_id, formats):
        # Done, and asked in formats it lacks: package the stored segments again (the
        # audio is the same; nothing is rendered twice).
        send_assemble(f.celery, book_id)
    elif f.sweeps.book_stalled(existing):
        # A re-submit of a stalled book nudges it on (its message was lost with a
        # crashed web process, or the broker's queues were lost): every stage is
        # idempotent and stored segments are skipped, so nothing is rendered twice.
        resume(f.celery, f.books, book_id)


# -- watching and fetching -------------------------------------------------------------------


@doc.route(books_api, "/v1/books/<book_id>", "get", doc.op(
    "books", "getBook", "A book's state, per-chapter progress, throughput and ETA", {
        "200": _BOOK, "404": doc.BOOK_NOT_FOUND, "503": doc.UNAVAILABLE}))
def get_book(book_id: str):
    return jsonify(book_view(_book_or_404(book_id)))


def _send(key: str, mimetype: str, download_name: str):
    store = farm().store
    path = store.local_path(key)
    if path:
        return send_file(path, mimetype=mimetype, download_name=download_name,
                         as_attachment=True, conditional=True)
    try:
        fh = store.open(key)
    except KeyError:
        raise ApiError(410, "audio_missing", "the book's audio is gone") from None
    # The name may hold any letter (a Chinese title): RFC 6266's UTF-8 form beside an ASCII
    # fallback, as send_file writes it for the local store.
    ascii_name = download_name.encode("ascii", "replace").decode().replace("?", "_")
    return Response(iter(lambda: fh.read(256 * 1024), b""), mimetype=mimetype, headers={
        "Content-Disposition": f"attachment; filename=\"{ascii_name}\"; "
                               f"filename*=UTF-8''{quote(download_name)}"})


def _done_or_409(rec: dict) -> None:
    if rec["state"] != BookState.DONE:
        raise ApiError(409, "book_not_done",
                       f"the book is {rec['state']} ({rec['done']}/{rec['total']} segments); "
                       "its audio exists once it is done", state=rec["state"])


@doc.route(books_api, "/v1/books/<book_id>/audio", "get", doc.op(
    "books", "getBookAudio", "The whole audiobook with chapter markers", {
        "200": doc.files(BOOK_AUDIO_TYPES.values(), "the audiobook"),
        "404": doc.error("no such book, or not rendered in this format"),
        "409": doc.BOOK_NOT_DONE, "410": doc.BOOK_GONE, "422": doc.error("unknown format"),
        "503": doc.UNAVAILABLE},
    query=BookAudioQuery))
def audio(book_id: str):
    rec = _book_or_404(book_id)
    fmt = (parse(BookAudioQuery, given_args(request.args)).format
           or ("m4b" if "m4b" in rec["formats"] else "mp3"))
    if fmt not in rec["formats"]:
        raise ApiError(404, "format_not_rendered", f"the book was not rendered as {fmt}; "
                       f"its formats are {', '.join(rec['formats'])}", field="format")
    _done_or_409(rec)
    return _send(output_key(book_id, f"book.{fmt}"), BOOK_AUDIO_TYPES[fmt],
                 book_download_name(rec["title"], book_id, fmt))


@doc.route(books_api, "/v1/books/<book_id>/chapters/<int:n>/audio", "get", doc.op(
    "books", "getChapterAudio", "One chapter as MP3", {
        "200": doc.files(["audio/mpeg"], "the chapter"),
        "404": doc.error("no such book or chapter, or no chapter files"),
        "409": doc.BOOK_NOT_DONE, "410": doc.BOOK_GONE, "503": doc.UNAVAILABLE}))
def chapter_audio(book_id: str, n: int):
    rec = _book_or_404(book_id)
    if "chapters" not in rec["formats"]:
        raise ApiError(404, "format_not_rendered", "the book was not rendered with chapter "
                       "files (formats: chapters)")
    if not 0 <= n < len(rec["chapter_list"]):
        raise ApiError(404, "chapter_not_found", f"the book has chapters 0 to "
                       f"{len(rec['chapter_list']) - 1}")
    _done_or_409(rec)
    return _send(output_key(book_id, chapter_file(n)), "audio/mpeg",
                 chapter_download_name(n, rec["chapter_list"][n]["title"]))


def _captions(book_id: str, n: int | None):
    rec = _book_or_404(book_id)
    fmt = parse(BookCaptionsQuery, given_args(request.args)).format
    if n is not None and not 0 <= n < len(rec["chapter_list"]):
        raise ApiError(404, "chapter_not_found", f"the book has chapters 0 to "
                       f"{len(rec['chapter_list']) - 1}")
    _done_or_409(rec)
    title = rec["title"] if n is None else rec["chapter_list"][n]["title"]
    return _send(output_key(book_id, captions_file(n, fmt)), captions.CONTENT_TYPES[fmt],
                 captions_download_name(title, book_id, n, fmt))


@doc.route(books_api, "/v1/books/<book_id>/captions", "get", doc.op(
    "books", "getBookCaptions", "The whole book's captions (each chapter at its place in the "
    "book)", {
        "200": doc.CAPTION_FILES, "404": doc.BOOK_NOT_FOUND, "409": doc.BOOK_NOT_DONE,
        "410": doc.error("the captions are gone or the book was assembled before captions "
                         "(`audio_missing`)"),
        "422": doc.error("unknown format"), "503": doc.UNAVAILABLE},
    query=BookCaptionsQuery))
def book_captions(book_id: str):
    """The whole book's captions, each chapter's words at its place in the book."""
    return _captions(book_id, None)


@doc.route(books_api, "/v1/books/<book_id>/chapters/<int:n>/captions", "get", doc.op(
    "books", "getChapterCaptions", "One chapter's captions, on the chapter's own timeline", {
        "200": doc.CAPTION_FILES, "404": doc.error("no such book or chapter"),
        "409": doc.BOOK_NOT_DONE, "410": doc.error("the captions are gone (`audio_missing`)"),
        "422": doc.error("unknown format"), "503": doc.UNAVAILABLE},
    query=BookCaptionsQuery))
def chapter_captions(book_id: str, n: int):
    return _captions(book_id, n)


@doc.route(books_api, "/v1/books/<book_id>/manifest", "get", doc.op(
    "books", "getBookManifest", "The finished book's files and chapter timings", {
        "200": doc.json(responses.Manifest, "the manifest"), "404": doc.BOOK_NOT_FOUND,
        "409": doc.BOOK_NOT_DONE, "410": doc.BOOK_GONE, "503": doc.UNAVAILABLE}))
def manifest(book_id: str):
    rec = _book_or_404(book_id)
    _done_or_409(rec)
    data = farm().books.manifest(book_id)
    if data is None:
        raise ApiError(410, "audio_missing", "the book's manifest is gone")
    for ch in data["chapters"]:
        if "file" in ch:
            ch["audio"] = url_for("books.chapter_audio", book_id=book_id, n=ch["index"])
        if "captions" in ch:
            ch["captions_links"] = {fmt: url_for("books.chapter_captions", book_id=book_id,
                                                 n=ch["index"], format=fmt)
                                    for fmt in ch["captions"]}
    if "captions" in data:
        data["captions_links"] = {fmt: url_for("books.book_captions", book_id=book_id,
                                               format=fmt) for fmt in data["captions"]}
    return jsonify(responses.Manifest.answer(**data))


@doc.route(books_api, "/v1/books/<book_id>", "delete", doc.op(
    "books", "cancelBook", "Cancel a book, or delete a finished one (files removed)", {
        "200": _BOOK, "404": doc.BOOK_NOT_FOUND, "503": doc.UNAVAILABLE}))
def cancel(book_id: str):
    """Cancel a book (queued segments are skipped when they come up) and remove its files;
    for a finished book, delete it. The record stays, saying canceled."""
    rec = _book_or_404(book_id)
    books = farm().books
    books.cancel(book_id)
    offload("encode", books.remove, book_id)
    return jsonify(book_view(books.get(book_id) or rec))


@doc.route(books_api, "/v1/books/<book_id>/retry", "post", doc.op(
    "books", "retryBook", "Render only what is missing of a failed or stuck book", {
        "202": _BOOK, "404": doc.BOOK_NOT_FOUND,
        "409": doc.error("done or canceled: nothing to retry"), "503": doc.UNAVAILABLE}))
def retry(book_id: str):
    rec = _book_or_404(book_id)
    if rec["state"] in (BookState.DONE, BookState.CANCELED):
        raise ApiError(409, "book_not_retryable", f"the book is {rec['state']}; "
                       + ("nothing is missing" if rec["state"] == BookState.DONE
                          else "submit it again to render it"), state=rec["state"])
    f = farm()
    resume(f.celery, f.books, book_id)
    resp = jsonify(book_view(cast(dict, f.books.get(book_id))))  # read above
    resp.status_code = 202
    return resp
