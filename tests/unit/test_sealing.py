"""At-rest sealing: round trip, rotation, and every way a blob must fail to open; a missing key
is told apart from tampering, and plaintext from before the keys stays readable."""

from __future__ import annotations

import base64
import io
import logging

import numpy as np
import pytest

from app.security.sealing import (
    MAGIC,
    RECORD_BYTES,
    KeyUnavailable,
    Refused,
    Sealer,
    generate_key,
    open_records,
    parse_keyring,
    seal_file,
    sealed_file_size,
)

CONTEXT = b"vf:chunk:job-1:0"


def pcm_payload(seconds: float = 0.5, rate: int = 22050) -> bytes:
    """Speech-like int16 PCM: a 220 Hz tone, as a chunk store would hold it."""
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * 220 * t) * 12000).astype("<i2").tobytes()


def test_round_trip_binds_the_sealing_key_and_hides_the_payload():
    sealer = Sealer.from_keyring(generate_key("k1"))
    pcm = pcm_payload()
    blob = sealer.seal(pcm, CONTEXT)
    assert blob.startswith(MAGIC + b"\x02k1")
    assert len(blob) == len(pcm) + len(MAGIC) + 1 + 2 + 12 + 16
    assert sealer.open(blob, CONTEXT) == pcm
    assert sealer.open(blob, CONTEXT.decode()) == pcm  # a str context is its UTF-8
    # Two seals of the same payload differ (fresh nonce each time).
    assert sealer.seal(pcm, CONTEXT) != blob


def test_no_plaintext_pcm_is_visible_in_the_blob():
    sealer = Sealer.from_keyring(generate_key("k1"))
    pcm = pcm_payload()
    blob = sealer.seal(pcm, CONTEXT)
    # No 16-byte run of the PCM, anywhere, at any alignment.
    windows = {pcm[i:i + 16] for i in range(0, len(pcm) - 16, 7)}
    assert not any(blob[i:i + 16] in windows for i in range(len(blob) - 16))
    # And the blob reads as noise: every byte value about equally often.
    counts = np.bincount(np.frombuffer(blob, np.uint8), minlength=256)
    assert counts.max() < 3 * len(blob) / 256


def test_rotation_old_blobs_open_new_seals_use_the_new_key():
    old, new = generate_key("old"), generate_key("new")
    blob_old = Sealer.from_keyring(old).seal(b"features", CONTEXT)
    rotated = Sealer.from_keyring(f"{new},{old}")
    assert rotated.sealing_key_id == "new"
    assert rotated.open(blob_old, CONTEXT) == b"features"
    blob_new = rotated.seal(b"features", CONTEXT)
    assert blob_new.startswith(MAGIC + b"\x03new")
    # Once the old key is dropped, its blobs are misses; the new ones still open.
    retired = Sealer.from_keyring(new)
    assert retired.open(blob_old, CONTEXT) is None
    assert retired.open(blob_new, CONTEXT) == b"features"
    assert retired.failures == {("old", "unknown_key"): 1}


def test_every_tampered_byte_fails_to_open():
    sealer = Sealer.from_keyring(generate_key("k1"))
    blob = sealer.seal(b"a short segment of text", CONTEXT)
    for i in range(len(blob)):
        tampered = bytearray(blob)
        tampered[i] ^= 0x01
        assert sealer.open(bytes(tampered), CONTEXT) is None, f"byte {i}"
    assert sealer.open(blob[:-1], CONTEXT) is None  # truncated
    assert sealer.open(blob + b"\x00", CONTEXT) is None  # extended
    assert sealer.open(blob[:len(MAGIC) + 3], CONTEXT) is None  # header only
    assert sealer.open(MAGIC, CONTEXT) is None


def test_a_blob_moved_to_another_key_name_fails():
    sealer = Sealer.from_keyring(generate_key("k1"))
    blob = sealer.seal(b"mel", b"vf:mel:aaaa")
    assert sealer.open(blob, b"vf:mel:bbbb") is None
    assert sealer.failures == {("k1", "unauthentic"): 1}


def test_a_key_of_the_same_id_but_other_bytes_fails():
    blob = Sealer.from_keyring(generate_key("k1")).seal(b"mel", CONTEXT)
    assert Sealer.from_keyring(generate_key("k1")).open(blob, CONTEXT) is None


