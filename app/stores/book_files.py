"""Where a book's files are kept in the artifact store (the layout below), what each chapter
is packaged into and how far packaging is, and the names a user sees for the files:
downloads, the manifest, the CLI's output folder (one naming for all three, so a file
downloaded by hand and the CLI's copy agree).

Artifact layout under `books/{id}/`:

    source.{ext}                 the upload as sent (kept for reference)
    book.json                    the parsed book: title, author, chapters' titles and text
    cover                        cover image bytes (when the book has one)
    plan/{chapter:04d}.json      the chapter's segments: phonemes, text, pause (by the prepare task,
                                 each as soon as its chapter is planned)
    segments/{chapter:04d}/{index:05d}.pcm   16-bit mono PCM of one segment
    words/{chapter:04d}/{index:05d}.json     its timed words
    parts/{n:03d}-{k:03d}.m4a, .mp3, .json   piece k of chapter n: its AAC packets, its MP3
                                 frames (a chapter of one piece: the chapter's own file),
                                 its samples, spans and words; packaged while later
                                 chapters render, read by the remuxes
    out/chapters/{n:03d}.mp3, out/book.m4b, out/book.mp3, out/manifest.json


A title keeps the characters a file name may hold on Windows, macOS and Linux alike, and
reads as the title does: 'Chapter One: The Frost' is `001 Chapter One - The Frost.mp3`
(Windows forbids ':'; a '_' in its place read like a typo). What no system takes is
reworded or dropped: '/' and '\\' become '-', '"' an apostrophe, '<>|?*' and control
characters go, runs of spaces become one, and no name ends in a dot or a space (Windows
strips them) or is a device name Windows reserves (CON, NUL, COM1, ...).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable

from app.stores.states import BookState

_MAX_STEM = 120


def book_id_for(content_digest: str, *, voice: str, speed: float, acoustic_model: str,
                vocoder: str, owner: str = "", farm_name: str = "") -> str:
    """Same content and audio settings, same id: a re-submit finds the book it already made.
    The formats are not in it: they only package the same audio (see `add_formats`). Each
    API key has books of its own (`owner`), so one key's submit never finds another's. A
    farm of a set prefixes its name, as its job ids (app/zones/ids.py), so any farm of the
    set knows which one holds the book."""
    parts = [content_digest, voice, round(speed, 3), acoustic_model, vocoder]
    key = json.dumps(parts + [owner] if owner else parts)
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return f"{farm_name}-{digest}" if farm_name else digest


def prefix(book_id: str) -> str:
    return f"books/{book_id}/"


def segment_key(book_id: str, chapter: int, index: int) -> str:
    return f"books/{book_id}/segments/{chapter:04d}/{index:05d}.pcm"


def segment_words_key(book_id: str, chapter: int, index: int) -> str:
    """A segment's timed words (JSON, seconds of the segment's audio), in a tree of their
    own beside the audio's (one file per segment under `segments/` is the audio)."""
    return f"books/{book_id}/words/{chapter:04d}/{index:05d}.json"


def captions_file(n: int | None, fmt: str) -> str:
    """Where chapter n's captions (n None: the whole book's) are kept in the store."""
    return f"captions/book.{fmt}" if n is None else f"captions/{n:03d}.{fmt}"


def plan_key(book_id: str, chapter: int) -> str:
    return f"books/{book_id}/plan/{chapter:04d}.json"


# Segments a chapter is packaged in at most: a piece of 40 segments is a few minutes of audio,
# encoded in seconds, so a chapter of any length is packaged in steps that no task limit
# reaches, as soon as each piece's segments are stored, and the last segment of a book leaves
# at most one piece to encode.
PIECE_SEGMENTS = 40


