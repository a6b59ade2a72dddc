"""Packaging a book chapter by chapter (models/books/package.py) and the names its files get
(app/stores/book_files.py): what a listener and a file system see."""

from __future__ import annotations

import io
from contextlib import contextmanager

import av
import numpy as np
import pytest

from app.stores.book_files import chapter_download_name, file_stem
from models.books.assemble import BookMeta
from models.books.package import AAC_PRIMING, encode_piece, join_trim, remux_book
from tests.bookfiles import tiny_png

SR = 24_000
TONES = (330.0, 440.0, 550.0)


def chapter(n: int, seconds: float, pause_s: float) -> list[bytes]:
    """A chapter as its segments arrive: two tones, then its closing pause (zeros, as the
    segment tasks store a pause)."""
    t = np.arange(int(seconds * SR)) / SR
    tone = (np.sin(2 * np.pi * TONES[n] * t) * 8000).astype("<i2")
    half = tone.size // 2
    return [tone[:half].tobytes(), tone[half:].tobytes(),
            np.zeros(int(pause_s * SR), "<i2").tobytes()]


def package(lengths: list[tuple[float, float]], meta: BookMeta | None = None):
    meta = meta or BookMeta("The Tone Book", "A. Writer")
    parts, infos = [], []
    for n, (seconds, pause) in enumerate(lengths):
        aac, mp3 = io.BytesIO(), io.BytesIO()
        infos.append(encode_piece(chapter(n, seconds, pause), SR, meta, f"Tone {n + 1}",
                                    f"{n + 1}/{len(lengths)}", aac=aac, mp3=mp3,
                                    followed=n + 1 < len(lengths)))
        parts.append((aac.getvalue(), mp3.getvalue()))
    return meta, parts, infos


def remux(meta, parts, infos, kind: str, chapters=None, **tags) -> tuple[bytes, list[int]]:
    """The file and where each piece's audio begins in it (samples); by default each piece
    is a chapter of its own."""
    @contextmanager
    def opener(data: bytes):
        yield io.BytesIO(data)

    i, enc = (0, "aac") if kind == "m4b" else (1, "mp3")
    out = io.BytesIO()
    if chapters is None:
        chapters = [(f"Tone {n + 1}", n) for n in range(len(parts))]
    _, starts = remux_book([lambda d=p[i]: opener(d) for p in parts],
                           [info[enc]["span"] for info in infos], chapters, meta, SR, out,
                           kind, **tags)
    return out.getvalue(), starts


