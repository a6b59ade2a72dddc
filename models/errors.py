"""Business errors of the speech code.

Every error here is a property of the request (a bad voice name, text with nothing to say), so
retrying cannot help: task code must fail the job at once and report the message to the user.
"""

from __future__ import annotations


class SpeechError(Exception):
    """Base of the errors a request causes; never retried."""


class UnknownVoice(SpeechError):
    """The voice name is not one of ours.

    The message lists the valid names so the API can hand it straight to the user.
    """

    def __init__(self, name: str, valid: list[str] | None = None) -> None:
        self.name = name
        self.valid: list[str] = list(valid or [])
        shown = ", ".join(self.valid) if self.valid else "(none)"
        super().__init__(f"unknown voice {name!r}; valid voices: {shown}")

    def __reduce__(self):  # keep the fields when the error crosses a process boundary
        return (type(self), (self.name, self.valid))


class UnknownSpeaker(SpeechError):
    """The voice has no speaker of that name or index; ``valid`` lists its speakers."""

    def __init__(self, voice: str, speaker: str, valid: list[str] | None = None) -> None:
        self.voice = voice
        self.speaker = speaker
        self.valid: list[str] = list(valid or [])
        shown = ", ".join(self.valid) if self.valid else "0 only (the voice has one speaker)"
        super().__init__(f"voice {voice!r} has no speaker {speaker!r}; speakers: {shown}")

    def __reduce__(self):  # keep the fields when the error crosses a process boundary
        return (type(self), (self.voice, self.speaker, self.valid))


class VoiceUnavailable(SpeechError):
    """The voice's files could not be loaded by the worker (broken or mismatched files)."""


class NoSpeakableText(SpeechError):
    """The text yields no speakable phonemes (only punctuation, tags or whitespace)."""


class BreakTooLong(SpeechError):
    """A ``[break=...]`` tag asks for a longer pause than one break may last.

    Refused rather than cut to the cap: a pause silently shorter than asked surprises.
    """

    def __init__(self, tag: str, limit_ms: int) -> None:
        self.tag = tag
        self.limit_ms = limit_ms
        shown = tag if len(tag) <= 40 else tag[:36] + "...]"
        super().__init__(f"{shown} is too long: a break lasts at most {limit_ms // 1000} s "
                         f"({limit_ms} ms)")

    def __reduce__(self):  # keep the fields when the error crosses a process boundary
        return (type(self), (self.tag, self.limit_ms))


class InvalidLexicon(SpeechError):
    """A pronunciation lexicon entry the voice cannot say: ``word`` is the entry,
    ``position`` the index in its phonemes of the first symbol the voice lacks (-1 when the
    entry is wrong as a whole), ``symbols`` those symbols."""

    def __init__(self, word: str, problem: str, position: int = -1,
                 symbols: list[str] | None = None) -> None:
        self.word = word
        self.problem = problem
        self.position = position
        self.symbols: list[str] = list(symbols or [])
        super().__init__(f"lexicon entry {word!r}: {problem}")

    def __reduce__(self):  # keep the fields when the error crosses a process boundary
        return (type(self), (self.word, self.problem, self.position, self.symbols))


class InvalidPhonemes(SpeechError):
    """Phonemes given instead of text that the voice cannot say: ``segment`` is the item
    (or 0 for one string), ``position`` the index of the first symbol the voice lacks (or of
    the word over the bound), ``limit`` the bound a segment or word is over (0 when that is
    not the fault)."""

    def __init__(self, problem: str, segment: int = 0, position: int = -1,
                 symbols: list[str] | None = None, limit: int = 0) -> None:
        self.problem = problem
        self.segment = segment
        self.position = position
        self.symbols: list[str] = list(symbols or [])
        self.limit = limit
        super().__init__(problem)

    def __reduce__(self):  # keep the fields when the error crosses a process boundary
        return (type(self), (self.problem, self.segment, self.position, self.symbols,
                             self.limit))


class SsmlError(SpeechError):
    """Markup the farm refuses. ``code`` is the API's error code, ``element`` the element at
    fault (None for markup that does not parse), ``offset`` the character of the submitted
    text where it starts, ``line``/``column`` the same, counted from 1; ``extra`` more fields
    for the error body (``valid``, ``limit``, ``symbols``)."""

    def __init__(self, code: str, message: str, element: str | None = None, offset: int = -1,
                 line: int = 0, column: int = 0, extra: dict | None = None) -> None:
        self.code, self.element = code, element
        self.offset, self.line, self.column = offset, line, column
        self.extra = dict(extra or {})
        where = f" at line {line}, column {column}" if line else ""
        super().__init__(f"{message}{where}")
        self.problem = message

    def __reduce__(self):  # keep the fields when the error crosses a process boundary
        return (type(self), (self.code, self.problem, self.element, self.offset, self.line,
                             self.column, self.extra))


class InvalidVoiceSpec(SpeechError, ValueError):
    """A voice spec (a shaped or mixed voice: models/voices/spec.py) the farm refuses:
    ``field`` names what is wrong ("voice" for the spelling as a whole, "base", "mix",
    "pitch", "formant", "rate", "language"), ``message`` says why in a user's words."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(message)

    def __reduce__(self):  # keep the fields when the error crosses a process boundary
        return (type(self), (self.field, self.message))