def pieces_of(segments: int) -> int:
    """How many pieces a chapter of this many segments is packaged in."""
    return max(1, -(-segments // PIECE_SEGMENTS))


def part_key(book_id: str, n: int, piece: int, kind: str) -> str:
    """Piece `piece` of chapter n, kept for the remuxes: "m4a" its AAC packets, "mp3" its MP3
    frames, "json" its samples, spans and timed words. (A chapter of one piece has its MP3
    written as the chapter's download: `piece_mp3_key`.)"""
    return f"books/{book_id}/parts/{n:03d}-{piece:03d}.{kind}"


def piece_mp3_key(book_id: str, n: int, piece: int, pieces: int) -> str:
    """Where a piece's MP3 goes: the chapter's own file when it is the chapter's only one."""
    if pieces == 1:
        return output_key(book_id, chapter_file(n))
    return part_key(book_id, n, piece, "mp3")


def output_key(book_id: str, name: str) -> str:
    return f"books/{book_id}/out/{name}"


def chapter_file(n: int) -> str:
    """Where chapter n's MP3 is kept in the store (a key; users see `chapter_download_name`)."""
    return f"chapters/{n:03d}.mp3"


def encodings_for(formats: Iterable[str]) -> set[str]:
    """What each chapter is packaged into for these formats: its AAC for the M4B, its MP3
    for the book's MP3 and the chapter downloads, and always its words (the captions)."""
    formats = set(formats)
    return ({"words"} | ({"aac"} if "m4b" in formats else set())
            | ({"mp3"} if formats & {"mp3", "chapters"} else set()))


def packed_list(field: str | bytes | None) -> list[str]:
    """A `c{n}_packed` field's encodings."""
    text = field.decode() if isinstance(field, bytes) else field or ""
    return [e for e in text.split(",") if e]


def packaging(rec: dict) -> dict:
    """Where packaging stands: chapters packaged in every encoding the formats need, of all,
    and (while assembling) the seconds left at the pace pieces were encoded so far."""
    total = len(rec["chapter_list"])
    need = encodings_for(rec["formats"])
    done = sum(need <= set(c["packed"]) for c in rec["chapter_list"])
    eta = None
    if rec["state"] == BookState.DONE:
        done, eta = total, 0.0
    elif rec["state"] == BookState.ASSEMBLING and rec["packs"]:
        left = sum(not need <= set(p) for c in rec["chapter_list"] for p in c["pieces_packed"])
        # The remuxes after the last piece copy bytes: about one piece's encoding in all
        # (docs/benchmarks.md).
        eta = round(rec["pack_s"] / rec["packs"] * (left + 1), 1)
    return {"chapters_done": done, "chapters_total": total, "eta_s": eta}


# -- the names a user sees -------------------------------------------------------------------

# Windows' reserved device names, which no file may take whatever its extension.
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)),
             *(f"LPT{i}" for i in range(1, 10))}
_REPLACE = str.maketrans({"/": "-", "\\": "-", '"': "'", "<": None, ">": None, "|": None,
                          "?": None, "*": None})


def file_stem(title: str) -> str:
    """A title as a file name's stem, safe on every common file system (module docstring)."""
    stem = re.sub(r"\s*:\s+", " - ", title)  # 'One: The Frost' -> 'One - The Frost'
    stem = stem.replace(":", "-").translate(_REPLACE)  # '12:30' -> '12-30'
    stem = "".join(c for c in stem if c.isprintable() or c.isspace())
    stem = re.sub(r"\s+", " ", stem)[:_MAX_STEM].strip(" .")
    if stem.split(".")[0].upper() in _RESERVED:
        stem += "_"
    return stem


def book_download_name(title: str, book_id: str, fmt: str) -> str:
    """`The Tiny Book.m4b` (the book's id when the title has no usable character)."""
    return f"{file_stem(title) or book_id}.{fmt}"


def chapter_download_name(n: int, title: str) -> str:
    """`001 The Beginning.mp3` for chapter 0: numbered from 1, as a player lists tracks."""
    stem = file_stem(title)
    return f"{n + 1:03d} {stem}.mp3" if stem else f"{n + 1:03d}.mp3"


def captions_download_name(title: str, book_id: str, n: int | None, fmt: str) -> str:
    """`The Tiny Book.srt`, or `001 The Beginning.srt` for chapter 0 (as the audio's)."""
    if n is None:
        return book_download_name(title, book_id, fmt)
    return chapter_download_name(n, title).removesuffix(".mp3") + f".{fmt}"
