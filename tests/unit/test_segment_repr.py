"""What Flower and the logs show of a segment task: its owner and index, not its message (the
whole message's repr cost the web 0.6 ms a segment at each send)."""

from __future__ import annotations

from app.broker.messages import BookOwner, JobOwner, Segment, describe_message


def test_a_job_segment_shows_its_job_and_index_and_not_its_phonemes() -> None:
    spec = {"job_id": "j1", "index": 7, "phonemes": "wˈʌn " * 200, "words": [["one", 0, 3]]}
    shown = describe_message(spec)
    assert shown == "(job j1, segment 7)"
    assert "wˈʌn" not in shown
    assert Segment(JobOwner("j1"), 7, "wˈʌn", "en-us", 1.0, 0).describe() == shown


def test_a_book_segment_shows_its_book_and_its_place_in_the_book() -> None:
    spec = {"book_id": "b9", "seq": 41, "chapter": 3, "index": 0, "phonemes": "x"}
    assert describe_message(spec) == "(book b9, segment 41)"
    assert Segment(BookOwner("b9", 41, 3), 0, "x", "en-us", 1.0, 0).describe() == \
        "(book b9, segment 41)"


def test_anything_else_shows_no_owner() -> None:
    assert describe_message({"index": 3, "phonemes": "x"}) == "(segment)"
