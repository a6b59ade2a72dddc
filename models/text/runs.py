"""What the text frontend works on and hands out: ``TextRun`` (a stretch of input spoken one
way, with ``SourceSpans`` saying where each character came from) in, ``Segment`` (one unit of
synthesis) out. Plain data, shared by the frontend (models/text/frontend.py), SSML
(models/text/ssml.py) and phonemes given directly (models/text/phoneme_input.py).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from models.text.words import WordSpan


@dataclass(frozen=True)
class Segment:
    """One unit of synthesis.

    ``text`` is the normalised text, ``phonemes`` the espeak mnemonics to render (the cache key
    is built from these), ``ipa`` the same for display, ``pause_ms`` the silence to append after
    the segment's audio (from break tags only). ``words`` says which phonemes say which word
    of ``text`` and which characters of the submitted text each word was read from
    (``models.text.words``); the workers turn it into word timestamps. ``voice`` and ``rate``
    come from SSML.
    """

    index: int
    text: str
    phonemes: str
    ipa: str
    pause_ms: int
    words: tuple[WordSpan, ...] = ()
    voice: str | None = None  # SSML <voice>: this segment's voice; None is the job's
    rate: float = 1.0  # SSML <prosody rate>: a multiple of the job's speed



class SourceSpans:
    """Where each character of a run's text came from in the submitted input: ``spans[i]``
    is ``(start, end)``. Two arrays of 32-bit ints, 8 bytes a character, rather than a tuple
    a character (about 120 bytes): an SSML book chapter has hundreds of thousands."""

    __slots__ = ("starts", "ends")

    def __init__(self, starts: array | None = None, ends: array | None = None) -> None:
        self.starts = starts if starts is not None else array("i")
        self.ends = ends if ends is not None else array("i")

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[int, int]:
        return self.starts[index], self.ends[index]

    def add_each(self, offset: int, count: int) -> None:
        """``count`` characters, each its own character of the input from ``offset`` on."""
        self.starts.extend(range(offset, offset + count))
        self.ends.extend(range(offset + 1, offset + count + 1))

    def add_span(self, start: int, end: int, count: int) -> None:
        """``count`` characters, all read from the input's ``start:end``."""
        self.starts.extend(array("i", (start,)) * count)
        self.ends.extend(array("i", (end,)) * count)

    def part(self, start: int, end: int) -> SourceSpans:
        return SourceSpans(self.starts[start:end], self.ends[start:end])


@dataclass
class TextRun:
    """A stretch of input spoken one way: what the frontend segments.

    Plain text is cut into runs at its break tags; SSML (``models.text.ssml``) into runs at its
    breaks, paragraphs, sentences, voices and rates. ``pause_ms`` is the silence after the
    run. ``voice`` (a voice name) and ``rate`` (a multiple of the job's speed) say how it is
    spoken; None and 1.0 are the job's own. ``fixed`` maps placeholder characters in ``text``
    to phonemes spoken as given (SSML ``<phoneme>``), ``surfaces`` to the text they show;
    both hold this run's placeholders only. Where each character came from in the submitted
    input: ``offset`` + its index, or ``sources[i]`` (a span) when given.
    """

    text: str
    pause_ms: int = 0
    voice: str | None = None
    rate: float = 1.0
    offset: int = 0
    sources: SourceSpans | None = None
    fixed: dict[str, str] = field(default_factory=dict)
    surfaces: dict[str, str] = field(default_factory=dict)

    def where(self, start: int, end: int) -> tuple[int, int]:
        """The submitted input's characters that ``text[start:end]`` came from."""
        if self.sources is None:
            return start + self.offset, end + self.offset
        return self.sources[start][0], self.sources[end - 1][1]
