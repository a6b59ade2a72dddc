"""Packaging a book (the `package_chapter` and `assemble` tasks of tasks/books.py), in three
steps, each small:

    package_piece_files   a piece of a chapter (up to PIECE_SEGMENTS stored segments) -> its
                          AAC, its MP3 and its timed words (models/books/package.py)
    finish_chapter_files  a chapter whose pieces are packaged -> its MP3 download (its
                          pieces' frames remuxed, or its one piece's file) and its captions
    finish_book           the book's M4B and MP3 remuxed from every piece, its captions, its
                          manifest

Every step is idempotent: the same segments make the same files, each written through the
store's atomic writer, so a redelivered step writes them again and a step killed midway
leaves only temporary files (swept by the next assembly)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import BinaryIO

from app.stores.books import (
    PIECE_SEGMENTS,
    book_download_name,
    captions_download_name,
    captions_file,
    chapter_download_name,
    chapter_file,
    output_key,
    part_key,
    piece_mp3_key,
    pieces_of,
    prefix,
    segment_key,
    segment_words_key,
)


def _meta(store, book_id: str):
    # the encoders load on first use: every pool imports this module
    from models.books.assemble import BookMeta

    book = json.loads(store.get(prefix(book_id) + "book.json"))
    cover = store.get(prefix(book_id) + "cover") if book.get("cover_mime") else None
    return BookMeta(book["title"], book.get("author") or "", cover, book.get("cover_mime"))


def _piece(store, book_id: str, n: int, k: int) -> dict:
    try:
        return json.loads(store.get(part_key(book_id, n, k, "json")))
    except KeyError:  # not packaged yet
        return {}


def package_piece_files(farm, rec: dict, n: int, k: int, encodings: set[str]) -> dict:
    """Piece k of chapter n in `encodings` ("aac": its packets for the M4B; "mp3": its MP3
    frames, for the chapter's download and the book's MP3; "words": its timed words) from
    its stored segments, written to the store; returns its record (parts/NNN-KKK.json)."""
    # the encoders load on first use: every pool imports this module
    from models.books.package import encode_piece

    store, book_id = farm.store, rec["id"]
    chapters = rec["chapter_list"]
    ch = chapters[n]
    pieces = pieces_of(ch["total"])
    indices = range(k * PIECE_SEGMENTS, min((k + 1) * PIECE_SEGMENTS, ch["total"]))
    keys = [segment_key(book_id, n, i) for i in indices]
    part = _piece(store, book_id, n, k)
    if encodings & {"aac", "mp3"}:
        with ExitStack() as files:
            aac = (files.enter_context(store.writer(part_key(book_id, n, k, "m4a")))
                   if "aac" in encodings else None)
            mp3 = (files.enter_context(store.writer(piece_mp3_key(book_id, n, k, pieces)))
                   if "mp3" in encodings else None)
            followed = k + 1 < pieces or n + 1 < len(chapters)
            part.update(encode_piece((store.get(key) for key in keys), rec["sample_rate"],
                                     _meta(store, book_id), ch["title"],
                                     f"{n + 1}/{len(chapters)}", aac=aac, mp3=mp3,
                                     followed=followed))
    if "words" in encodings or "words" not in part:
        sizes = [store.size(key) // 2 for key in keys]
        part["samples"] = sum(sizes)
        part["words"] = _words(store, book_id, n, indices, sizes, rec["sample_rate"])
    store.put(part_key(book_id, n, k, "json"), json.dumps(part, ensure_ascii=False).encode())
    return part


def finish_chapter_files(farm, rec: dict, n: int, encodings: set[str]) -> None:
    """Chapter n from its packaged pieces: its MP3 download (with "mp3" in `encodings`: its
    pieces' frames remuxed; a chapter of one piece has it already) and its captions, on the
    timeline of that file."""
    # the encoders load on first use: every pool imports this module
    from models.books.package import remux_book
    from models.text import captions

    store, book_id, rate = farm.store, rec["id"], rec["sample_rate"]
    ch = rec["chapter_list"][n]
    pieces = [_piece(store, book_id, n, k) for k in range(pieces_of(ch["total"]))]
    starts = _sample_starts(pieces)
    if "mp3" in encodings and len(pieces) > 1:
        with store.writer(output_key(book_id, chapter_file(n))) as out:
            _, starts = remux_book(
                [partial(_opener, store, part_key(book_id, n, k, "mp3"))
                 for k in range(len(pieces))], [p["mp3"]["span"] for p in pieces], [],
                _meta(store, book_id), rate, out, "mp3", title=ch["title"],
                track=f"{n + 1}/{len(rec['chapter_list'])}")
    words = _placed(pieces, starts, rate)
    for fmt in ("srt", "vtt"):
        store.put(output_key(book_id, captions_file(n, fmt)),
                  captions.render(words, fmt).encode())


def finish_book(farm, rec: dict) -> dict:
    """The book's files from its packaged pieces: the M4B and MP3 remuxed (no audio encoded
    again), the whole book's captions, the manifest (returned)."""
    # the encoders load on first use: every pool imports this module
    from models.books.package import book_marks, remux_book

    store, book_id, rate = farm.store, rec["id"], rec["sample_rate"]
    meta = _meta(store, book_id)
    formats = set(rec["formats"])
    # Every piece in book order (chapter, piece, the chapter's pieces); (title, first piece).
    keys: list[tuple[int, int, int]] = []
    pieces: list[dict] = []
    chapters: list[tuple[str, int]] = []
    for ch in rec["chapter_list"]:
        n, count = ch["index"], pieces_of(ch["total"])
        chapters.append((ch["title"], len(pieces)))
        keys += [(n, k, count) for k in range(count)]
        pieces += [_piece(store, book_id, n, k) for k in range(count)]
    # The book's timeline: the M4B's where there is one, else the MP3's, else the audio's.
    marks = book_marks(chapters, [p["samples"] for p in pieces], rate)
    starts = _sample_starts(pieces)
    for fmt, enc in (("mp3", "mp3"), ("m4b", "aac")):
        if fmt not in formats:
            continue
        with store.writer(output_key(book_id, f"book.{fmt}")) as out:
            marks, starts = remux_book(
                [partial(_opener, store, piece_mp3_key(book_id, *key) if enc == "mp3"
                         else part_key(book_id, key[0], key[1], "m4a")) for key in keys],
                [p[enc]["span"] for p in pieces], chapters, meta, rate, out, fmt)
    ends = [first for _, first in chapters[1:]] + [len(pieces)]
    manifest = {
        "book_id": book_id, "title": meta.title, "author": meta.author, "voice": rec["voice"],
        "speed": rec["speed"], "formats": sorted(formats),
        "files": {fmt: book_download_name(meta.title, book_id, fmt)
                  for fmt in ("m4b", "mp3") if fmt in formats},
        "sample_rate": rate,
        "duration_s": round(sum(p["samples"] for p in pieces) / rate, 3),
        "chapters": [{
            "index": n, "title": title, "start_s": round(m["start"] / rate, 3),
            "duration_s": round(sum(p["samples"] for p in pieces[first:end]) / rate, 3),
            **({"file": chapter_download_name(n, title)} if "chapters" in formats else {}),
            "captions": {fmt: captions_download_name(title, book_id, n, fmt)
                         for fmt in ("srt", "vtt")},
        } for n, ((title, first), end, m) in enumerate(zip(chapters, ends, marks,
                                                             strict=True))],
    }
    _write_captions(store, book_id, manifest, pieces, keys, starts, rate)
    store.put(output_key(book_id, "manifest.json"), json.dumps(manifest, indent=2).encode())
    return manifest


