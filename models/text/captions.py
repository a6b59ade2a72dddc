"""Captions from timed words: cues, SRT and WebVTT.

Words come as ``{"word", "start", "end", ...}`` in seconds (``models.text.words.word_times``, placed
on a job's or a chapter's timeline). Cues group them the way subtitles are read: at most
:data:`MAX_CUE_CHARS` characters (one line of a common subtitle style) and
:data:`MAX_CUE_SECONDS`, broken early after a sentence's end, at a pause, or where a
segment ends. A cue runs from its first word's start to its last word's end, and its text is
the words as spoken (normalised: "twelve dollars", not "$12"), joined with a space, except
between Chinese or Japanese words, which are written without one (:func:`join_words`).

A word's text is the user's, so a file format's syntax in it is escaped, never obeyed: WebVTT
escapes ``& < >``; SubRip has no escapes, so ``< > { }`` become their fullwidth forms
(``＜ ＞ ｛ ｝``), which no player reads as markup (``<i>``, ``{\\an8}``) and which cannot
make a cue timing line (``-->``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

MAX_CUE_CHARS = 42
MAX_CUE_SECONDS = 6.0
PAUSE_BREAK_S = 0.6  # a silence this long between two words starts a new cue
_SENTENCE_END = (".", "!", "?", "…", ".\"", "!\"", "?\"", ".”", "!”", "?”",
                 "。", "！", "？", "。”", "！”", "？”", "。」", "！」", "？」")
# Scripts written without spaces between words (Han, kana) and their punctuation (CJK
# symbols, fullwidth forms).
_UNSPACED = re.compile("[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
                       "\uff00-\uffef\U00020000-\U0003134f]")
_SRT_ESCAPES = str.maketrans({"<": "＜", ">": "＞", "{": "｛", "}": "｝"})

CAPTION_FORMATS = ("json", "srt", "vtt")
CONTENT_TYPES = {"srt": "application/x-subrip; charset=utf-8", "vtt": "text/vtt; charset=utf-8",
                 "json": "application/json"}


def join_words(words: Sequence[str]) -> str:
    """Words as a line of text: a space between two words, unless one side is Chinese or
    Japanese (or its punctuation) and the other no Latin letter or digit (``你好，世界！``,
    ``说“你好”``; but ``去 Paris``)."""
    line = ""
    for word in words:
        if line and word:
            left, right = line[-1], word[0]
            unspaced = _UNSPACED.match(left) or _UNSPACED.match(right)
            latin = any(c.isalnum() and not _UNSPACED.match(c) for c in (left, right))
            if not unspaced or latin:
                line += " "
        line += word
    return line


def cues(words: Iterable[dict]) -> list[dict]:
    """``[{"start", "end", "text"}]`` cues in order."""
    out: list[dict] = []
    current: list[dict] = []

    def close() -> None:
        if current:
            out.append({"start": current[0]["start"], "end": current[-1]["end"],
                        "text": join_words([w["word"] for w in current])})
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
    """SubRip: numbered cues, ``HH:MM:SS,mmm --> HH:MM:SS,mmm``, blank line between. A cue's
    text has ``< > { }`` in their fullwidth forms (see the module docstring)."""
    blocks = [f"{n}\n{_clock(c['start'], ',')} --> {_clock(c['end'], ',')}\n"
              f"{c['text'].translate(_SRT_ESCAPES)}\n"
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
