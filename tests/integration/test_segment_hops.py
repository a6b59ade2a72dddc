"""The Redis round trips a segment's stages and its reader make, on a real Redis.

What each stage stores per segment and per window is fixed cost beside the model's few tens
of milliseconds (docs/benchmarks.md, "Per-segment fixed cost"): the acoustic stage's put, hold
and count are one round trip, the vocoder's features and durations one, each window's chunk,
counts, wake-up and progress one, and a long-poll answers a stored chunk in two. Round trips
are counted where redis-py writes a request to its socket (a pipeline is one write).
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np
import pytest
import redis.connection

from tasks.segments import WHOLE_UP_TO_WINDOWS
from tests.helpers import (
    assert_chunk_order,
    assert_speech,
    collect_chunks,
    decode_chunk,
    running_farm,
    submit,
)


@pytest.fixture
def tf(redis_url, tmp_path):
    with running_farm(redis_url, 12, tmp_path, workers=False) as farm:
        farm.farm.redis.ping()  # its connection made: setting one up is no request's cost
        yield farm


@contextmanager
def round_trips(monkeypatch):
    """Counts the requests written to Redis inside the block (each still sent as usual)."""
    sent = []
    real = redis.connection.AbstractConnection.send_packed_command

    def counting(self, command, check_health=True):
        sent.append(command)
        return real(self, command, check_health)

    with monkeypatch.context() as m:
        m.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
        yield sent


def new_job(farm):
    return farm.jobs.create(total=2, voice="en-us", speed=1.0, fmt="wav", chars=10,
                            sample_rate=22050)


def test_the_acoustic_stage_puts_holds_and_counts_in_one_round_trip(tf, monkeypatch):
    cache, r, keys = tf.farm.mel_cache, tf.farm.redis, tf.farm.keys
    digest = "d" * 40
    with round_trips(monkeypatch) as sent:
        cache.hand_on(digest, False, b"features", [3, 4, 5])
    assert len(sent) == 1
    assert cache.get_with_durations(digest) == (b"features", [3, 4, 5])
    assert int(r.get(keys.mel_refs(digest))) == 1
    assert 0 < r.ttl(keys.mel_refs(digest)) <= cache.ttl_s
    # A hit holds the same entry once more and counts a hit; nothing is written afresh.
    with round_trips(monkeypatch) as sent:
        cache.hand_on(digest, True)
    assert len(sent) == 1
    assert int(r.get(keys.mel_refs(digest))) == 2
    assert cache.stats()["mel_cache_hits"] == 1 and cache.stats()["mel_cache_misses"] == 1
    assert cache.get_with_durations("e" * 40) == (None, None)


def test_the_vocoder_reads_features_and_durations_in_one_round_trip(tf, monkeypatch):
    cache = tf.farm.mel_cache
    cache.put("f" * 40, b"mel", [1, 2])
    cache.put("a" * 40, b"mel without timing")
    with round_trips(monkeypatch) as sent:
        assert cache.get_with_durations("f" * 40) == (b"mel", [1, 2])
    assert len(sent) == 1
    assert cache.get_with_durations("a" * 40) == (b"mel without timing", None)


def test_a_window_is_stored_and_counted_as_progress_in_one_round_trip(tf, monkeypatch):
    jobs, r, keys = tf.farm.jobs, tf.farm.redis, tf.farm.keys
    # the script loaded once (a first EVALSHA of a process asks for it): not a window's cost
    jobs.store_window(new_job(tf.farm).id, 0, 0, b"\x01\x00", (1, 64), [], 0, 1)
    job = new_job(tf.farm)
    created = r.zscore(keys.progress, job.id)
    time.sleep(0.01)  # the window's stamp must differ from the creation's
    with round_trips(monkeypatch) as sent:
        done = jobs.store_window(job.id, 0, 0, b"\x01\x00" * 10, (2, 64), [], 0, 40)
    assert len(sent) == 1 and done == 0
    assert r.zscore(keys.progress, job.id) > created
    assert r.ttl(keys.progress) == -1, "the shared progress set must keep no TTL"
    assert all(r.ttl(k) > 0 for k in keys.job_keys(job.id) if r.exists(k))
    # Idempotent: the same window again counts nothing twice; the last one finishes the
    # segment.
    assert jobs.store_window(job.id, 0, 0, b"\x01\x00" * 10, (2, 64), [], 0, 40) == 0
    assert jobs.store_window(job.id, 0, 1, b"\x02\x00" * 10, (2, 64), [], 20, 40) == 1
    # A job the sweeper forgot is not put back in the progress set.
    r.zrem(keys.progress, job.id)
    jobs.store_window(job.id, 1, 0, b"\x03\x00" * 10, (1, 64), [], 0, 10)
    assert r.zscore(keys.progress, job.id) is None


def test_a_long_poll_answers_a_stored_chunk_in_two_round_trips(tf, monkeypatch):
    jobs = tf.farm.jobs
    job = new_job(tf.farm)
    jobs.store_window(job.id, 0, 0, b"\x01\x00" * 10, (2, 64), [], 0, 40)
    jobs.store_window(job.id, 0, 1, b"\x02\x00" * 10, (2, 64), [], 20, 40)
    with round_trips(monkeypatch) as sent:
        record, chunks = jobs.wait_for_chunks(job.id, -1, 5.0, 16)
    assert len(sent) == 2
    assert [c.pcm for c in chunks] == [b"\x01\x00" * 10, b"\x02\x00" * 10]
    assert record is not None and record.chunks is None  # segment 1's windows not planned
    record, chunks = jobs.wait_for_chunks(job.id, 1, 0.2, 16)
    assert chunks == []


def test_a_short_segment_after_the_first_is_one_chunk_and_a_long_one_keeps_its_windows(
        client, farm):
    """The job's first segment streams window by window (first audio waits for its first
    window); a short segment after it is decoded whole, one chunk; a long one is cut as
    before. Chunks in order, none missing or repeated, the audio whole."""
    long_sentence = ("The farm renders every segment of a paragraph on workers of its own and "
                     "the client hears each of them in order window after window from the "
                     "first word of the paragraph to the last one that the listener asked for.")
    text = f"The harbour opens at dawn. The boats go out at seven. {long_sentence}"
    job = submit(client, text)
    total = job["segments"]["total"]
    page, chunks = collect_chunks(client, job["id"])
    assert page["state"] == "done" and total >= 3
    assert_chunk_order(chunks, total, page["total"])
    windows = [sum(1 for c in chunks if c["segment"] == s) for s in range(total)]
    assert windows[0] > 1, f"the first segment streams in windows: {windows}"
    assert windows[1] == 1, f"a short segment after the first is one chunk: {windows}"
    assert windows[-1] > WHOLE_UP_TO_WINDOWS, f"a long segment keeps its windows: {windows}"
    assert_speech(np.concatenate([decode_chunk(c) for c in chunks]), len(text.split()))
