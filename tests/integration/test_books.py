"""Books end to end: the Flask app (test client) over real Redis, a real artifact store, and
real acoustic, vocoder and book (gevent) worker processes on the real queues."""

from __future__ import annotations

import io
import json
import os
import time

import av
import pytest

from app.stores.states import BookState
from tests import bookfiles
from tests.helpers import running_farm, wait_book, wait_state, wait_until

pytestmark = pytest.mark.integration

SENTENCES = [
    "The lighthouse keeper climbed the stairs at dusk.",
    "He lit the lamp and watched the ships go by.",
    "A storm gathered far out beyond the reef.",
    "By morning the sea had turned a quiet grey.",
    "Children ran along the sand looking for shells.",
    "The keeper wrote everything down in his log.",
]


def json_book(title: str, chapters: int, sentences: int) -> dict:
    return {"title": title, "author": "Test Author", "chapters": [
        {"title": f"Part {c + 1}", "text": " ".join(
            f"{SENTENCES[(c + i) % len(SENTENCES)]} That was line {i + 1} of part {c + 1}."
            for i in range(sentences))} for c in range(chapters)]}


@pytest.fixture(scope="module")
def book_farm(redis_url, tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    # A short visibility timeout: a killed worker's segment comes back in seconds; a short
    # stall time: a book whose messages were lost is resumed in seconds; and a short planning
    # slice: any book of more than a few chapters is planned across several messages.
    with running_farm(redis_url, 6, tmp_path_factory.mktemp("books"), book=True,
                      store_dir=str(store), visibility_timeout=5, book_stall_s=5,
                      book_plan_slice_s=0.1) as tf:
        yield tf


@pytest.fixture(scope="module")
def bclient(book_farm):
    from web import create_app

    return create_app(book_farm.settings, book_farm.farm).test_client()


def upload(client, data: bytes, name: str, **form):
    return client.post("/v1/books", data={"file": (io.BytesIO(data), name), **form},
                       content_type="multipart/form-data")


def segment_files(farm, book_id: str) -> list[str]:
    return farm.store.list(f"books/{book_id}/segments/")


def duration(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as c:
        return sum(f.samples for f in c.decode(audio=0)) / c.streams.audio[0].sample_rate


def test_epub_renders_to_m4b_with_chapter_markers(book_farm, bclient):
    epub = bookfiles.make_epub()
    resp = upload(bclient, epub, "harbour.epub", formats="m4b,mp3,chapters")
    assert resp.status_code == 202, resp.get_json()
    book = resp.get_json()
    # A fast broker may hand the prepare to the book worker before this answer is built.
    assert book["state"] in ("queued", "preparing") and book["title"] == "Harbour Tales"

    book = wait_book(bclient, book["id"])
    titles = [t for t, _ in bookfiles.CHAPTERS]
    assert [c["title"] for c in book["chapters"]] == titles  # cover, copyright, blank skipped
    assert all(c["segments"]["done"] == c["segments"]["total"] > 0 for c in book["chapters"])
    assert len(segment_files(book_farm.farm, book["id"])) == book["segments"]["total"]

    m4b = bclient.get(book["links"]["m4b"])
    assert m4b.status_code == 200 and m4b.data[4:12] == b"ftypM4B "
    with av.open(io.BytesIO(m4b.data)) as c:
        marks = c.chapters()
        assert [m["metadata"]["title"] for m in marks] == titles
        starts = [float(m["start"] * m["time_base"]) for m in marks]
        assert starts[0] == 0 and starts[0] < starts[1] < starts[2]
        assert c.metadata["title"] == "Harbour Tales" and c.metadata["artist"] == "Ann Writer"
        assert any(s.disposition & av.stream.Disposition.attached_pic for s in c.streams)
    chapter_lengths = [duration(bclient.get(f"/v1/books/{book['id']}/chapters/{n}/audio").data)
                       for n in range(3)]
    assert all(x > 1.0 for x in chapter_lengths)
    assert abs(duration(m4b.data) - sum(chapter_lengths)) < 0.2

    with av.open(io.BytesIO(bclient.get(book["links"]["mp3"]).data)) as c:
        assert [m["metadata"]["title"] for m in c.chapters()] == titles

    manifest = bclient.get(book["links"]["manifest"]).get_json()
    assert [c["title"] for c in manifest["chapters"]] == titles
    assert [c["start_s"] for c in manifest["chapters"]] == pytest.approx(starts, abs=0.05)

    again = upload(bclient, epub, "same-book-other-name.epub", formats="chapters,m4b,mp3")
    assert again.status_code == 200 and again.get_json()["id"] == book["id"]


def test_vocoder_sigkill_mid_book_every_segment_exactly_once(book_farm, bclient):
    resp = bclient.post("/v1/books", json=json_book("Crash Course", 2, 4))
    assert resp.status_code == 202, resp.get_json()
    book_id = resp.get_json()["id"]
    wait_book(bclient, book_id, until=lambda b: b["segments"]["done"] >= 2)
    vocoder = next(w for w in book_farm.workers if w.queue == "vocoder")
    vocoder.kill()
    book_farm.workers.remove(vocoder)
    mid = bclient.get(f"/v1/books/{book_id}").get_json()
    assert mid["state"] == "rendering" and mid["segments"]["done"] < mid["segments"]["total"]
    book_farm.start_worker("vocoder")

    book = wait_book(bclient, book_id, timeout_s=150)
    total = book["segments"]["total"]
    assert book["segments"]["done"] == total
    files = segment_files(book_farm.farm, book_id)
    assert len(files) == total == len(set(files))
    for c in book["chapters"]:
        assert len([f for f in files if f"/segments/{c['index']:04d}/" in f]) == \
            c["segments"]["total"]
    manifest = bclient.get(f"/v1/books/{book_id}/manifest").get_json()
    assert manifest["duration_s"] == pytest.approx(book["audio_seconds"], abs=0.01)


def test_a_book_whose_queued_segments_were_lost_is_resumed_by_the_book_pool(book_farm,
                                                                          bclient):
    """The messages of a book's queued segments vanish (a broker that died inside its last
    second of writes): nothing would render them, and nobody re-submits. The book pool's
    heartbeat finds the book without progress and with nothing queued, and resumes it; the
    book completes with each segment stored once."""
    resp = bclient.post("/v1/books", json=json_book("Lost At Sea", 2, 4))
    assert resp.status_code == 202, resp.get_json()
    book_id = resp.get_json()["id"]
    wait_book(bclient, book_id, until=lambda b: b["segments"]["done"] >= 1)
    assert book_farm.farm.celery.control.purge() > 0  # every queued message is gone
    mid = bclient.get(f"/v1/books/{book_id}").get_json()
    assert mid["state"] == "rendering" and mid["segments"]["done"] < mid["segments"]["total"]

    book = wait_book(bclient, book_id, timeout_s=150)
    total = book["segments"]["total"]
    assert book["segments"]["done"] == total
    files = segment_files(book_farm.farm, book_id)
    assert len(files) == total == len(set(files))
    assert f"book {book_id} resumed: no progress for 5 s" in book_farm.log_tail("book")


def test_a_book_whose_assembly_message_was_lost_is_assembled_by_the_book_pool(book_farm,
                                                                              bclient):
    """Every segment is stored but the assembly's message vanished: the book sits in
    `assembling` with nothing running it. No progress for `book_stall_s` (an assembly that
    runs marks progress as it encodes), so the book pool sends the assembly again."""
    farm = book_farm.farm
    resp = bclient.post("/v1/books", json=json_book("Never Bound", 1, 2))
    assert resp.status_code == 202, resp.get_json()
    book_id = resp.get_json()["id"]
    wait_book(bclient, book_id, timeout_s=120)
    # As the last stored segment leaves it: assembling, its progress just marked, and no
    # assembly message anywhere.
    moved, _ = farm.books.move(book_id, (BookState.DONE,), BookState.ASSEMBLING)
    assert moved
    farm.redis.zadd(farm.keys.books_progress, {book_id: time.time()})
    book = wait_book(bclient, book_id, timeout_s=60)
    assert book["segments"]["done"] == book["segments"]["total"]
    m4b = bclient.get(book["links"]["m4b"])
    assert m4b.status_code == 200 and m4b.data[4:12] == b"ftypM4B "
    assert f"book {book_id} resumed: no progress for 5 s" in book_farm.log_tail("book")


def test_a_long_book_step_marks_progress_while_it_runs_and_stops_after(book_farm):
    """Encoding a long book takes longer than `book_stall_s` (5 s here): the step marks the
    book's progress as it runs, so the sweeper never takes it for a lost one. (Planning marks
    it at every turn's checkpoint.)"""
    from tasks.books import _marking_progress

    farm, key, book_id = book_farm.farm, book_farm.farm.keys.books_progress, "bk-long-step"
    farm.redis.zadd(key, {book_id: 1.0})
    try:
        with _marking_progress(farm, book_id):
            wait_until(lambda: farm.redis.zscore(key, book_id) > time.time() - 2, 10,
                       "the running step marked no progress")
        after = farm.redis.zscore(key, book_id)
        time.sleep(2)  # more than one beat (5 s / 4)
        assert farm.redis.zscore(key, book_id) == after
    finally:
        farm.books.forget_progress(book_id)


def test_interactive_job_overtakes_a_book(book_farm, bclient):
    resp = bclient.post("/v1/books", json=json_book("Long Haul", 4, 8))
    book_id = resp.get_json()["id"]
    wait_book(bclient, book_id, until=lambda b: b["segments"]["done"] >= 1)
    job = bclient.post("/v1/jobs", json={"text": "Is anyone there?"}).get_json()
    wait_state(bclient, job["id"], timeout_s=60)
    book = bclient.get(f"/v1/books/{book_id}").get_json()
    assert book["state"] == "rendering", "the job finished before the book's remaining segments"
    assert book["segments"]["done"] < book["segments"]["total"] - 4
    bclient.delete(f"/v1/books/{book_id}")


def test_cancel_removes_files_and_skips_queued_segments(book_farm, bclient):
    resp = bclient.post("/v1/books", json=json_book("Cut Short", 3, 8))
    book_id = resp.get_json()["id"]
    wait_book(bclient, book_id, until=lambda b: b["segments"]["done"] >= 1)
    at_cancel = bclient.delete(f"/v1/books/{book_id}").get_json()
    assert at_cancel["state"] == "canceled"
    # Segments already running finish, find the book canceled and take back what they wrote.
    # The sign that they had their chance: every segment of a book submitted after the cancel
    # is stored. The farm's one acoustic and one vocoder worker process each take their batch
    # queue in order, one task at a time, so by then every segment of the canceled book has
    # been taken (the one in hand finished, the queued ones skipped), and so has any vocoder
    # task those chained.
    after = bclient.post("/v1/books", json=json_book("After The Cut", 1, 1)).get_json()
    wait_book(bclient, after["id"], states=(),
              until=lambda b: 0 < b["segments"]["done"] == b["segments"]["total"])
    book = bclient.get(f"/v1/books/{book_id}").get_json()
    assert book["state"] == "canceled"
    assert book["segments"]["done"] == at_cancel["segments"]["done"] < book["segments"]["total"]
    assert book_farm.farm.store.list(f"books/{book_id}/") == []
    assert bclient.get(f"/v1/books/{book_id}/audio").status_code == 409
    assert bclient.post(f"/v1/books/{book_id}/retry").status_code == 409


def test_failed_book_retry_renders_only_what_is_missing(book_farm, bclient):
    resp = bclient.post("/v1/books", json=json_book("Second Wind", 2, 3))
    book_id = resp.get_json()["id"]
    wait_book(bclient, book_id, until=lambda b: b["segments"]["done"] >= 2)
    farm = book_farm.farm
    assert farm.books.fail(book_id, 1, "some text", "chapter 1, segment 0: boom")
    failed = bclient.get(f"/v1/books/{book_id}").get_json()
    assert failed["state"] == "failed"
    assert failed["error"] == {"message": "chapter 1, segment 0: boom", "chapter": 1,
                               "text": "some text"}
    before = {k: farm.store.local_path(k) for k in segment_files(farm, book_id)}
    mtimes = {k: os.stat(p).st_mtime_ns for k, p in before.items()}
    assert bclient.post(f"/v1/books/{book_id}/retry").status_code == 202
    book = wait_book(bclient, book_id)
    assert book["error"] is None
    files = segment_files(farm, book_id)
    assert len(files) == book["segments"]["total"]
    # Segments stored before the failure were not rendered again.
    assert all(os.stat(farm.store.local_path(k)).st_mtime_ns == m for k, m in mtimes.items())


# -- planning: books side by side, stopped when asked --------------------------------------


def long_book(settings, title: str) -> bytes:
    """A TXT near the largest the upload caps admit (most of `max_book_words`, in
    `max_book_chapters` chapters): its plan takes the book worker minutes."""
    chapters = settings.max_book_chapters
    per_chapter = int(settings.max_book_words * 0.8) // chapters
    out = [f"{title}\n\n"]
    for c in range(chapters):
        body, words, i = [], 0, 0
        while words < per_chapter:
            line = f"{SENTENCES[(c + i) % len(SENTENCES)]} That was line {i + 1}."
            body.append(line)
            words += len(line.split())
            i += 1
        out.append(f"Chapter {c + 1}\n\n{' '.join(body)}\n\n")
    return "".join(out).encode()


def book_worker_usage(book_farm) -> tuple[float, int]:
    """The book worker's CPU seconds so far and its resident memory in bytes (/proc)."""
    pid = next(w for w in book_farm.workers if w.queue == "book").proc.pid
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # from field 3 (state) on
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return cpu_s, int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # rss, in pages


def book_worker_busy(book_farm, window_s: float = 0.5) -> float:
    """The book worker's share of a core over the next `window_s`."""
    before, _ = book_worker_usage(book_farm)
    time.sleep(window_s)
    return (book_worker_usage(book_farm)[0] - before) / window_s


def start_long_book(book_farm, bclient, title: str) -> str:
    """Upload a long book and return its id once the book worker is busy planning it."""
    cpu_s, _ = book_worker_usage(book_farm)
    resp = upload(bclient, long_book(book_farm.settings, title), f"{title}.txt")
    assert resp.status_code == 202, resp.get_json()
    book_id = resp.get_json()["id"]
    # A second of the worker's CPU spent on it: planning is under way, however busy the box.
    wait_until(lambda: book_farm.farm.books.state(book_id) == "preparing"
               and book_worker_usage(book_farm)[0] > cpu_s + 1.0, 60,
               lambda: f"never seen planning: {book_farm.farm.books.state(book_id)}")
    return book_id


def test_a_small_book_renders_while_a_long_one_is_planned(book_farm, bclient):
    """One key's long book is being planned (minutes of the text frontend) when another's
    7-word book comes: the small one is planned in the long one's gaps and renders at once,
    not after the long one's plan."""
    long_id = start_long_book(book_farm, bclient, "The Long Voyage")
    small = bclient.post("/v1/books", json={"title": "Seven Words", "chapters": [
        {"title": "One", "text": "The cat sat on the warm mat."}]})
    assert small.status_code == 202, small.get_json()
    book = wait_book(bclient, small.get_json()["id"], states=(), timeout_s=10,
                     until=lambda b: b["state"] != "preparing" and b["segments"]["done"] >= 1)
    assert book["state"] in ("rendering", "assembling", "done")
    assert book_farm.farm.books.state(long_id) == "preparing"  # still planning the long one
    assert bclient.delete(f"/v1/books/{long_id}").get_json()["state"] == "canceled"
    wait_book(bclient, book["id"], timeout_s=60)
    wait_until(lambda: book_worker_busy(book_farm) < 0.1, 10, "the long book is still planned")


def test_a_book_planned_across_several_messages_has_the_plan_made_at_once(book_farm,
                                                                          bclient):
    """Each prepare message plans for `book_plan_slice_s` (a tenth of a second here), then
    hands over at a chapter's end to a fresh one that carries on from the checkpoint: the
    chapters, their segments and the plan files are those of a plan made in one go."""
    from tasks.book_planning import _chapter_segments

    farm = book_farm.farm
    book = json_book("Many Hands", 48, 10)
    book["chapters"].insert(3, {"title": "Interlude", "text": "... !!! ..."})  # nothing to say
    resp = bclient.post("/v1/books", json=book)
    assert resp.status_code == 202, resp.get_json()
    book_id = resp.get_json()["id"]
    wait_book(bclient, book_id, states=("rendering", "assembling", "done"), timeout_s=120)
    handovers = int(farm.redis.hget(farm.keys.book(book_id), "plan_gen")) - 1
    assert handovers >= 1, "planned in one message: make the book longer"
    stored = json.loads(farm.store.get(f"books/{book_id}/book.json"))["chapters"]
    rec = farm.books.get(book_id)
    at_once: dict[int, list[dict]] = {}
    for n, spec in _chapter_segments(stored, 0, rec["voice"], rec["speed"]):
        at_once.setdefault(n, [])
        if spec is not None:
            at_once[n].append(spec)
    spoken = [n for n in sorted(at_once) if at_once[n]]
    assert [c["title"] for c in rec["chapter_list"]] == [stored[n]["title"] for n in spoken]
    assert "Interlude" not in [c["title"] for c in rec["chapter_list"]]
    assert rec["total"] == sum(len(at_once[n]) for n in spoken)
    for c, n in enumerate(spoken):
        assert rec["chapter_list"][c]["total"] == len(at_once[n])
        plan = json.loads(farm.store.get(f"books/{book_id}/plan/{c:04d}.json"))
        assert plan == json.loads(json.dumps(at_once[n]))
    bclient.delete(f"/v1/books/{book_id}")


def test_delete_stops_a_book_being_planned_and_frees_the_worker(book_farm, bclient):
    """DELETE of a book in `preparing` stops its planning within a turn: the book worker
    goes idle within 2 s, the plan files made so far are removed, and its memory stops
    growing."""
    book_id = start_long_book(book_farm, bclient, "The Cut Voyage")
    assert bclient.delete(f"/v1/books/{book_id}").get_json()["state"] == "canceled"
    wait_until(lambda: book_worker_busy(book_farm, 0.25) < 0.1, 2,
               lambda: f"the book worker is still busy: {book_worker_busy(book_farm):.2f} of "
                       "a core")
    _, rss = book_worker_usage(book_farm)
    wait_until(lambda: book_farm.farm.store.list(f"books/{book_id}/") == [], 5,
               "the plan files made before the cancel are still there")
    assert book_farm.farm.books.state(book_id) == "canceled"
    assert book_worker_busy(book_farm, 1.0) < 0.1
    assert book_worker_usage(book_farm)[1] < rss + 20 * 1024 * 1024


# -- bad input: a clear 4xx and nothing written ---------------------------------------------


def _nothing_written(book_farm) -> tuple[int, list[str]]:
    r = book_farm.farm.redis
    return len(r.keys(f"{book_farm.settings.key_prefix}:book:*")), sorted(
        book_farm.farm.store.list("books/"))


BAD_UPLOADS = {
    "text_posing_as_epub": (b"Chapter 1\nJust text.", "book.epub", 415, "wrong_format"),
    "png_posing_as_text": (bookfiles.tiny_png, "book.txt", 415, "wrong_format"),
    "zip_posing_as_html": (b"PK\x03\x04rest", "book.html", 415, "wrong_format"),
    "unknown_extension": (b"hello", "book.pdf", 415, "unsupported_format"),
    "corrupt_epub": (bookfiles.corrupt_epub, "book.epub", 422, "corrupt_epub"),
    "zip_bomb": (bookfiles.zip_bomb, "book.epub", 413, "archive_too_large"),
    "path_traversal": (bookfiles.traversal_epub, "book.epub", 422, "unsafe_archive"),
    "drm": (bookfiles.drm_epub, "book.epub", 422, "drm_protected"),
    "billion_laughs": (bookfiles.entity_epub, "book.epub", 422, "unsafe_xml"),
    "xxe": (lambda: bookfiles.entity_epub(bookfiles.XXE), "book.epub", 422, "unsafe_xml"),
    "no_text": (b"  \n\n ... \n", "book.txt", 422, "no_text"),
    "empty_epub": (lambda: bookfiles.make_epub(chapters=[("", " ")], cover=False,
                                               extra_docs=False), "book.epub", 422, "no_text"),
}


@pytest.mark.parametrize("case", sorted(BAD_UPLOADS))
def test_bad_upload_gets_its_4xx_and_leaves_nothing(book_farm, bclient, case):
    data, name, status, code = BAD_UPLOADS[case]
    data = data() if callable(data) else data
    before = _nothing_written(book_farm)
    resp = upload(bclient, data, name)
    assert resp.status_code == status, resp.get_json()
    assert resp.get_json()["error"]["code"] == code
    assert _nothing_written(book_farm) == before


def test_unknown_voice_and_bad_formats(book_farm, bclient):
    before = _nothing_written(book_farm)
    resp = upload(bclient, b"Chapter 1\nHello there.", "a.txt", voice="xx-nope")
    assert resp.status_code == 422 and resp.get_json()["error"]["code"] == "unknown_voice"
    resp = bclient.post("/v1/books", json={**json_book("F", 1, 1), "formats": ["wav"]})
    assert resp.status_code == 422 and resp.get_json()["error"]["field"] == "formats"
    resp = bclient.post("/v1/books", json={"chapters": []})
    assert resp.status_code == 422
    assert _nothing_written(book_farm) == before


def test_upload_over_the_size_limit_is_413(book_farm):
    from app.farm import Farm
    from web import create_app

    settings = book_farm.settings.with_(max_book_bytes=10_000)
    small = create_app(settings, Farm(settings))
    before = _nothing_written(book_farm)
    resp = upload(small.test_client(), b"Chapter 1\n" + b"word " * 5000, "big.txt")
    assert resp.status_code == 413
    assert resp.get_json()["error"]["code"] == "request_too_large"
    assert _nothing_written(book_farm) == before


def _assembly_held(farm, book_id: str) -> bool:
    """The book worker holds this book's assemble message: delivered, not yet acked (kombu
    keeps a delivered message in the broker's `unacked` hash until the task acks it). On
    RabbitMQ, which shows no unacked message by content: the book queue has nothing ready,
    so the one assemble message is the worker's."""
    if farm.broker_redis is None:
        return farm.backlog.queue_depth("book") == 0
    for raw in farm.broker_redis.hvals("unacked"):
        headers = json.loads(raw)[0].get("headers") or {}
        if headers.get("task") == "voxfarm.book.assemble" and book_id in str(
                headers.get("argsrepr")):
            return True
    return False


def test_book_worker_sigkill_mid_assembly_book_still_completes(book_farm, bclient):
    farm = book_farm.farm
    resp = bclient.post("/v1/books", json={**json_book("Night Shift", 3, 1),
                                           "formats": ["m4b", "mp3", "chapters"]})
    assert resp.status_code == 202, resp.get_json()
    book_id = resp.get_json()["id"]
    # The moment the book worker has taken the assembly and is writing the audiobook (its
    # output files exist only as the store's temporary files).
    out_dir = farm.store.root / "books" / book_id / "out"

    def writing() -> bool:
        state = farm.books.state(book_id)
        assert state in ("queued", "preparing", "rendering", "assembling"), state
        return (state == "assembling" and any(out_dir.glob(".*.tmp"))
                and _assembly_held(farm, book_id))

    wait_until(writing, 90, lambda: f"never caught writing: {farm.books.get(book_id)}",
               interval_s=0.002)
    worker = next(w for w in book_farm.workers if w.queue == "book")
    worker.kill()
    book_farm.workers.remove(worker)
    # Killed before it finished: the assembly is still owed, and its message still unacked
    # (Redis), or back on the book queue the moment the worker's connection closed (RabbitMQ).
    assert farm.books.state(book_id) == "assembling"
    if farm.broker_redis is None:
        wait_until(lambda: farm.backlog.queue_depth("book") == 1, 5,
                   "the assembly is not back on the book queue", interval_s=0.02)
    else:
        assert _assembly_held(farm, book_id)
    assert farm.books.manifest(book_id) is None and not farm.store.exists(
        f"books/{book_id}/out/book.m4b")
    book_farm.start_worker("book")

    book = wait_book(bclient, book_id, timeout_s=90)
    total = book["segments"]["total"]
    assert book["segments"]["done"] == total and len(book["chapters"]) == 3
    files = segment_files(farm, book_id)
    assert len(files) == total == len(set(files))
    for c in book["chapters"]:
        assert len([f for f in files if f"/segments/{c['index']:04d}/" in f]) == \
            c["segments"]["total"]
    assert sorted(farm.store.list(f"books/{book_id}/out/")) == sorted(
        f"books/{book_id}/out/{name}" for name in (
            "book.m4b", "book.mp3", "manifest.json", *(f"chapters/{n:03d}.mp3" for n in range(3)),
            # Captions: the whole book's and each chapter's, SRT and WebVTT.
            *(f"captions/{stem}.{fmt}" for stem in ("book", "000", "001", "002")
              for fmt in ("srt", "vtt"))))
    manifest = bclient.get(f"/v1/books/{book_id}/manifest").get_json()
    assert [c["title"] for c in manifest["chapters"]] == ["Part 1", "Part 2", "Part 3"]
    m4b = bclient.get(f"/v1/books/{book_id}/audio?format=m4b")
    assert m4b.status_code == 200 and m4b.data[4:12] == b"ftypM4B "
    with av.open(io.BytesIO(m4b.data)) as c:
        assert [m["metadata"]["title"] for m in c.chapters()] == ["Part 1", "Part 2", "Part 3"]
    assert duration(m4b.data) == pytest.approx(manifest["duration_s"], abs=0.2)
    assert manifest["duration_s"] == pytest.approx(book["audio_seconds"], abs=0.05)
