"""Packaging a book (the `package_chapter` and `assemble` tasks of tasks/books.py): each
chapter's stored segments into its encodings (models/books/package.py) as soon as they are
all stored, then the book's files remuxed from those: M4B, MP3, captions, manifest.

Both steps are idempotent: the same segments make the same files, every file is written
through the store's atomic writer, so a redelivered step writes them again and a step killed
midway leaves only temporary files (swept by the next assembly)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import BinaryIO

from app.stores.books import (
    book_download_name,
    captions_download_name,
    captions_file,
    chapter_download_name,
    chapter_file,
    output_key,
    part_key,
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


def package_chapter_files(farm, rec: dict, n: int, encodings: set[str]) -> dict:
    """Chapter n's `encodings` ("aac": its packets for the M4B; "mp3": its MP3, the chapter
    download and the book MP3's frames; "words": its timed words and captions) from its
    stored segments, written to the store; returns the chapter's part record (parts/NNN.json:
    samples, each encoding's span and lead, words)."""
    # the encoders load on first use: every pool imports this module
    from models.books.package import encode_chapter
    from models.text import captions

    store, book_id = farm.store, rec["id"]
    ch = rec["chapter_list"][n]
    keys = [segment_key(book_id, n, i) for i in range(ch["total"])]
    try:
        part = json.loads(store.get(part_key(book_id, n, "json")))
    except KeyError:  # first packaging of this chapter
        part = {}
    if encodings & {"aac", "mp3"}:
        with ExitStack() as files:
            aac = (files.enter_context(store.writer(part_key(book_id, n, "m4a")))
                   if "aac" in encodings else None)
            mp3 = (files.enter_context(store.writer(output_key(book_id, chapter_file(n))))
                   if "mp3" in encodings else None)
            part.update(encode_chapter((store.get(k) for k in keys), rec["sample_rate"],
                                       _meta(store, book_id), ch["title"],
                                       f"{n + 1}/{len(rec['chapter_list'])}", aac=aac,
                                       mp3=mp3, followed=n + 1 < len(rec["chapter_list"])))
    if "words" in encodings or "words" not in part:
        sizes = [store.size(k) // 2 for k in keys]
        part["samples"] = sum(sizes)
        part["words"] = _chapter_words(store, book_id, n, sizes, rec["sample_rate"])
        for fmt in ("srt", "vtt"):
            store.put(output_key(book_id, captions_file(n, fmt)),
                      captions.render(part["words"], fmt).encode())
    store.put(part_key(book_id, n, "json"), json.dumps(part, ensure_ascii=False).encode())
    return part


def finish_book(farm, rec: dict) -> dict:
    """The book's files from its packaged chapters: the M4B and MP3 remuxed (no audio
    encoded again), the whole book's captions, the manifest (returned)."""
    # the encoders load on first use: every pool imports this module
    from models.books.package import book_marks, remux_book

    store, book_id, rate = farm.store, rec["id"], rec["sample_rate"]
    meta = _meta(store, book_id)
    chapters = rec["chapter_list"]
    parts = [json.loads(store.get(part_key(book_id, c["index"], "json"))) for c in chapters]
    titles = [c["title"] for c in chapters]
    formats = set(rec["formats"])
    # The book's timeline: the M4B's where there is one, else the MP3's, else the audio's.
    marks = book_marks(titles, [p["samples"] for p in parts], rate)
    starts = [m["start"] for m in marks]
    for fmt, enc, source in (("mp3", "mp3", chapter_file), ("m4b", "aac", None)):
        if fmt not in formats:
            continue

        @contextmanager
        def opener(n: int, source=source) -> Iterator[BinaryIO]:
            # One chapter's encoding in memory at a time (a few MB an hour of audio).
            yield io.BytesIO(store.get(output_key(book_id, source(n)) if source
                                       else part_key(book_id, n, "m4a")))

        with store.writer(output_key(book_id, f"book.{fmt}")) as out:
            marks, starts = remux_book([partial(opener, n) for n in range(len(parts))],
                                       titles, [p[enc]["span"] for p in parts], meta, rate,
                                       out, fmt)
    manifest = {
        "book_id": book_id, "title": meta.title, "author": meta.author, "voice": rec["voice"],
        "speed": rec["speed"], "formats": sorted(formats),
        "files": {fmt: book_download_name(meta.title, book_id, fmt)
                  for fmt in ("m4b", "mp3") if fmt in formats},
        "sample_rate": rate,
        "duration_s": round(sum(p["samples"] for p in parts) / rate, 3),
        "chapters": [{
            "index": n, "title": titles[n], "start_s": round(m["start"] / rate, 3),
            "duration_s": round(parts[n]["samples"] / rate, 3),
            **({"file": chapter_download_name(n, titles[n])} if "chapters" in formats else {}),
        } for n, m in enumerate(marks)],
    }
    _write_captions(store, book_id, manifest, parts, starts, rate)
    store.put(output_key(book_id, "manifest.json"), json.dumps(manifest, indent=2).encode())
    return manifest


def _chapter_words(store, book_id: str, chapter: int, sizes: list[int],
                   rate: int) -> list[dict]:
    """The chapter's timed words on its own timeline: each segment's words (stored beside
    its audio, segment-relative) moved by the audio before it."""
    words, at = [], 0
    for index, samples in enumerate(sizes):
        try:
            stored = json.loads(store.get(segment_words_key(book_id, chapter, index)))
        except KeyError:  # a segment rendered before word timestamps
            stored = []
        offset = at / rate
        words += [{**w, "start": round(offset + w["start"], 3),
                   "end": round(offset + w["end"], 3), "segment": index} for w in stored]
        at += samples
    return words


def _write_captions(store, book_id: str, manifest: dict, parts: list[dict],
                    starts: list[int], rate: int) -> None:
    """SRT and WebVTT for the whole book (each chapter's words where its audio begins on the
    book's timeline), listed in the manifest with each chapter's (written when the chapter
    was packaged) under `captions`."""
    # the frontend and encoders load on first use: every pool imports this
    from models.text import captions

    whole = []
    for n, (part, start) in enumerate(zip(parts, starts, strict=True)):
        offset = start / rate
        # A cue never spans two chapters: segment numbers are made book-wide.
        whole += [{**w, "start": round(offset + w["start"], 3),
                   "end": round(offset + w["end"], 3), "segment": (n, w["segment"])}
                  for w in part["words"]]
    names = {}
    for fmt in ("srt", "vtt"):
        store.put(output_key(book_id, captions_file(None, fmt)),
                  captions.render(whole, fmt).encode())
        names[fmt] = captions_download_name(manifest["title"], book_id, None, fmt)
    manifest["captions"] = names
    for ch in manifest["chapters"]:
        ch["captions"] = {fmt: captions_download_name(ch["title"], book_id, ch["index"], fmt)
                          for fmt in ("srt", "vtt")}
    manifest["words"] = sum(len(p["words"]) for p in parts)