def test_unknown_key_id_fails_and_warns_once(caplog):
    blob = Sealer.from_keyring(generate_key("gone")).seal(b"chunk", CONTEXT)
    sealer = Sealer.from_keyring(generate_key("k1"))
    with caplog.at_level(logging.WARNING, logger="app.security.sealing"):
        for _ in range(3):
            assert sealer.open(blob, CONTEXT) is None
    assert sealer.failures == {("gone", "unknown_key"): 3}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "gone" in warnings[0].getMessage()


def test_plaintext_written_before_keys_were_set_is_a_miss():
    sealer = Sealer.from_keyring(generate_key("k1"))
    assert sealer.open(pcm_payload(0.01), CONTEXT) is None
    assert sealer.failures == {("", "not_sealed"): 1}


def test_no_keys_pass_through_but_refuse_sealed_blobs():
    plain = Sealer.from_keyring("")
    assert not plain.enabled and plain.sealing_key_id is None
    pcm = pcm_payload(0.01)
    assert plain.seal(pcm, CONTEXT) is pcm
    assert plain.open(pcm, CONTEXT) is pcm
    # A sealed blob read after the keys were removed is a miss, not noise played as audio.
    sealed = Sealer.from_keyring(generate_key("k1")).seal(pcm, CONTEXT)
    assert plain.open(sealed, CONTEXT) is None
    assert Sealer.from_keyring("  ").enabled is False


def test_generate_key_makes_a_valid_entry():
    key_id, _, encoded = generate_key("k2").partition(":")
    assert key_id == "k2" and len(base64.b64decode(encoded)) == 32
    assert parse_keyring(generate_key())[0][0].startswith("k")  # dated default id
    assert generate_key("a") != generate_key("a")
    with pytest.raises(ValueError, match="key id"):
        generate_key("bad id")


KEY = base64.b64encode(bytes(32)).decode()


