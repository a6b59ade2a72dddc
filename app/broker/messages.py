"""The segment message: what both segment stages receive, whether a job or a book owns it.

One frozen type (`Segment`) serialised in one place: `to_message()` is the JSON-safe dict
that travels through the broker (and that the web keeps to publish a lost segment again),
`from_message()` reads it back at a task's entry. The wire keys are today's, so messages
already queued by an older release still decode:

    a job's:  job_id, index, phonemes, voice, speed, pause_ms, words, version
    a book's: book_id, seq, chapter, index, phonemes, text, voice, speed, pause_ms, words,
              and version when the voice has versions

A job's segment is known by its index; a book's by its book-wide ordinal (`seq`), its chapter
and its index in the chapter. Code that only sees the raw arguments of a task (signals,
routing, the redelivery of a dead worker's messages) reads them through `owner_of` and
`segment_in`, so no other module spells the wire keys.

Nothing here imports the rest of the farm: the web, the workers and the broker's helpers
all read it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


def segment_speed(base: float, rate: float = 1.0) -> float:
    """The speed a segment renders at: the request's (or book's) `base` speed times the
    segment's own SSML `rate`, rounded so that the cache key sees what users send."""
    return round(base * rate, 4)


@dataclass(frozen=True)
class JobOwner:
    """An interactive job's segment: its chunk `index` is its place in the job."""

    job_id: str

    is_book = False

    @property
    def id(self) -> str:
        return self.job_id


@dataclass(frozen=True)
class BookOwner:
    """A book's segment: `seq` is its place in the whole book (the book's bitmap counts it
    there), `chapter` the chapter whose files it goes into."""

    book_id: str
    seq: int
    chapter: int

    is_book = True

    @property
    def id(self) -> str:
        return self.book_id


Owner = JobOwner | BookOwner


@dataclass(frozen=True)
class Segment:
    """What one segment task needs: small, JSON-safe on the wire, the same for both stages."""

    owner: Owner
    index: int  # a job's chunk index; a book segment's index in its chapter
    phonemes: str
    voice: str
    speed: float
    pause_ms: int
    # [word, phoneme start, phoneme end, text start, text end] per spoken word (the
    # frontend's models.text.words.WordSpan); the vocoder stage turns them into timestamps.
    words: list = field(default_factory=list)
    # The voice version that renders it (app/canary/); "" for a voice without versions.
    version: str = ""
    # The segment's text: a book's carries it for the error a failed segment leaves.
    text: str = ""

    @classmethod
    def at_rate(cls, owner: Owner, index: int, phonemes: str, voice: str, *,
                base_speed: float, rate: float = 1.0, pause_ms: int = 0,
                words: list | None = None, version: str = "", text: str = "") -> Segment:
        """A segment rendered at `base_speed` times its own `rate` (`segment_speed`)."""
        return cls(owner, index, phonemes, voice, segment_speed(base_speed, rate), pause_ms,
                   [] if words is None else words, version, text)

    @property
    def is_book(self) -> bool:
        return self.owner.is_book

    @property
    def owner_id(self) -> str:
        """The job's or the book's id."""
        return self.owner.id

    @property
    def job_id(self) -> str | None:
        """The job's id; None for a book's segment."""
        return None if self.owner.is_book else self.owner.id

    def describe(self) -> str:
        """Its owner and place, for logs and Flower: never its phonemes."""
        return describe_owner(self.owner, self.index)

    def to_message(self) -> dict:
        """The dict on the wire. Its words are the same list, not a copy: a long digit run
        has 160 segments of fifty words, and copying them cost the web 0.8 ms a segment."""
        if isinstance(self.owner, BookOwner):
            book = self.owner
            message = {"book_id": book.book_id, "seq": book.seq, "chapter": book.chapter,
                       "index": self.index, "phonemes": self.phonemes, "text": self.text,
                       "voice": self.voice, "speed": self.speed, "pause_ms": self.pause_ms,
                       "words": self.words}
            if self.version:  # a book's message names a version only where there is one
                message["version"] = self.version
            return message
        return {"job_id": self.owner.job_id, "index": self.index, "phonemes": self.phonemes,
                "voice": self.voice, "speed": self.speed, "pause_ms": self.pause_ms,
                "words": self.words, "version": self.version}

    @classmethod
    def from_message(cls, message: dict) -> Segment:
        """Read a message back, as this release or an older one wrote it (no words or
        version before word timestamps and voice versions; a book's text may be missing).
        Raises ValueError for a dict that is no segment message."""
        owner = owner_of(message)
        if owner is None:
            raise ValueError("not a segment message: it names neither a job nor a book")
        try:
            return cls(owner, int(message["index"]), message["phonemes"], message["voice"],
                       float(message["speed"]), int(message.get("pause_ms") or 0),
                       message.get("words") or [], message.get("version") or "",
                       message.get("text") or "")
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a segment message: {exc!r}") from exc


def owner_of(message: Any) -> Owner | None:
    """The owner a raw segment message names; None for anything else (another task's
    argument, a damaged message)."""
    if not isinstance(message, dict):
        return None
    book_id = message.get("book_id")
    if isinstance(book_id, str) and book_id:
        return BookOwner(book_id, int(message.get("seq") or 0),
                         int(message.get("chapter") or 0))
    job_id = message.get("job_id")
    if isinstance(job_id, str) and job_id:
        return JobOwner(job_id)
    return None


def segment_in(values: Iterable[Any]) -> dict | None:
    """The first segment message among a task's raw arguments, None if there is none."""
    return next((v for v in values if owner_of(v) is not None), None)


def describe_owner(owner: Owner, index: Any) -> str:
    if isinstance(owner, BookOwner):  # seq: the book's order
        return f"(book {owner.book_id}, segment {owner.seq})"
    return f"(job {owner.job_id}, segment {index})"


def describe_message(message: dict) -> str:
    """What Flower and the logs show of a segment message: its owner and place. Celery would
    otherwise `saferepr` the whole message (phonemes, words) at each send, about 0.6 ms a
    segment in the web: a tenth of a second for a long text's 160 segments."""
    owner = owner_of(message)
    if owner is None:
        return "(segment)"
    return describe_owner(owner, message.get("index"))


def job_place(message: Any) -> tuple[str, int] | None:
    """(job id, index) of a job's segment message; None for a book's, or anything else."""
    owner = owner_of(message)
    if not isinstance(owner, JobOwner) or not isinstance(message.get("index"), int):
        return None
    return owner.job_id, message["index"]
