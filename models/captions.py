"""Captions from timed words: cues, SRT and WebVTT.

Words come as ``{"word", "start", "end", ...}`` in seconds (``models.words.word_times``, placed
on a job's or a chapter's timeline). Cues group them the way subtitles are read: at most
:data:`MAX_CUE_CHARS` characters (one line of a common subtitle style) and
:data:`MAX_CUE_SECONDS`, broken early after a sentence's end, at a pause, or where a
segment ends. A cue runs from its first word's start to its last word's end, and its text is
the words as spoken (normalised: "twelve dollars", not "$12").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MAX_CUE_CHARS = 42
MAX_CUE_SECONDS = 6.0
PAUSE_BREAK_S = 0.6  # a silence this long between two words starts a new cue
_SENTENCE_END = (".", "!", "?", "…", ".\"", "!\"", "?\"", ".”", "!”", "?”")

CAPTION_FORMATS = ("json", "srt", "vtt")
CONTENT_TYPES = {"srt": "application/x-subrip; charset=utf-8", "vtt": "text/vtt; charset=utf-8",
                 "json": "application/json"}


def cues(words: Iterable[dict]) -> list[dict]:
    """``[{"start", "end", "text"}]`` cues in order."""
    out: list[dict] = []
    current: list[dict] = []

    def close() -> None:
        if current:
            out.append({"start": current[0]["start"], "end": current[-1]["end"],
                        "text": " ".join(w["word"] for w in current)})
            current.clear()

    for word in words:
        if current:
            previous = current[-1]
            text_length = sum(len(w["word"]) + 1 for w in current) + len(word["word"])
            if (text_length > MAX_CUE_CHARS
                    or word["end"] - current[0]["start"] > MAX_CUE_SECONDS
                    or word["start"] - previous["end"] >= PAUSE_BREAK_S
                    or previous["word"].endswith(_SENTENCE_END)
                    or word.get("segment") != previous.get("segment")):
                close()
        current.append(word)
    close()
    return out


def _clock(seconds: float, separator: str) -> str:
    ms = max(0, int(round(seconds * 1000)))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{ms:03d}"


def srt(cue_list: Sequence[dict]) -> str:
    """SubRip: numbered cues, ``HH:MM:SS,mmm --> HH:MM:SS,mmm``, blank line between."""
    blocks = [f"{n}\n{_clock(c['start'], ',')} --> {_clock(c['end'], ',')}\n{c['text']}\n"
              for n, c in enumerate(cue_list, 1)]
    return "\n".join(blocks)


def vtt(cue_list: Sequence[dict]) -> str:
    """WebVTT: the ``WEBVTT`` header, then cues with ``HH:MM:SS.mmm`` times. A cue's text
    escapes ``&``, ``<`` and ``>``, which WebVTT reads as markup."""
    blocks = ["WEBVTT\n"]
    for c in cue_list:
        text = c["text"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        blocks.append(f"{_clock(c['start'], '.')} --> {_clock(c['end'], '.')}\n{text}\n")
    return "\n".join(blocks)


def render(words: Sequence[dict], fmt: str) -> str:
    """The words' captions as SRT or VTT text."""
    cue_list = cues(words)
    return srt(cue_list) if fmt == "srt" else vtt(cue_list)