@pytest.mark.parametrize("keyring, message", [
    ("k1", "no ':'"),
    (f":{KEY}", "key id"),
    (f"bad id:{KEY}", "key id"),
    (f"{'x' * 33}:{KEY}", "key id"),
    (f"k1:{KEY},k1:{KEY}", r"key 2 \('k1'\).*used twice"),
    ("k1:not*base64", "not valid base64"),
    (f"k1:{base64.b64encode(bytes(16)).decode()}", "16 bytes; AES-256 needs 32"),
    (f"k1:{KEY},", "key 2: expected"),
])
def test_keyring_errors_name_the_entry_not_the_key(keyring, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_keyring(keyring)
    assert KEY not in str(err.value)


def test_keyring_parsing_tolerates_spaces():
    keys = parse_keyring(f" k1 : {KEY} , k2:{KEY}\n")
    assert [key_id for key_id, _ in keys] == ["k1", "k2"]
    assert keys[0][1] == bytes(32)


# -- the settings: a bad keyring fails at boot -------------------------------------------------


def test_a_bad_keyring_fails_when_the_settings_are_built():
    from app.settings import Settings

    assert Settings(at_rest_keys=generate_key("k1")).at_rest_keys
    with pytest.raises(ValueError, match="VOXFARM_AT_REST_KEYS: at-rest key 1 .*base64"):
        Settings(at_rest_keys="k1:not*base64")


@pytest.mark.parametrize("command", [
    ["-m", "app.cli", "up", "--port", "18931", "--metrics-port", "0"],
    # As the Procfile starts it: --threads and --batch take their defaults from the settings.
    ["-m", "app.cli", "worker", "acoustic", "--work", "interactive", "--device", "cpu",
     "--metrics-port", "0"],
    ["-m", "gunicorn", "-c", "ops/gunicorn.conf.py", "--bind", "127.0.0.1:18932",
     "web.wsgi:app"],
], ids=["up", "worker", "web"])
def test_a_malformed_keyring_stops_each_process_with_one_line(command, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "VOXFARM_AT_REST_KEYS": "k1:not*base64",
           "VOXFARM_VAR": str(tmp_path / "var")}
    done = subprocess.run([sys.executable, *command], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    said = (done.stdout + done.stderr).strip()
    assert done.returncode != 0
    assert said.endswith("VOXFARM_AT_REST_KEYS: at-rest key 1 ('k1'): the key is not valid "
                         "base64") and len(said.splitlines()) == 1, said


def test_parsing_a_keyring_does_not_import_prometheus_client():
    # gunicorn's config builds the settings before prometheus_client's multiprocess mode is
    # set up; importing it then stops the web at boot.
    import subprocess
    import sys

    code = ("import sys; from app.settings import Settings; from app.security.sealing import "
            "generate_key; Settings(at_rest_keys=generate_key()); "
            "assert 'prometheus_client' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- sealed files and the sealed store --------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, RECORD_BYTES - 1, RECORD_BYTES, RECORD_BYTES + 1,
                                  2 * RECORD_BYTES + 5])
def test_sealed_files_round_trip_and_know_their_size(size):
    sealer = Sealer.from_keyring(generate_key("k1"))
    plaintext = np.random.default_rng(size).bytes(size)
    blob = seal_file(sealer, plaintext, "books/b/out/book.m4b")
    assert b"".join(open_records(sealer, io.BytesIO(blob), "books/b/out/book.m4b")) == plaintext
    assert sealed_file_size(blob[:16], len(blob)) == size


def test_a_sealed_file_cut_reordered_or_moved_is_refused():
    sealer = Sealer.from_keyring(generate_key("k1"))
    blob = seal_file(sealer, bytes(range(256)) * (RECORD_BYTES // 128), "a/b")  # 2 records

    def read(data: bytes, context: str = "a/b") -> bytes:
        return b"".join(open_records(sealer, io.BytesIO(data), context))

    first = 4 + 4 + int.from_bytes(blob[4:8], "big")  # FILE_MAGIC, header, record 0
    for bad, context in [(blob[:first], "a/b"),  # cut at a record boundary
                         (blob[:-1], "a/b"), (blob + b"\x00", "a/b"),
                         (blob[:4] + blob[first:] + blob[4:first], "a/b"),  # reordered
                         (blob, "a/c")]:  # moved to another key
        with pytest.raises(Refused):
            read(bad, context)
    with pytest.raises(Refused, match="not_sealed"):
        read(b"plain pcm")


def test_sealed_store_hides_the_bytes_and_refuses_what_fails(tmp_path):
    from app.stores.artifacts import DirectoryStore, SealedStore

    sealer = Sealer.from_keyring(generate_key("k1"))
    store = SealedStore(DirectoryStore(tmp_path), sealer)
    pcm = pcm_payload(2.0)
    store.put("books/b/segments/0000/00000.pcm", pcm)
    assert store.get("books/b/segments/0000/00000.pcm") == pcm
    assert store.size("books/b/segments/0000/00000.pcm") == len(pcm)
    assert store.local_path("books/b/segments/0000/00000.pcm") is None
    on_disk = (tmp_path / "books/b/segments/0000/00000.pcm").read_bytes()
    assert pcm[4096:8192] not in on_disk
    # A writer a muxer seeks back into, sealed once the block ends.
    with store.writer("books/b/out/book.m4b") as f:
        f.write(pcm)
        f.seek(0)
        f.write(b"HEAD")
    assert store.get("books/b/out/book.m4b") == b"HEAD" + pcm[4:]
    with store.open("books/b/out/book.m4b") as f:
        assert b"".join(iter(lambda: f.read(1000), b"")) == b"HEAD" + pcm[4:]
    assert not list(tmp_path.rglob("*.tmp"))
    # Tampered: refused as a missing object (KeyError), by get and open alike.
    tampered = bytearray(on_disk)
    tampered[-20] ^= 1
    (tmp_path / "books/b/segments/0000/00000.pcm").write_bytes(bytes(tampered))
    with pytest.raises(KeyError, match="unauthentic"):
        store.get("books/b/segments/0000/00000.pcm")
    with pytest.raises(KeyError):
        store.open("books/b/segments/0000/00000.pcm")
    # Without keys: plaintext as before, but a sealed object is never read as audio.
    plain = SealedStore(DirectoryStore(tmp_path), Sealer.from_keyring(""))
    plain.put("x.pcm", pcm)
    assert plain.get("x.pcm") == pcm and plain.local_path("x.pcm")
    assert (tmp_path / "x.pcm").read_bytes() == pcm
    with pytest.raises(KeyUnavailable):
        plain.get("books/b/out/book.m4b")
    assert plain.local_path("books/b/out/book.m4b") is None


# -- a missing key is not tampering; plaintext from before the keys -------------------------


def test_read_tells_a_missing_key_from_tampering():
    key_a = generate_key("A")
    blob = Sealer.from_keyring(key_a).seal(b"chunk", CONTEXT)
    retired = Sealer.from_keyring(generate_key("B"))
    with pytest.raises(KeyUnavailable) as missing:
        retired.read(blob, CONTEXT)
    assert missing.value.key_id == "A" and not isinstance(missing.value, KeyError)
    assert "'A'" in str(missing.value) and "VOXFARM_AT_REST_KEYS" in str(missing.value)
    with pytest.raises(KeyUnavailable, match="'A'"):
        Sealer.from_keyring("").read(blob, CONTEXT)  # every key removed
    # Back in the ring (behind the new one), it opens.
    assert Sealer.from_keyring(f"{generate_key('B')},{key_a}").read(blob, CONTEXT) == (
        b"chunk", "")
    # Under a key the ring has, a failure is tampering: refused, not "missing".
    sealer = Sealer.from_keyring(key_a)
    tampered = bytearray(blob)
    tampered[-1] ^= 1
    assert sealer.read(bytes(tampered), CONTEXT) == (None, "unauthentic")
    # Cut inside its nonce: a known key, so tampering too (it used to say unknown_key).
    assert sealer.read(blob[:len(MAGIC) + 2 + 5], CONTEXT) == (None, "unauthentic")
    # A header too short to name a key is no key to wait for.
    assert sealer.read(MAGIC, CONTEXT) == (None, "unauthentic")
    assert Sealer.from_keyring("").read(MAGIC + b"\x00", CONTEXT) == (None, "unauthentic")


def test_read_takes_plaintext_only_when_its_owner_predates_the_keys():
    sealer = Sealer.from_keyring(generate_key("k1"))
    pcm = pcm_payload(0.01)
    assert sealer.read(pcm, CONTEXT, plaintext_ok=True) == (pcm, "")
    assert sealer.read(pcm, CONTEXT) == (None, "not_sealed")
    # plaintext_ok never lets a sealed blob skip its check.
    blob = sealer.seal(pcm, CONTEXT)
    assert sealer.read(blob[:-1], CONTEXT, plaintext_ok=True) == (None, "unauthentic")


def test_sealed_store_waits_for_a_missing_key_and_reads_plaintext_from_before_keys(tmp_path):
    from app.stores.artifacts import DirectoryStore, SealedStore

    key_a, pcm = generate_key("A"), pcm_payload(0.5)
    SealedStore(DirectoryStore(tmp_path), Sealer.from_keyring(key_a)).put("books/s/x.pcm", pcm)
    retired = SealedStore(DirectoryStore(tmp_path), Sealer.from_keyring(generate_key("B")))
    for read in (retired.get, retired.open):
        with pytest.raises(KeyUnavailable) as missing:
            read("books/s/x.pcm")
        assert (missing.value.key_id, missing.value.context) == ("A", "books/s/x.pcm")
    assert retired.local_path("books/s/x.pcm") is None
    back = SealedStore(DirectoryStore(tmp_path),
                       Sealer.from_keyring(f"{generate_key('B')},{key_a}"))
    assert back.get("books/s/x.pcm") == pcm

    # A book written before the farm had keys: its plaintext files read once keys are on,
    # where its owner says so; anyone else's plaintext is refused.
    SealedStore(DirectoryStore(tmp_path), Sealer.from_keyring("")).put("books/old/x.pcm", pcm)
    owners = {"books/old/x.pcm"}
    keyed = SealedStore(DirectoryStore(tmp_path), Sealer.from_keyring(key_a),
                        plaintext_ok=owners.__contains__)
    assert keyed.get("books/old/x.pcm") == pcm
    with keyed.open("books/old/x.pcm") as f:
        assert f.read() == pcm
    assert keyed.local_path("books/old/x.pcm") == str(tmp_path / "books/old/x.pcm")
    owners.clear()
    with pytest.raises(Refused, match="not_sealed"):
        keyed.get("books/old/x.pcm")
    with pytest.raises(Refused):
        keyed.open("books/old/x.pcm")
    assert keyed.local_path("books/old/x.pcm") is None


# -- the job and book stores on a real Redis: state is never flipped by a missing key --------


@pytest.fixture
def job_stores(redis_url):
    """JobStore(keyring) for one fresh key prefix on the session's Redis."""
    import uuid

    import redis

    from app.stores.jobs import JobStore
    from app.stores.keys import Keys
    from tests.helpers import with_db

    r = redis.Redis.from_url(with_db(redis_url, 5))
    keys = Keys(f"sealing-{uuid.uuid4().hex[:8]}")
    return lambda keyring: JobStore(r, keys, 600, sealer=Sealer.from_keyring(keyring))


def done_job(jobs, chunks: list[bytes]) -> str:
    job = jobs.create(total=len(chunks), voice="en-us", speed=1.0, fmt="wav", chars=10,
                      sample_rate=22050)
    for i, pcm in enumerate(chunks):
        jobs.store_chunk(job["id"], i, pcm)
    assert jobs.get(job["id"])["state"] == "done"
    return job["id"]


def test_a_job_whose_key_is_missing_keeps_its_state_and_reads_once_the_key_is_back(job_stores):
    key_a, key_b = generate_key("A"), generate_key("B")
    pieces = [pcm_payload(0.2), pcm_payload(0.3)]
    job_id = done_job(job_stores(key_a), pieces)

    retired = job_stores(key_b)
    for read in (lambda: retired.all_chunks(job_id, 2),
                 lambda: retired.chunks_from(job_id, 0, 2, 8),
                 lambda: retired.wait_for_chunks(job_id, -1, 0.1, 8),
                 lambda: retired.segment_pcm(job_id, 1)):
        with pytest.raises(KeyUnavailable, match="'A'"):
            read()
    job = retired.get(job_id)
    assert (job["state"], job["error"]) == ("done", None), "a missing key flips no state"
    with pytest.raises(KeyUnavailable):
        job_stores("").all_chunks(job_id, 2)  # every key removed
    assert job_stores("").get(job_id)["state"] == "done"

    back = job_stores(f"{key_b},{key_a}")
    assert back.all_chunks(job_id, 2) == pieces
    assert [c.pcm for c in back.chunks_from(job_id, 0, 2, 8)[0]] == pieces


def test_plaintext_jobs_from_before_the_keys_stay_readable_and_only_they(job_stores):
    pieces = [pcm_payload(0.2), pcm_payload(0.3)]
    old = done_job(job_stores(""), pieces)
    keyed = job_stores(generate_key("A"))
    assert keyed.all_chunks(old, 2) == pieces
    assert keyed.get(old)["state"] == "done"

    # A job made with keys whose chunk is swapped for plaintext: refused, as tampering is.
    new = done_job(keyed, pieces)
    keyed.r.hset(keyed.keys.chunks(new), "1:0", pieces[1])
    assert keyed.all_chunks(new, 2) == [pieces[0], None]
    job = keyed.get(new)
    assert job["state"] == "failed" and "not_sealed" in job["error"], job


def test_a_book_made_without_keys_may_have_plaintext_files(redis_url, tmp_path):
    import uuid

    import redis

    from app.stores.artifacts import DirectoryStore, SealedStore
    from app.stores.books import BookStore
    from app.stores.keys import Keys
    from tests.helpers import with_db

    r = redis.Redis.from_url(with_db(redis_url, 5))
    keys = Keys(f"sealing-{uuid.uuid4().hex[:8]}")

    def make(book_id: str, keyring: str) -> BookStore:
        books = BookStore(r, keys, SealedStore(DirectoryStore(tmp_path),
                                               Sealer.from_keyring(keyring)))
        assert books.create(book_id, title="t", author="", voice="en-us", speed=1.0,
                            formats=("m4b",), chapters=1, words=1, sample_rate=22050,
                            source_format="txt")
        return books

    books = make("plain", "")
    make("sealed", generate_key("A"))
    assert books.written_before_keys("books/plain/segments/0000/00000.pcm")
    assert not books.written_before_keys("books/sealed/segments/0000/00000.pcm")
    assert not books.written_before_keys("books/nobody/book.json")
    assert not books.written_before_keys("elsewhere/plain/x")
