"""Assembly: chapter files, an M4B and an MP3 whose chapters and tags read back with PyAV."""

from __future__ import annotations

import io
import json
from contextlib import contextmanager

import av
import numpy as np

from models.books.assemble import BookMeta, ChapterAudio, assemble_book
from tests.bookfiles import tiny_png

SR = 22050


def tone(seconds: float, freq: float) -> bytes:
    t = np.arange(int(SR * seconds)) / SR
    return (np.sin(2 * np.pi * freq * t) * 8000).astype("<i2").tobytes()


def chapters() -> list[ChapterAudio]:
    # Three chapters of 2, 3 and 1.5 seconds, each made of several "segments".
    spec = [("Opening", [tone(0.5, 220), tone(1.5, 330)]),
            ("Middle", [tone(1.0, 440), tone(1.0, 550), tone(1.0, 660)]),
            ("Close", [tone(1.5, 770)])]
    return [ChapterAudio(t, sum(len(p) // 2 for p in parts), lambda parts=parts: iter(parts))
            for t, parts in spec]


def duration(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as c:
        return sum(f.samples for f in c.decode(audio=0)) / c.streams.audio[0].sample_rate


def test_m4b_mp3_and_chapter_files_carry_chapters_tags_and_cover():
    m4b, mp3, files = io.BytesIO(), io.BytesIO(), {}

    @contextmanager
    def chapter_file(n):
        buf = io.BytesIO()
        yield buf
        files[n] = buf.getvalue()

    meta = BookMeta("Sea Stories", "Ann Writer", tiny_png(), "image/png")
    manifest = assemble_book(chapters(), meta, SR, m4b=m4b, mp3=mp3, chapter_file=chapter_file,
                             chapter_name=lambda n: f"chapters/{n:03d}.mp3")
    assert [c["title"] for c in manifest["chapters"]] == ["Opening", "Middle", "Close"]
    assert [c["start_s"] for c in manifest["chapters"]] == [0.0, 2.0, 5.0]
    assert manifest["duration_s"] == 6.5
    json.dumps(manifest)

    assert m4b.getvalue()[4:12] == b"ftypM4B "
    for data in (m4b.getvalue(), mp3.getvalue()):
        with av.open(io.BytesIO(data)) as c:
            marks = c.chapters()
            assert [m["metadata"]["title"] for m in marks] == ["Opening", "Middle", "Close"]
            starts = [float(m["start"] * m["time_base"]) for m in marks]
            assert starts == sorted(starts) and abs(starts[1] - 2.0) < 0.05
            assert c.metadata["title"] == "Sea Stories"
            assert c.metadata["artist"] == "Ann Writer"
            pics = [s for s in c.streams if s.disposition & av.stream.Disposition.attached_pic]
            assert len(pics) == 1, "the cover is attached"
        assert abs(duration(data) - 6.5) < 0.1

    assert sorted(files) == [0, 1, 2]
    lengths = [duration(files[n]) for n in range(3)]
    assert [round(x, 1) for x in lengths] == [2.0, 3.0, 1.5]
    assert abs(sum(lengths) - duration(m4b.getvalue())) < 0.15


def test_segments_are_read_one_at_a_time():
    """The encoder pulls segments lazily: at no point are two chapters' parts alive."""
    opened = []

    def parts(n):
        def gen():
            for i in range(3):
                opened.append((n, i))
                yield tone(0.2, 300)
        return gen

    chs = [ChapterAudio(f"C{n}", 3 * int(SR * 0.2), parts(n)) for n in range(2)]
    assemble_book(chs, BookMeta("T"), SR, m4b=io.BytesIO())
    assert opened == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
