"""The segment message (app/broker/messages.py): what a job's and a book's segments carry on the
wire, key for key, and that messages an older release queued still decode."""

from __future__ import annotations

import json

import pytest

from app.broker.messages import (
    BookOwner,
    JobOwner,
    Segment,
    job_place,
    owner_of,
    segment_in,
    segment_speed,
)

WORDS = [["one", 0, 3, 0, 3], ["two", 4, 7, 4, 7]]

# Messages exactly as this release and the one before it put them on the broker.
JOB_MESSAGE = {"job_id": "j1", "index": 3, "phonemes": "wˈʌn tˈuː", "voice": "en-us",
               "speed": 1.1, "pause_ms": 250, "words": WORDS, "version": "v2"}
BOOK_MESSAGE = {"book_id": "b1", "seq": 41, "chapter": 2, "index": 5, "phonemes": "wˈʌn",
                "text": "One.", "voice": "en-us", "speed": 0.9, "pause_ms": 400,
                "words": WORDS[:1], "version": "v1"}


def test_a_jobs_message_round_trips_key_for_key():
    segment = Segment.from_message(JOB_MESSAGE)
    assert segment.owner == JobOwner("j1") and not segment.is_book
    assert (segment.owner_id, segment.job_id, segment.index) == ("j1", "j1", 3)
    assert (segment.phonemes, segment.voice, segment.speed, segment.pause_ms,
            segment.words, segment.version) == ("wˈʌn tˈuː", "en-us", 1.1, 250, WORDS, "v2")
    message = segment.to_message()
    assert message == JOB_MESSAGE
    assert list(message) == list(JOB_MESSAGE)  # the same keys, in the same order
    assert Segment.from_message(json.loads(json.dumps(message))) == segment


def test_a_books_message_round_trips_key_for_key():
    segment = Segment.from_message(BOOK_MESSAGE)
    assert segment.owner == BookOwner("b1", seq=41, chapter=2) and segment.is_book
    assert (segment.owner_id, segment.job_id, segment.index, segment.text) == (
        "b1", None, 5, "One.")
    message = segment.to_message()
    assert message == BOOK_MESSAGE
    assert list(message) == list(BOOK_MESSAGE)
    assert Segment.from_message(json.loads(json.dumps(message))) == segment


def test_a_book_without_versions_names_none_and_a_job_always_does():
    book = Segment.from_message({k: v for k, v in BOOK_MESSAGE.items() if k != "version"})
    assert book.version == "" and "version" not in book.to_message()
    job = Segment(JobOwner("j"), 0, "a", "en-us", 1.0, 0)
    assert job.to_message()["version"] == "" and job.to_message()["words"] == []


def test_older_messages_decode():
    # From before word timestamps and voice versions: no words, no version.
    old_job = {"job_id": "j0", "index": 0, "phonemes": "a", "voice": "en-us", "speed": 1,
               "pause_ms": 0}
    segment = Segment.from_message(old_job)
    assert (segment.words, segment.version, segment.speed) == ([], "", 1.0)
    old_book = {k: v for k, v in BOOK_MESSAGE.items() if k not in ("text", "words", "version")}
    segment = Segment.from_message(old_book)
    assert (segment.text, segment.words, segment.owner) == ("", [], BookOwner("b1", 41, 2))


@pytest.mark.parametrize("dropped", ["index", "phonemes", "voice", "speed"])
def test_a_message_without_a_needed_field_is_no_segment(dropped):
    with pytest.raises(ValueError):
        Segment.from_message({k: v for k, v in JOB_MESSAGE.items() if k != dropped})


def test_a_dict_naming_no_owner_is_no_segment():
    with pytest.raises(ValueError):
        Segment.from_message({k: v for k, v in JOB_MESSAGE.items() if k != "job_id"})
    assert owner_of("j1") is None and owner_of({"job_id": ""}) is None


def test_the_speed_is_the_base_times_the_rate_rounded_once():
    assert segment_speed(1.1, 1.3) == round(1.1 * 1.3, 4) == 1.43
    segment = Segment.at_rate(JobOwner("j"), 0, "a", "en-us", base_speed=1.1, rate=1.3)
    assert segment.speed == 1.43 and segment.to_message()["speed"] == 1.43
    assert Segment.at_rate(JobOwner("j"), 0, "a", "en-us", base_speed=0.7).speed == 0.7


def test_raw_arguments_are_read_through_the_owner():
    args = ("mel-key", BOOK_MESSAGE)
    assert segment_in(args) is BOOK_MESSAGE
    assert segment_in(("mel-key", {"voice": "en-us"})) is None
    assert job_place(JOB_MESSAGE) == ("j1", 3)
    assert job_place(BOOK_MESSAGE) is None
