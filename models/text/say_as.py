"""What ``<say-as>`` says (models/text/ssml.py): spelled characters, a cardinal or an ordinal in
digits, a date in one of the formats, a telephone number, as English words. Content that does
not read as what it claims is a ValueError whose message says why; the SSML parser turns it
into the API's `invalid_say_as`.
"""

from __future__ import annotations

import re

from models.text.text_en import (
    _MONTHS,
    MAX_WORDED_DIGITS,
    cardinal,
    digits,
    ordinal_digits,
    ordinal_suffix,
    year,
)

# The kinds `interpret-as` takes, and the `format`s a date takes.
SAY_AS = ("characters", "cardinal", "ordinal", "date", "telephone")
DATE_FORMATS = ("mdy", "dmy", "ymd", "md", "dm", "ym", "my", "y", "m", "d")
_LETTER_NAMES = {
    "a": "ay", "b": "bee", "c": "see", "d": "dee", "e": "ee", "f": "eff", "g": "gee",
    "h": "aitch", "i": "eye", "j": "jay", "k": "kay", "l": "el", "m": "em", "n": "en",
    "o": "oh", "p": "pee", "q": "cue", "r": "ar", "s": "ess", "t": "tee", "u": "you",
    "v": "vee", "w": "double-you", "x": "ex", "y": "why", "z": "zee",
}  # fmt: skip
_CARDINAL = re.compile(r"([-+−]?)(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?")
_ORDINAL = re.compile(r"(\d+)(st|nd|rd|th)?", re.IGNORECASE)
_PHONE = re.compile(r"\+?[\d\s().\-/]+")
_MONTH_BY_NAME = {m.lower(): i for i, m in enumerate(_MONTHS, 1)} | {
    m[:3].lower(): i for i, m in enumerate(_MONTHS, 1)}
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def say_as(kind: str, content: str, fmt: str | None = None) -> str:
    """What ``<say-as interpret-as=kind>`` says for ``content``.

    Raises:
        ValueError: the content does not read as ``kind``; the message says why.
    """
    text = " ".join(content.split())
    if not text:
        raise ValueError("it is empty")
    if kind == "characters":
        said = [_LETTER_NAMES.get(c.lower(), digits(c) if c.isdigit() else "")
                for c in text if not c.isspace()]
        if not any(said):
            raise ValueError("no letters or digits to spell")
        return " ".join(s for s in said if s)
    if kind == "cardinal":
        match = _CARDINAL.fullmatch(text)
        if not match:
            raise ValueError("not a number in digits (1234, 1,234, -3.5)")
        sign = "minus " if match.group(1) in ("-", "−") else ""
        return sign + cardinal(match.group(2) + (match.group(3) or ""))
    if kind == "ordinal":
        match = _ORDINAL.fullmatch(text)
        if not match or len(match.group(1).lstrip("0")) > MAX_WORDED_DIGITS:
            raise ValueError("not an ordinal in digits (3, 3rd, 21st)")
        number, suffix = match.group(1), match.group(2)
        if suffix and suffix.lower() != ordinal_suffix(number):
            raise ValueError(f"{number}{suffix} is no ordinal: {number} is "
                             f"{number}{ordinal_suffix(number)}")
        return ordinal_digits(number)
    if kind == "telephone":
        if not _PHONE.fullmatch(text) or not any(c.isdigit() for c in text):
            raise ValueError("a telephone number has digits, spaces, + ( ) . - / only")
        groups = re.findall(r"\d+", text)
        return ("plus " if text.startswith("+") else "") + ", ".join(digits(g) for g in groups)
    if kind == "date":
        return _date(text, fmt)
    raise ValueError(f"interpret-as {kind!r} is not supported")


def _date(text: str, fmt: str | None) -> str:
    parts = [p for p in re.split(r"[\s/.,\-]+", text) if p]
    if fmt is None:
        fmt = "ymd" if re.fullmatch(r"\d{4}-\d{1,2}-\d{1,2}", text) else "mdy"
    if len(parts) != len(fmt):
        raise ValueError(f"format {fmt!r} needs {len(fmt)} parts, got {len(parts)}")
    fields: dict[str, int] = {}
    for key, part in zip(fmt, parts, strict=True):
        if key == "m" and part.lower().rstrip(".") in _MONTH_BY_NAME:
            fields["m"] = _MONTH_BY_NAME[part.lower().rstrip(".")]
        elif part.isdigit() and len(part) <= 4:
            fields[key] = int(part)
        else:
            raise ValueError(f"{part!r} is not a {dict(y='year', m='month', d='day')[key]}")
    month, day, year_value = fields.get("m"), fields.get("d"), fields.get("y")
    if month is not None and not 1 <= month <= 12:
        raise ValueError(f"there is no month {month}")
    if day is not None and not 1 <= day <= (_DAYS_IN_MONTH[month - 1] if month else 31):
        raise ValueError(f"there is no day {day}" + (f" in {_MONTHS[month - 1]}" if month
                                                      else ""))
    said = []
    if month is not None:
        said.append(_MONTHS[month - 1])
    if day is not None:
        said.append(("the " if month is None else "") + ordinal_digits(str(day)))
    spoken = " ".join(said)
    if year_value is not None:
        spoken = f"{spoken}, {year(year_value)}" if spoken else year(year_value)
    return spoken
