"""Mandarin text: number normalisation (cn2an), word segmentation (jieba) and pinyin (pypinyin).

Polyphones (多音字) are resolved from the word they sit in: jieba cuts the sentence into words
and pypinyin reads each word from its phrase dictionary, so 银行 gives ``hang2`` and 行走
``xing2``. :func:`g2p_zh` then asks espeak-ng's Mandarin voice for the phonemes of each resolved
tone-numbered syllable ("hang2" -- the cmn voice reads pinyin with tone numbers) and joins them,
so the phonemes rendered, and hence the audio, carry the resolved reading rather than espeak's
own guess. No tone sandhi is applied (espeak applies none either).
"""

from __future__ import annotations

import functools
import logging
import re

import cn2an
import jieba
from pypinyin import Style, lazy_pinyin

from models.classic.espeak import phonemize

jieba.setLogLevel(logging.WARNING)  # jieba logs its dictionary load at INFO on first use

_G2P_VOICE = "cmn"  # variants only change timbre, so every zh voice shares the base's phonemes
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_DIGITS = "零一二三四五六七八九"

_UNITS = {
    "km": "公里", "m": "米", "cm": "厘米", "mm": "毫米", "kg": "公斤", "g": "克",
    "mg": "毫克", "l": "升", "ml": "毫升", "h": "小时", "min": "分钟", "s": "秒",
    "km/h": "公里每小时", "°c": "摄氏度", "℃": "摄氏度", "°f": "华氏度", "℉": "华氏度",
    "gb": "G B", "mb": "M B",
}  # fmt: skip
_CURRENCY_SYMBOLS = {"¥": "元", "￥": "元", "$": "美元", "€": "欧元", "£": "英镑"}
_NUMBER = r"\d+(?:\.\d+)?"
# A minus counts only where no letter, digit or dot is just before it; Han characters may be.
_SIGN = r"(?P<sign>(?<![A-Za-z0-9.])[-−])?"


def digits(number: str) -> str:
    """Read digit by digit, as years and codes are read: '2024' -> '二零二四'."""
    return "".join(_DIGITS[int(digit)] for digit in number if digit.isdigit())


def cardinal(number: str) -> str:
    """'105' -> '一百零五', '3.5' -> '三点五'; numbers beyond cn2an's 16 digits are read digit by
    digit."""
    number = number.replace(",", "")
    whole, _, fraction = number.partition(".")
    if len(whole) > 16:
        spoken = digits(whole)
    else:
        spoken = cn2an.an2cn(whole or "0", "low")
    if fraction:
        spoken += "点" + digits(fraction)
    return spoken


def _signed(match: re.Match[str]) -> str:
    return ("负" if match.group("sign") else "") + cardinal(match.group("number"))


def _percent(match: re.Match[str]) -> str:
    return ("负" if match.group("sign") else "") + "百分之" + cardinal(match.group("number"))


def _date(match: re.Match[str]) -> str:
    year, month, day = match.group("year"), int(match.group("month")), int(match.group("day"))
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return match.group(0)
    return f"{digits(year)}年{cardinal(str(month))}月{cardinal(str(day))}日"


def _year(match: re.Match[str]) -> str:
    return digits(match.group("year")) + "年"


def _time(match: re.Match[str]) -> str:
    hour, minute = int(match.group("hour")), int(match.group("minute"))
    if hour > 24 or minute > 59:
        return match.group(0)
    # 2 o'clock is 两点, not 二点
    spoken_hour = "两" if hour == 2 else cardinal(str(hour))
    if minute == 0:
        return f"{spoken_hour}点"
    spoken_minute = cardinal(str(minute)) if minute >= 10 else "零" + cardinal(str(minute))
    return f"{spoken_hour}点{spoken_minute}分"


def _currency_before(match: re.Match[str]) -> str:
    sign = "负" if match.group("sign") else ""
    return sign + cardinal(match.group("number")) + _CURRENCY_SYMBOLS[match.group("symbol")]


def _unit(match: re.Match[str]) -> str:
    return _signed(match) + _UNITS[match.group("unit").lower()]


_UNIT_NAMES = "|".join(sorted((re.escape(unit) for unit in _UNITS), key=len, reverse=True))
_RULES = [
    (
        re.compile(r"(?P<year>\d{4})[-/.年](?P<month>\d{1,2})[-/.月](?P<day>\d{1,2})[日号]?"),
        _date,
    ),
    (re.compile(r"(?P<year>\d{2,4})年"), _year),
    (re.compile(r"(?<!\d)(?P<hour>\d{1,2})[:：](?P<minute>\d{2})(?::\d{2})?(?!\d)"), _time),
    (re.compile(_SIGN + r"(?P<number>" + _NUMBER + r")\s?[%％]"), _percent),
    (
        re.compile(r"(?P<symbol>[¥￥$€£])\s?" + _SIGN + r"(?P<number>" + _NUMBER + r")"),
        _currency_before,
    ),
    (
        re.compile(r"(?P<a>\d+)/(?P<b>\d+)"),
        lambda m: cardinal(m.group("b")) + "分之" + cardinal(m.group("a")),
    ),
    (
        re.compile(
            _SIGN + r"(?P<number>" + _NUMBER + r")\s?(?P<unit>" + _UNIT_NAMES + r")(?![A-Za-z/])",
            re.I,
        ),
        _unit,
    ),
    (re.compile(_SIGN + r"(?P<number>\d[\d,]*(?:\.\d+)?)"), _signed),
]