@contextmanager
def _opener(store, key: str) -> Iterator[BinaryIO]:
    # One piece's encoding in memory at a time (a few MB).
    yield io.BytesIO(store.get(key))


def _sample_starts(pieces: list[dict]) -> list[int]:
    """Where each piece's audio begins when nothing is encoded: the samples before it."""
    starts, at = [], 0
    for p in pieces:
        starts.append(at)
        at += p["samples"]
    return starts


def _placed(pieces: list[dict], starts: list[int], rate: int) -> list[dict]:
    """The pieces' words on a timeline where each piece's audio begins at `starts`."""
    return [{**w, "start": round(start / rate + w["start"], 3),
             "end": round(start / rate + w["end"], 3)}
            for p, start in zip(pieces, starts, strict=True) for w in p["words"]]


def _words(store, book_id: str, chapter: int, indices: range, sizes: list[int],
           rate: int) -> list[dict]:
    """A piece's timed words on its own timeline: each segment's words (stored beside its
    audio, segment-relative) moved by the audio before it."""
    words, at = [], 0
    for index, samples in zip(indices, sizes, strict=True):
        try:
            stored = json.loads(store.get(segment_words_key(book_id, chapter, index)))
        except KeyError:  # a segment rendered before word timestamps
            stored = []
        offset = at / rate
        words += [{**w, "start": round(offset + w["start"], 3),
                   "end": round(offset + w["end"], 3), "segment": index} for w in stored]
        at += samples
    return words


def _write_captions(store, book_id: str, manifest: dict, pieces: list[dict],
                    keys: list[tuple[int, int, int]], starts: list[int], rate: int) -> None:
    """SRT and WebVTT for the whole book, each piece's words where its audio begins on the
    book's timeline; listed in the manifest (`captions`) with the word count."""
    # the frontend and encoders load on first use: every pool imports this
    from models.text import captions

    whole = _placed(pieces, starts, rate)
    # A cue never spans two chapters: segment numbers are made book-wide.
    chapter_of = [n for (n, _, _), p in zip(keys, pieces, strict=True) for _ in p["words"]]
    whole = [{**w, "segment": (n, w["segment"])} for w, n in zip(whole, chapter_of,
                                                                   strict=True)]
    names = {}
    for fmt in ("srt", "vtt"):
        store.put(output_key(book_id, captions_file(None, fmt)),
                  captions.render(whole, fmt).encode())
        names[fmt] = captions_download_name(manifest["title"], book_id, None, fmt)
    manifest["captions"] = names
    manifest["words"] = len(whole)
