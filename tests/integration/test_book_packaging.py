"""Packaging a book as it renders: each chapter encoded once its segments are stored, while
later chapters render, and the book's files remuxed from those encodings. The Flask app
(test client) over real Redis, a real artifact store, and real acoustic, vocoder and book
(gevent) worker processes on the real queues."""

from __future__ import annotations

import io
import random
import re

import av
import pytest

from tests.helpers import running_farm, wait_book, wait_until
from tests.integration.test_books import duration, json_book

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pack_farm(redis_url, tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    with running_farm(redis_url, 6, tmp_path_factory.mktemp("packaging"), book=True,
                      store_dir=str(store), visibility_timeout=5, book_stall_s=5) as tf:
        yield tf


@pytest.fixture(scope="module")
def pclient(pack_farm):
    from web import create_app

    return create_app(pack_farm.settings, pack_farm.farm).test_client()


def titled(book: dict) -> dict:
    """The book's chapters titled as books title them, with a colon."""
    for n, ch in enumerate(book["chapters"]):
        ch["title"] = f"Part {n + 1}: The {('Thaw', 'Fair', 'Frost', 'Ice', 'Fog')[n % 5]}"
    return book


def fresh_book(title: str, chapters: int, sentences: int) -> dict:
    """json_book's book in words no earlier run spoke, its first chapter short: these tests
    need later chapters still rendering while the first packages. Every other book of the
    suite shares json_book's lines, whose features the cache holds for minutes (a book of
    cached lines stores every segment in seconds), and a busy box encodes slowly: a first
    chapter of two sentences packages in a fraction of the time the rest take to render."""
    run = random.randrange(1000, 10000)
    book = json_book(title, chapters, sentences)
    book["chapters"][0] = json_book(title, 1, 2)["chapters"][0]
    for ch in book["chapters"]:
        ch["text"] = ch["text"].replace(" of part ", f" of run {run}, part ")
    return book


def part_file(farm, book_id: str, n: int):
    return farm.store.root / "books" / book_id / "parts" / f"{n:03d}-000.m4a"


def cue_times(vtt: str) -> list[float]:
    def secs(t: str) -> float:
        h, m, s = t.split(":")
        return int(h) * 3600 + int(m) * 60 + float(s)

    return [secs(a) for a, _ in re.findall(r"(\d+:\d\d:\d\d\.\d+) --> (\d+:\d\d:\d\d\.\d+)",
                                            vtt)]


def test_chapters_are_packaged_while_later_ones_render_and_the_book_is_their_remux(pack_farm,
                                                                                   pclient):
    book = titled(fresh_book("Frost Fair", 5, 6))
    resp = pclient.post("/v1/books", json={**book, "formats": ["m4b", "mp3", "chapters"]})
    assert resp.status_code == 202, resp.get_json()
    book_id = resp.get_json()["id"]
    seen: dict[str, int] = {"packaged while rendering": 0}

    def watch(b: dict) -> bool:
        if b["state"] == "rendering" and b.get("packaging"):
            seen["packaged while rendering"] = max(seen["packaged while rendering"],
                                                   b["packaging"]["chapters_done"])
        return False

    done = wait_book(pclient, book_id, until=watch, timeout_s=240)
    # Packaging overlapped rendering: a chapter was encoded before the last one rendered.
    assert seen["packaged while rendering"] >= 1, seen
    assert done["packaging"] == {"chapters_done": 5, "chapters_total": 5, "eta_s": 0.0}

    manifest = pclient.get(done["links"]["manifest"]).get_json()
    titles = [c["title"] for c in book["chapters"]]
    assert [c["title"] for c in manifest["chapters"]] == titles
    assert manifest["chapters"][0]["file"] == "001 Part 1 - The Thaw.mp3"
    assert manifest["duration_s"] == pytest.approx(done["audio_seconds"], abs=0.05)
    starts = [c["start_s"] for c in manifest["chapters"]]
    for fmt, slack in (("m4b", 0.2), ("mp3", 0.5)):
        data = pclient.get(done["links"][fmt]).data
        with av.open(io.BytesIO(data)) as c:
            marks = c.chapters()
            assert [m["metadata"]["title"] for m in marks] == titles, fmt
            assert c.metadata["title"] == "Frost Fair" and c.metadata["artist"] == "Test Author"
            assert c.metadata["genre"] == "Audiobook"
            if fmt == "m4b":  # the manifest places chapters as the M4B does
                assert [float(m["start"] * m["time_base"]) for m in marks] == pytest.approx(
                    starts, abs=0.01)
        # Every sample of every chapter, and little more: the joins' silence.
        assert 0 <= duration(data) - manifest["duration_s"] < slack, fmt
    for n, ch in enumerate(manifest["chapters"]):
        audio = pclient.get(f"/v1/books/{book_id}/chapters/{n}/audio")
        assert audio.status_code == 200
        assert duration(audio.data) == pytest.approx(ch["duration_s"], abs=0.01)
        assert f'filename="{ch["file"]}"' in audio.headers["Content-Disposition"]
    # The book's captions: each chapter's words from where its audio begins, in order.
    cues = cue_times(pclient.get(f"/v1/books/{book_id}/captions?format=vtt").text)
    assert cues == sorted(cues) and len(cues) >= 5
    assert cues[-1] < manifest["duration_s"] + 0.2
    for ch in manifest["chapters"][1:]:
        assert any(ch["start_s"] <= t < ch["start_s"] + ch["duration_s"] for t in cues)


def test_book_worker_killed_while_assembling_redoes_no_packaged_chapter(pack_farm, pclient):
    farm = pack_farm.farm
    resp = pclient.post("/v1/books", json=fresh_book("Ice Road", 4, 4))
    assert resp.status_code == 202, resp.get_json()
    book_id = resp.get_json()["id"]
    first = part_file(farm, book_id, 0)
    wait_until(lambda: farm.books.state(book_id) == "assembling" and first.exists(), 180,
               lambda: f"never assembling: {farm.books.get(book_id)}", interval_s=0.002)
    made = first.stat().st_mtime_ns
    worker = next(w for w in pack_farm.workers if w.queue == "book")
    worker.kill()
    pack_farm.workers.remove(worker)
    pack_farm.start_worker("book")
    book = wait_book(pclient, book_id, timeout_s=120)
    assert book["packaging"]["chapters_done"] == 4
    # Chapter 0 was packaged while chapter 3 rendered: neither the killed assembly nor the
    # one after it encoded it again (an atomic rewrite would be a new file).
    assert first.stat().st_mtime_ns == made
    with av.open(io.BytesIO(pclient.get(book["links"]["m4b"]).data)) as c:
        assert [m["metadata"]["title"] for m in c.chapters()] == [
            f"Part {n + 1}" for n in range(4)]


def test_a_format_added_later_packages_only_what_it_lacks(pack_farm, pclient):
    farm = pack_farm.farm
    book = json_book("Fog Bank", 3, 2)
    resp = pclient.post("/v1/books", json={**book, "formats": ["m4b"]})
    assert resp.status_code == 202, resp.get_json()
    book_id = resp.get_json()["id"]
    done = wait_book(pclient, book_id, timeout_s=180)
    assert "mp3" not in done["links"]
    m4a = [part_file(farm, book_id, n).stat().st_mtime_ns for n in range(3)]

    again = pclient.post("/v1/books", json={**book, "formats": ["mp3"]})
    assert again.status_code == 200 and again.get_json()["id"] == book_id
    done = wait_book(pclient, book_id, timeout_s=120)
    with av.open(io.BytesIO(pclient.get(done["links"]["mp3"]).data)) as c:
        assert [m["metadata"]["title"] for m in c.chapters()] == ["Part 1", "Part 2", "Part 3"]
    # The chapters' AAC was made once: the new format encoded MP3 only.
    assert [part_file(farm, book_id, n).stat().st_mtime_ns for n in range(3)] == m4a
    assert pclient.get(done["links"]["m4b"]).status_code == 200


def test_a_long_chapter_is_packaged_in_pieces_and_joined_whole(pack_farm, pclient):
    """A chapter of more than PIECE_SEGMENTS segments is encoded piece by piece as they are
    stored; its download and the book are its pieces joined, every sample there."""
    from app.stores.book_files import PIECE_SEGMENTS

    farm = pack_farm.farm
    resp = pclient.post("/v1/books", json={**json_book("One Long Night", 1, 24),
                                           "formats": ["m4b", "chapters"]})
    assert resp.status_code == 202, resp.get_json()
    book_id = resp.get_json()["id"]
    done = wait_book(pclient, book_id, timeout_s=240)
    total = done["chapters"][0]["segments"]["total"]
    assert total > PIECE_SEGMENTS, total  # the book this test needs
    assert part_file(farm, book_id, 0).exists()
    assert (part_file(farm, book_id, 0).parent / "000-001.m4a").exists()
    manifest = pclient.get(done["links"]["manifest"]).get_json()
    chapter = pclient.get(f"/v1/books/{book_id}/chapters/0/audio").data
    # One MP3 join inside the chapter: its pause, under 80 ms, and nothing missing.
    assert 0 <= duration(chapter) - manifest["duration_s"] < 0.08 * (-(-total // 40))
    m4b = pclient.get(done["links"]["m4b"]).data
    assert 0 <= duration(m4b) - manifest["duration_s"] < 0.2
    cues = cue_times(pclient.get(f"/v1/books/{book_id}/chapters/0/captions?format=vtt").text)
    assert cues == sorted(cues) and cues[-1] < duration(chapter)
