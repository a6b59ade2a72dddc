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


class NoSpeakableText(SpeechError):
    """The text yields no speakable phonemes (only punctuation, tags or whitespace)."""