def decoded(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as c:
        return np.concatenate([f.to_ndarray().ravel() for f in c.decode(audio=0)])


def loud(x: np.ndarray) -> np.ndarray:
    """Where the audio sounds: 10 ms windows louder than -30 dBFS."""
    win = SR // 100
    frames = x[: x.size // win * win].reshape(-1, win)
    return np.sqrt((frames ** 2).mean(axis=1)) > 0.03


def test_join_trim_fits_the_next_pieces_priming_into_the_closing_pause():
    for samples in (47_104, 50_000, 50_600, 91_200):
        trim = join_trim(samples, trailing_quiet=5_000)
        assert (samples - trim + AAC_PRIMING) % 1024 == 0  # whole frames, no padding
        assert abs(AAC_PRIMING - trim) <= 512  # the pause changes by half a frame at most
    assert join_trim(50_000, trailing_quiet=10) == 0  # ends in sound: keeps every sample


@pytest.mark.parametrize("kind", ["m4b", "mp3"])
def test_the_remuxed_book_has_its_chapters_marks_tags_and_no_gap_at_the_joins(kind):
    lengths = [(3.3, 0.5), (2.71, 0.4), (4.05, 0.6)]
    meta, parts, infos = package(lengths)
    data, audio_at = remux(meta, parts, infos, kind)
    with av.open(io.BytesIO(data)) as c:
        assert c.metadata["title"] == c.metadata["album"] == "The Tone Book"
        assert c.metadata["artist"] == "A. Writer" and c.metadata["genre"] == "Audiobook"
        marks = c.chapters()
        assert [m["metadata"]["title"] for m in marks] == ["Tone 1", "Tone 2", "Tone 3"]
        starts = [float(m["start"] * m["time_base"]) for m in marks]
    audio = decoded(data)
    real = sum(info["samples"] for info in infos)
    # Every sample is there, and the joins add little: the AAC's absorbed in the pauses.
    extra = (audio.size - real) / SR
    assert 0 <= extra < (0.1 if kind == "m4b" else 0.25), extra
    # Each chapter's tone sounds where its mark and lead say, for as long as it was made.
    sounding = loud(audio)
    for n, ((seconds, _), start, at) in enumerate(zip(lengths, starts, audio_at, strict=True)):
        assert 0 <= at / SR - start < 0.05  # the chapter's mark just before its audio
        first = int(at / SR * 100)
        assert sounding[first + 2: first + int(seconds * 100) - 2].all(), n
        assert not sounding[first + int(seconds * 100) + 3: first + int(seconds * 100) + 30].any()
        seg = audio[at + SR // 10: at + SR // 10 + SR // 2]  # the right tone: its pitch
        peak = np.argmax(np.abs(np.fft.rfft(seg))) * SR / seg.size
        assert peak == pytest.approx(TONES[n], abs=4)


@pytest.mark.parametrize("kind", ["m4b", "mp3"])
def test_the_book_carries_its_cover_as_one_attached_picture(kind):
    meta = BookMeta("Sea Stories", "Ann Writer", tiny_png(), "image/png")
    data, _ = remux(*package([(1.0, 0.3), (1.2, 0.3)], meta), kind)
    if kind == "m4b":
        assert data[4:12] == b"ftypM4B "
    with av.open(io.BytesIO(data)) as c:
        pics = [s for s in c.streams if s.disposition & av.stream.Disposition.attached_pic]
        assert len(pics) == 1, "the cover is attached"
        assert c.metadata["artist"] == "Ann Writer"
    assert decoded(data).size / SR == pytest.approx(2.8, abs=0.15)  # tones and pauses


def test_a_chapter_of_several_pieces_is_one_mp3_with_every_piece_and_its_tags():
    meta, parts, infos = package([(2.0, 0.3), (1.5, 0.3), (1.8, 0.3)])
    data, starts = remux(meta, parts, infos, "mp3", chapters=[], title="Tone", track="4/9")
    with av.open(io.BytesIO(data)) as c:
        assert c.metadata["title"] == "Tone" and c.metadata["track"] == "4/9"
        assert c.metadata["album"] == "The Tone Book" and not c.chapters()
    audio = decoded(data)
    # Every piece's samples, and the MP3 joins' pauses: under 80 ms each at 24 kHz.
    assert 0 <= audio.size - sum(i["samples"] for i in infos) < 2 * 0.08 * SR
    sounding = loud(audio)
    for (seconds, _), at in zip([(2.0, 0), (1.5, 0), (1.8, 0)], starts, strict=True):
        first = int(at / SR * 100)
        assert sounding[first + 2: first + int(seconds * 100) - 2].all()


def test_a_chapter_mp3_is_whole_and_tagged_as_its_track():
    meta, parts, infos = package([(1.5, 0.3), (1.2, 0.3)])
    with av.open(io.BytesIO(parts[1][1])) as c:
        assert c.metadata["title"] == "Tone 2" and c.metadata["track"] == "2/2"
    assert decoded(parts[1][1]).size == infos[1]["samples"]  # the LAME tag trims its delay


def test_file_names_keep_the_title_and_are_safe_on_every_file_system():
    assert chapter_download_name(0, "Chapter One: The Frost") == "001 Chapter One - The Frost.mp3"
    assert file_stem("At 12:30, Either/Or?") == "At 12-30, Either-Or"
    assert file_stem('Say "Hi" <now>|*') == "Say 'Hi' now"
    assert file_stem("Ünïcödé — “quotes” & (more)") == "Ünïcödé — “quotes” & (more)"
    assert file_stem("  trailing dots... ") == "trailing dots"
    assert file_stem("con") == "con_" and file_stem("Con Air") == "Con Air"
    assert chapter_download_name(4, "???") == "005.mp3"


def test_the_progress_line_says_what_packaging_has_left():
    from app.cli.book import book_progress_note

    book = {"state": "assembling", "chapters": [],
            "packaging": {"chapters_done": 7, "chapters_total": 10, "eta_s": 11.6}}
    assert book_progress_note(book) == "packaging: chapter 7/10 encoded, about 12 s left"
    book["packaging"]["eta_s"] = None  # no chapter timed yet: no guess
    assert book_progress_note(book) == "packaging: chapter 7/10 encoded"
