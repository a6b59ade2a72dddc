"""Assembling a book (the `assemble` task of tasks/books.py): its stored segments into the
files it was asked for (chapter MP3s, M4B, MP3), its captions and its manifest. Idempotent:
the same segments make the same files, so a redelivered assembly writes them again."""

from __future__ import annotations

import json
from contextlib import ExitStack

from app.stores.books import (
    book_download_name,
    captions_download_name,
    captions_file,
    chapter_download_name,
    chapter_file,
    output_key,
    prefix,
    segment_key,
    segment_words_key,
)


def assemble_outputs(farm, rec: dict) -> dict:
    """The book's files from its stored segments, in the formats it asks for (M4B, MP3,
    chapter MP3s), its captions and its manifest, written to the store; the manifest."""
    # the frontend and encoders load on first use: every pool imports this
    from models.books.assemble import BookMeta, ChapterAudio, assemble_book

    store, book_id = farm.store, rec["id"]
    book = json.loads(store.get(prefix(book_id) + "book.json"))
    cover = store.get(prefix(book_id) + "cover") if book.get("cover_mime") else None
    chapters = []
    chapter_words: list[list[dict]] = []
    for ch in rec["chapter_list"]:
        keys = [segment_key(book_id, ch["index"], i) for i in range(ch["total"])]
        sizes = [store.size(k) // 2 for k in keys]
        samples = sum(sizes)
        chapter_words.append(_chapter_words(store, book_id, ch["index"], sizes,
                                            rec["sample_rate"]))

        def parts(keys=keys):
            for k in keys:
                yield store.get(k)

        chapters.append(ChapterAudio(ch["title"], samples, parts))
    meta = BookMeta(book["title"], book.get("author") or "", cover, book.get("cover_mime"))
    formats = set(rec["formats"])
    with ExitStack() as files:
        m4b = files.enter_context(store.writer(output_key(book_id, "book.m4b"))) \
            if "m4b" in formats else None
        mp3 = files.enter_context(store.writer(output_key(book_id, "book.mp3"))) \
            if "mp3" in formats else None
        manifest = assemble_book(
            chapters, meta, rec["sample_rate"], m4b=m4b, mp3=mp3,
            chapter_file=(lambda n: store.writer(output_key(book_id, chapter_file(n))))
            if "chapters" in formats else None,
            # The manifest names each file as the download and the CLI's folder do.
            chapter_name=(lambda n: chapter_download_name(n, rec["chapter_list"][n]["title"]))
            if "chapters" in formats else None)
    manifest = {"book_id": book_id, "title": book["title"], "author": book.get("author") or "",
                "voice": rec["voice"], "speed": rec["speed"], "formats": sorted(formats),
                "files": {fmt: book_download_name(book["title"], book_id, fmt)
                          for fmt in ("m4b", "mp3") if fmt in formats},
                **manifest}
    _write_captions(store, book_id, book["title"], manifest, chapter_words)
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


def _write_captions(store, book_id: str, title: str, manifest: dict,
                    chapter_words: list[list[dict]]) -> None:
    """SRT and WebVTT per chapter and for the whole book (chapters at their start in the
    book), listed in the manifest under `captions`."""
    # the frontend and encoders load on first use: every pool imports this
    from models.text import captions

    whole = []
    for ch, words in zip(manifest["chapters"], chapter_words, strict=True):
        offset = ch["start_s"]
        # A cue never spans two chapters: segment numbers are made book-wide.
        whole += [{**w, "start": round(offset + w["start"], 3),
                   "end": round(offset + w["end"], 3),
                   "segment": (ch["index"], w["segment"])} for w in words]
    names = {}
    for fmt in ("srt", "vtt"):
        store.put(output_key(book_id, captions_file(None, fmt)),
                  captions.render(whole, fmt).encode())
        names[fmt] = captions_download_name(title, book_id, None, fmt)
    manifest["captions"] = names
    for ch, words in zip(manifest["chapters"], chapter_words, strict=True):
        ch["captions"] = {}
        for fmt in ("srt", "vtt"):
            store.put(output_key(book_id, captions_file(ch["index"], fmt)),
                      captions.render(words, fmt).encode())
            ch["captions"][fmt] = captions_download_name(ch["title"], book_id, ch["index"],
                                                         fmt)
    manifest["words"] = sum(len(w) for w in chapter_words)
