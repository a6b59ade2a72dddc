"""Encryption at rest, end to end: the Flask app (test client) over real Redis, a real
artifact store and real acoustic, vocoder and book workers, all with VOXFARM_AT_REST_KEYS
set. No run of the audio a client hears is stored in plaintext; a job sealed under key A is
still served once the ring is `B,A`; with A gone its job and book answer 503 naming A and
keep their state, and serve again once A is back; a tampered cached mel is a miss and
recomputed; a tampered chunk, encoded piece or M4B is never played; a job made before the
farm had keys is still served."""

from __future__ import annotations

import base64
import io
import wave
from pathlib import Path

import numpy as np
import pytest
import redis

from app.farm import Farm
from app.security.sealing import MAGIC, generate_key
from tests.helpers import (
    assert_speech,
    collect_chunks,
    decode_chunk,
    running_farm,
    submit,
    wait_book,
    wait_state,
    wait_until,
)

pytestmark = pytest.mark.integration

KEY_A = generate_key("A")
KEY_B = generate_key("B")

TEXT = ("The lighthouse keeper climbed the stairs at dusk. He lit the lamp and watched the "
        "ships go by.")
BOOK = {"title": "Sealed Tales", "author": "Test Author", "formats": ["m4b", "chapters"],
        "chapters": [{"title": "Part 1", "text": TEXT},
                     {"title": "Part 2", "text": "A storm gathered far out beyond the reef."}]}

# A run of the audio this long found anywhere would be plaintext audio at rest. Every run of
# RUN bytes contains one of the PCM's RUN // 2 pieces that start at a multiple of RUN // 2,
# so looking for those pieces finds any run.
RUN = 4096


def words(text: str) -> int:
    return len(text.split())


@pytest.fixture(scope="module")
def sealed_farm(redis_url, tmp_path_factory):
    store = tmp_path_factory.mktemp("sealed-store")
    with pytest.MonkeyPatch.context() as mp:
        # Through the environment, as a deployment sets it: the worker processes read it.
        mp.setenv("VOXFARM_AT_REST_KEYS", KEY_A)
        with running_farm(redis_url, 15, tmp_path_factory.mktemp("at-rest"), book=True,
                          store_dir=str(store), visibility_timeout=5, max_retries=1) as tf:
            assert tf.farm.sealer.sealing_key_id == "A"
            yield tf


@pytest.fixture(scope="module")
def client(sealed_farm):
    from web import create_app

    return create_app(sealed_farm.settings, sealed_farm.farm).test_client()


def job_pcm(client, text: str) -> tuple[dict, np.ndarray]:
    """Render `text`; the job and its audio as a client hears it (the long-poll's chunks)."""
    job = submit(client, text)
    _, chunks = collect_chunks(client, job["id"], max_per_poll=4)
    job = wait_state(client, job["id"])
    return job, np.concatenate([decode_chunk(c) for c in chunks])