def normalize_zh(text: str) -> str:
    """Spell out the numbers, dates, times, money and units of Chinese ``text`` in characters."""
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return re.sub(r"\s+", " ", text).strip()


def has_han(text: str) -> bool:
    return bool(_HAN.search(text))


def words(text: str) -> list[str]:
    """jieba's word segmentation (precise mode), deterministic for a given dictionary."""
    return jieba.lcut(text)


def pinyin_words(text: str) -> list[tuple[str, list[str]]]:
    """(word, tone-numbered syllables) for each jieba word; non-Han words get no syllables.

    The neutral tone is written 5 ("zi5"), which espeak reads.
    """
    result: list[tuple[str, list[str]]] = []
    for word in words(text):
        if has_han(word):
            syllables = lazy_pinyin(word, style=Style.TONE3, neutral_tone_with_five=True)
            result.append((word, syllables))
        else:
            result.append((word, []))
    return result


# Syllables missing from espeak's cmn dictionary, mapped to the nearest syllable it reads.
# (j/q/x + iong are rebuilt from the initial and "yong" instead: see _syllable_phonemes.)
_NEAREST_SYLLABLE = {"m": "mu", "hm": "hen", "hng": "heng", "n": "en", "ê": "ei", "r": "er"}
# espeak's mnemonics / IPA for the palatal initials, as it writes them in "ji", "qi", "xi".
_PALATAL_INITIALS = {"j": ("tS;", "tɕ"), "q": ("tS;h", "tɕh"), "x": ("S;", "ɕ")}
_LANGUAGE_SWITCH = re.compile(r"\([a-z-]+\)")
_WORD_END = "_|"  # espeak's cmn voice ends every word with this phoneme


def _espeak_reads(phonemes: str) -> bool:
    """Whether espeak read a syllable as pinyin: a language switch means it spelt it as English."""
    return "(" not in phonemes and any(char.isdigit() for char in phonemes)


def strip_language_switches(phonemes: str) -> str:
    """Drop espeak's "(en)" / "(cmn)" markers: [[...]] rendering has no language switching, so
    the phonemes inside are rendered with the voice's own phoneme table."""
    return _LANGUAGE_SWITCH.sub("", phonemes)


@functools.cache
def _syllable_phonemes(syllable: str, ipa: bool) -> str | None:
    """espeak's phonemes for one tone-numbered pinyin syllable, without the word-end marker; None
    if espeak cannot read it.

    Most syllables are read by espeak's cmn voice directly. It lacks j/q/x + iong (窘, 穷, 熊), so
    those are rebuilt as the palatal initial followed by "yong" with the same tone.
    """
    body, tone = (syllable[:-1], syllable[-1]) if syllable[-1:].isdigit() else (syllable, "5")
    body = body.replace("ü", "v")
    body = _NEAREST_SYLLABLE.get(body, body)
    if len(body) > 1 and body[0] in _PALATAL_INITIALS and body[1:] == "iong":
        rest = _syllable_phonemes("yong" + tone, ipa)
        if rest is None:
            return None
        return _PALATAL_INITIALS[body[0]][1 if ipa else 0] + rest
    # Readability is judged on the mnemonics: IPA writes tones 2 and 3 as letters, not digits.
    if not _espeak_reads(phonemize(body + tone, _G2P_VOICE, ipa=False)):
        return None
    phonemes = phonemize(body + tone, _G2P_VOICE, ipa=ipa)
    return phonemes.replace(_WORD_END, "").strip()


def _espeak_word(word: str, ipa: bool) -> str:
    """espeak's own reading of a word (Latin words, characters we have no pinyin for)."""
    phonemes = strip_language_switches(phonemize(word, _G2P_VOICE, ipa=ipa))
    return " ".join(phonemes.replace(_WORD_END, " ").split())


def g2p_zh(text: str, ipa: bool = False) -> str:
    """Phonemes of Mandarin ``text`` with polyphones resolved by word (jieba + pypinyin).

    Each Han character becomes espeak's phonemes for its resolved pinyin syllable, so the
    reading pypinyin chose is the one rendered; the syllables of a word are joined as espeak
    joins them. Latin words and characters espeak cannot read as pinyin are left to espeak.
    Punctuation yields nothing (clause pauses come from segmentation).
    """
    out: list[str] = []
    for word, syllables in pinyin_words(text):
        if not syllables:
            if any(char.isalnum() for char in word):
                spoken = _espeak_word(word, ipa)
                if spoken:
                    out.append(spoken if ipa else spoken + _WORD_END)
            continue
        han_chars = [char for char in word if _HAN.match(char)]
        parts: list[str] = []
        if len(han_chars) == len(syllables):
            for char, syllable in zip(han_chars, syllables, strict=True):
                phonemes = _syllable_phonemes(syllable, ipa)
                parts.append(phonemes if phonemes is not None else _espeak_word(char, ipa))
        else:  # pypinyin did not give one syllable per character: let espeak read the word
            parts.append(_espeak_word(word, ipa))
        joined = "".join(part.replace(" ", "") for part in parts)
        if joined:
            out.append(joined if ipa else joined + _WORD_END)
    return " ".join(out)