def wav_pcm(data: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(data)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def redis_values(r: redis.Redis) -> list[bytes]:
    """Every value in the database, whatever its type."""
    values: list[bytes] = []
    for key in r.scan_iter(count=1000):
        kind = r.type(key)
        if kind == b"string":
            values.append(r.get(key) or b"")
        elif kind == b"hash":
            values += [b for kv in r.hgetall(key).items() for b in kv]
        elif kind == b"list":
            values += r.lrange(key, 0, -1)
        elif kind == b"set":
            values += list(r.smembers(key))
        elif kind == b"zset":
            values += r.zrange(key, 0, -1)
        elif kind == b"stream":
            values += [b for _, fields in r.xrange(key) for kv in fields.items() for b in kv]
        values.append(key)
    return values


def plaintext_runs(pcm: bytes, haystacks: list[bytes]) -> list[int]:
    """Offsets in `pcm` of pieces (RUN // 2 bytes, at multiples of that) found in a
    haystack. Silence is left out: a stretch of one sample value identifies no audio."""
    half = RUN // 2
    found = []
    for at in range(0, len(pcm) - half + 1, half):
        piece = pcm[at:at + half]
        if len(set(piece)) <= 2:
            continue
        if any(piece in hay for hay in haystacks):
            found.append(at)
    return found


def sealed_farm_with(sealed_farm, keyring: str) -> Farm:
    return Farm(sealed_farm.settings.with_(at_rest_keys=keyring))


def test_no_plaintext_audio_in_redis_or_the_store(sealed_farm, client):
    job, pcm = job_pcm(client, TEXT)
    assert_speech(pcm, words(TEXT))
    whole = client.get(f"/v1/jobs/{job['id']}/audio?format=wav")
    assert whole.status_code == 200
    assert np.array_equal(wav_pcm(whole.data), pcm)

    resp = client.post("/v1/books", json=BOOK)
    assert resp.status_code == 202, resp.get_json()
    book = wait_book(client, resp.get_json()["id"], timeout_s=240)
    m4b = client.get(book["links"]["m4b"])
    assert m4b.status_code == 200 and m4b.data[4:12] == b"ftypM4B "
    # The book's segments, opened through the farm's store: the speech the book is made of.
    store = sealed_farm.farm.store
    segments = store.list(f"books/{book['id']}/segments/")
    assert len(segments) == book["segments"]["total"]
    book_pcm = b"".join(store.get(k) for k in segments)
    assert_speech(np.frombuffer(book_pcm, "<i2"), words(TEXT) + words(
        BOOK["chapters"][1]["text"]))

    r = redis.Redis.from_url(sealed_farm.settings.redis_url)
    files = [p.read_bytes() for p in Path(sealed_farm.settings.store_dir).rglob("*")
             if p.is_file()]
    assert files and all(f.startswith(b"\x89VXF") for f in files), "every store file sealed"
    haystacks = redis_values(r) + files
    assert not plaintext_runs(pcm.tobytes(), haystacks), "the job's PCM is stored in plaintext"
    assert not plaintext_runs(book_pcm, haystacks), "the book's PCM is stored in plaintext"
    # The chunks are there, sealed with key A.
    chunks = r.hvals(sealed_farm.farm.keys.chunks(job["id"]))
    assert chunks and all(c.startswith(MAGIC + b"\x01A") for c in chunks)


def test_a_tampered_cached_mel_is_recomputed(sealed_farm, client):
    text = "Children ran along the sand looking for shells."
    r, keys = redis.Redis.from_url(sealed_farm.settings.redis_url), sealed_farm.farm.keys

    def cached_mels() -> set[bytes]:
        return {k for k in r.scan_iter(keys.mel("*"))
                if not k.endswith((b":refs", b":durations"))}

    before = cached_mels()
    job, first = job_pcm(client, text)
    mels = cached_mels() - before  # this text's
    assert mels
    for key in mels:  # flip one byte of each cached mel (the same length, no longer authentic)
        blob = bytearray(r.get(key))
        blob[len(blob) // 2] ^= 0x40
        r.set(key, bytes(blob), keepttl=True)

    again, pcm = job_pcm(client, text)
    assert again["state"] == "done"
    assert_speech(pcm, words(text))
    # The same request renders the same audio (the noise is seeded by the cache key), so the
    # recomputed mel made exactly the first job's audio, not noise.
    assert np.array_equal(pcm, first)
    assert sealed_farm.farm.jobs.get(again["id"])["cache_misses"] >= 1
    for key in mels:
        digest = key.decode().rsplit(":", 1)[1]
        assert sealed_farm.farm.mel_cache.get(digest) is not None, "sealed afresh"


def test_a_tampered_chunk_is_never_played(sealed_farm, client):
    text = "The keeper wrote everything down in his log. By morning the sea had turned grey."
    job = submit(client, text)
    wait_state(client, job["id"])
    r, keys = redis.Redis.from_url(sealed_farm.settings.redis_url), sealed_farm.farm.keys
    fields = sorted(r.hkeys(keys.chunks(job["id"])),
                    key=lambda f: tuple(map(int, f.split(b":"))))
    assert len(fields) >= 2
    bad = fields[1]
    blob = bytearray(r.hget(keys.chunks(job["id"]), bad))
    blob[-1] ^= 0x01
    r.hset(keys.chunks(job["id"]), bad, bytes(blob))

    page, chunks = collect_chunks(client, job["id"], max_per_poll=8)
    # Only the chunks before the tampered one are played; the job says why it stopped.
    assert [(c["segment"], c["window"]) for c in chunks] == [
        tuple(map(int, f.split(b":"))) for f in fields[:1]]
    rec = client.get(f"/v1/jobs/{job['id']}").get_json()
    assert rec["state"] == "failed" and "failed to open at rest" in str(rec["error"]), rec
    whole = client.get(f"/v1/jobs/{job['id']}/audio?format=wav")
    assert whole.status_code in (409, 410), whole.get_json()


def test_a_tampered_book_file_is_never_played(sealed_farm, client):
    resp = client.post("/v1/books", json={**BOOK, "title": "Tampered Tales"})
    book = wait_book(client, resp.get_json()["id"], timeout_s=240)
    root = Path(sealed_farm.settings.store_dir) / "books" / book["id"]
    m4b = root / "out" / "book.m4b"
    data = bytearray(m4b.read_bytes())
    data[len(data) // 2] ^= 0x01
    m4b.write_bytes(bytes(data))
    resp = client.get(book["links"]["m4b"])
    assert resp.status_code == 410, resp.status_code

    # A tampered encoded piece (the chapter's MP3 frames, which the book's MP3 is remuxed
    # from): the remux a format added asks for fails the book, naming the file.
    piece = sorted(p for p in root.rglob("*.mp3") if p.parent.name != "out")[0]
    data = bytearray(piece.read_bytes())
    data[-3] ^= 0x01
    piece.write_bytes(bytes(data))
    again = client.post("/v1/books", json={**BOOK, "title": "Tampered Tales",
                                           "formats": ["m4b", "mp3"]})
    assert again.status_code in (200, 202), again.get_json()
    failed = wait_book(client, book["id"], states=("failed",), timeout_s=120)
    assert "failed to open at rest" in failed["error"]["message"], failed["error"]
    assert piece.name in failed["error"]["message"]


@pytest.mark.slow  # about 18 s; the unit tier tests rotation on the keyring
def test_rotation_keeps_serving_what_the_old_key_sealed(sealed_farm, client):
    from web import create_app

    job, pcm = job_pcm(client, TEXT)
    # A book sealed with A (the module's book: made by the first test, else here).
    book = wait_book(client, client.post("/v1/books", json=BOOK).get_json()["id"],
                     timeout_s=240)
    # The ring becomes B,A: workers restart with it; the web is a new one with it.
    for w in list(sealed_farm.workers):
        w.stop()
    sealed_farm.workers.clear()
    sealed_farm.env["VOXFARM_AT_REST_KEYS"] = f"{KEY_B},{KEY_A}"
    for queue in ("acoustic", "vocoder"):
        sealed_farm.start_worker(queue)
    rotated = sealed_farm_with(sealed_farm, f"{KEY_B},{KEY_A}")
    rclient = create_app(sealed_farm.settings.with_(at_rest_keys=f"{KEY_B},{KEY_A}"),
                         rotated).test_client()
    old = rclient.get(f"/v1/jobs/{job['id']}/audio?format=wav")
    assert old.status_code == 200 and np.array_equal(wav_pcm(old.data), pcm)

    # New work is sealed with B, and served.
    wait_until(lambda: (rotated.liveness.live_workers("vocoder")
                        and rotated.liveness.live_workers("acoustic")),
               90, "no live workers after the restart", interval_s=0.2)
    text = "A new key seals this sentence."
    new, new_pcm = job_pcm(rclient, text)
    assert_speech(new_pcm, words(text))
    r = redis.Redis.from_url(sealed_farm.settings.redis_url)
    assert all(c.startswith(MAGIC + b"\x01B") for c in r.hvals(rotated.keys.chunks(new["id"])))

    # A restarted without A (dropped too early, or mistyped): what A sealed is intact, so
    # it is neither played nor failed nor called expired: 503 naming A, state untouched.
    retired = sealed_farm_with(sealed_farm, KEY_B)
    bclient = create_app(retired.settings, retired).test_client()
    for path in (f"/v1/jobs/{job['id']}/audio?format=wav",
                 f"/v1/jobs/{job['id']}/chunks?after=-1&wait=0", book["links"]["m4b"],
                 f"/v1/books/{book['id']}/chapters/0/audio"):
        missing = bclient.get(path)
        assert missing.status_code == 503, (path, missing.status_code, missing.data[:200])
        err = missing.get_json()["error"]
        assert (err["code"], err["key_id"]) == ("key_unavailable", "A"), err
        assert "'A'" in err["message"] and missing.headers["Retry-After"]
    assert bclient.get(f"/v1/jobs/{job['id']}").get_json()["state"] == "done"
    assert bclient.get(f"/v1/books/{book['id']}").get_json()["state"] == "done"

    # A back behind B: the same audio again.
    back = create_app(rotated.settings, rotated).test_client()
    again = back.get(f"/v1/jobs/{job['id']}/audio?format=wav")
    assert again.status_code == 200 and np.array_equal(wav_pcm(again.data), pcm)
    m4b = back.get(book["links"]["m4b"])
    assert m4b.status_code == 200 and m4b.data[4:12] == b"ftypM4B "
    assert base64.b64decode(KEY_A.split(":")[1]) not in b"".join(redis_values(r))


def test_a_job_made_before_the_farm_had_keys_is_still_served(sealed_farm, client):
    # What a keyless farm's web and vocoder wrote: a plaintext job (the stores' own calls).
    plain = sealed_farm_with(sealed_farm, "").jobs
    pcm = (np.sin(np.arange(22050) * 0.05) * 8000).astype("<i2").tobytes()
    job = plain.create(total=2, voice="en-us", speed=1.0, fmt="wav", chars=5,
                       sample_rate=22050)
    plain.store_chunk(job["id"], 0, pcm[:20000])
    plain.store_chunk(job["id"], 1, pcm[20000:])
    resp = client.get(f"/v1/jobs/{job['id']}/audio?format=wav")
    assert resp.status_code == 200, resp.get_json()
    assert wav_pcm(resp.data).tobytes() == pcm
    assert client.get(f"/v1/jobs/{job['id']}").get_json()["state"] == "done"
