"""English text normalisation: numbers, money, dates, times, abbreviations and units to words.

Rules run in a fixed order, most specific first (a date before its numbers, money before plain
decimals), so each rule sees digits no earlier rule has claimed. Numbers become words through
num2words.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from num2words import num2words

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")  # fmt: skip
_MONTH_BY_PREFIX = {month[:3].lower(): month for month in _MONTHS}

# Abbreviations that end in a dot: expanding them also removes a dot that would otherwise end
# the sentence early in segmentation.
# Titles expand only before a capitalised name, so "5 ms." stays milliseconds.
_TITLES = {
    "dr": "Doctor", "mr": "Mister", "mrs": "Missus", "ms": "Miz", "prof": "Professor",
    "st": "Saint", "gen": "General", "capt": "Captain", "sgt": "Sergeant", "lt": "Lieutenant",
    "col": "Colonel", "rev": "Reverend", "gov": "Governor", "sen": "Senator",
    "rep": "Representative", "mt": "Mount",
}  # fmt: skip
_ABBREVIATIONS = {
    "jr": "Junior", "sr": "Senior", "vs": "versus",
    "etc": "et cetera", "approx": "approximately", "dept": "department", "est": "established",
    "inc": "Incorporated", "ltd": "Limited", "co": "Company",
    "corp": "Corporation", "ave": "Avenue", "blvd": "Boulevard", "fig": "figure",
}  # fmt: skip
_LATIN = {"e.g.": "for example", "i.e.": "that is", "a.m.": "a m", "p.m.": "p m"}

# unit -> (singular, plural); matched only right after a number.
_UNITS = {
    "km": ("kilometer", "kilometers"), "m": ("meter", "meters"),
    "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"), "mi": ("mile", "miles"), "ft": ("foot", "feet"),
    "kg": ("kilogram", "kilograms"), "g": ("gram", "grams"), "mg": ("milligram", "milligrams"),
    "lb": ("pound", "pounds"), "lbs": ("pound", "pounds"), "oz": ("ounce", "ounces"),
    "l": ("liter", "liters"), "ml": ("milliliter", "milliliters"),
    "mph": ("mile per hour", "miles per hour"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "h": ("hour", "hours"), "hr": ("hour", "hours"), "hrs": ("hour", "hours"),
    "min": ("minute", "minutes"), "s": ("second", "seconds"), "sec": ("second", "seconds"),
    "ms": ("millisecond", "milliseconds"),
    "kb": ("kilobyte", "kilobytes"), "mb": ("megabyte", "megabytes"),
    "gb": ("gigabyte", "gigabytes"), "tb": ("terabyte", "terabytes"),
    "hz": ("hertz", "hertz"), "khz": ("kilohertz", "kilohertz"), "mhz": ("megahertz", "megahertz"),
    "ghz": ("gigahertz", "gigahertz"),
    "°": ("degree", "degrees"), "°c": ("degree Celsius", "degrees Celsius"),
    "°f": ("degree Fahrenheit", "degrees Fahrenheit"),
}  # fmt: skip

# currency symbol -> (major singular, major plural, minor singular, minor plural)
_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "€": ("euro", "euros", "cent", "cents"),
    "¥": ("yen", "yen", "sen", "sen"),
}
_SCALES = ("thousand", "million", "billion", "trillion")
_YEAR_CUES = r"(?:in|since|by|from|until|till|before|after|of|year|circa|around|during)"
# A number in digits: commas only between digits (so "5, and" keeps its comma), an optional
# decimal part. It never starts inside a digit run ("99" or "9,9"): a rule that failed at a
# run's first digit would otherwise retry at each later one, rescanning the run each time,
# which is quadratic in its length (91 s for 20,000 nines). `\d+(?:,\d+)*` cannot backtrack
# into itself either, a comma being required between its digit groups.
_NUMBER = r"(?<!\d)(?<!\d,)\d+(?:,\d+)*(?:\.\d+)?"
# Longer whole numbers (quadrillions and up: card, account and phone numbers, or nonsense) are
# read digit by digit, as people read them; it also keeps num2words and int() off huge input.
MAX_WORDED_DIGITS = 15
# The words a digit is read with, in order (the frontend knows a run of them by these).
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def digits(number: str) -> str:
    """'407' -> 'four zero seven'."""
    return " ".join(DIGIT_WORDS[int(digit)] for digit in number)


def cardinal(number: str) -> str:
    """Words for an unsigned integer or decimal in digits (commas allowed): '3.05' -> 'three
    point zero five'. Digits after the point are read one by one, as people say them."""
    number = number.replace(",", "")
    whole, _, fraction = number.partition(".")
    if len(whole.lstrip("0")) > MAX_WORDED_DIGITS:
        words = digits(whole)
    else:
        words = num2words(int(whole or "0"))
    if fraction:
        words += " point " + digits(fraction)
    return words


def ordinal(number: int) -> str:
    return num2words(number, to="ordinal")


def ordinal_digits(number: str) -> str:
    """'21' -> 'twenty-first'; past :data:`MAX_WORDED_DIGITS`, digits with an ordinal last."""
    if len(number.lstrip("0")) > MAX_WORDED_DIGITS:
        return f"{digits(number[:-1])} {ordinal(int(number[-1]))}"
    return ordinal(int(number))


def ordinal_suffix(number: str) -> str:
    """The ending an ordinal in digits takes: '1' -> 'st', '12' -> 'th', '22' -> 'nd'."""
    last_two = int(number[-2:])
    if 11 <= last_two <= 13:
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(last_two % 10, "th")


def ordinal_or_as_written(number: str, suffix: str | None) -> str:
    """An ordinal's words, if ``suffix`` is the one ``number`` takes (or there is none);
    otherwise the number and the letters, as written ('1nd' -> 'one n d'): a wrong ending
    is not silently made right, it may be no ordinal at all."""
    if suffix is None or suffix.lower() == ordinal_suffix(number):
        return ordinal_digits(number)
    return f"{cardinal(number)} {' '.join(suffix)}"


def year(number: int) -> str:
    """'1999' -> 'nineteen ninety-nine', '2005' -> 'two thousand five' (no British 'and')."""
    return num2words(number, to="year").replace(" and ", " ")


def _plural_of_year(words: str) -> str:
    # "nineteen ninety" -> "nineteen nineties", for decades written "1990s"
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def _money(match: re.Match[str]) -> str:
    symbol, amount, scale = match.group("symbol"), match.group("amount"), match.group("scale")
    major_one, major_many, minor_one, minor_many = _CURRENCIES[symbol]
    if scale:  # "$5 million", "$2.5 billion"
        return f"{cardinal(amount)} {scale.lower()} {major_many}"
    whole, _, cents = amount.replace(",", "").partition(".")
    significant = whole.lstrip("0")  # no int(): the amount may have any number of digits
    parts = []
    if significant or not cents:
        parts.append(f"{cardinal(whole or '0')} "
                     f"{major_one if significant == '1' else major_many}")
    if cents:
        cents_value = int(cents[:2].ljust(2, "0"))
        if cents_value:
            parts.append(
                f"{cardinal(str(cents_value))} {minor_one if cents_value == 1 else minor_many}"
            )
    return " and ".join(parts) if parts else f"zero {major_many}"


def _day_month_year(day: int, month: int, year_value: int | None) -> str:
    spoken = f"{_MONTHS[month - 1]} {ordinal(day)}"
    return f"{spoken}, {year(year_value)}" if year_value is not None else spoken


def _iso_date(match: re.Match[str]) -> str:
    year_value, month, day = (int(part) for part in match.groups())
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return match.group(0).replace("-", " ")
    return _day_month_year(day, month, year_value)


def _month_day(match: re.Match[str]) -> str:
    month = _MONTH_BY_PREFIX[match.group("month")[:3].lower()]
    year_text = match.group("year")
    spoken = f"{month} {ordinal_or_as_written(match.group('day'), match.group('suffix'))}"
    return f"{spoken}, {year(int(year_text))}" if year_text else spoken


def _day_month(match: re.Match[str]) -> str:
    month = _MONTH_BY_PREFIX[match.group("month")[:3].lower()]
    day, suffix = match.group("day"), match.group("suffix")
    year_text = match.group("year")
    said = ordinal_or_as_written(day, suffix)
    spoken = (f"the {said} of {month}" if suffix is None or said == ordinal_digits(day)
              else f"{said} {'of ' if match.group('of') else ''}{month}")
    return f"{spoken}, {year(int(year_text))}" if year_text else spoken


def _time(match: re.Match[str]) -> str:
    hour, minute = int(match.group("hour")), int(match.group("minute"))
    meridiem = (match.group("meridiem") or "").lower().replace(".", "")
    if hour > 24 or minute > 59:
        return f"{cardinal(str(hour))} {cardinal(str(minute))}"
    if minute == 0:
        spoken = f"{cardinal(str(hour))}" + ("" if meridiem else " o'clock")
    elif minute < 10:
        spoken = f"{cardinal(str(hour))} oh {cardinal(str(minute))}"
    else:
        spoken = f"{cardinal(str(hour))} {cardinal(str(minute))}"
    if meridiem:
        spoken += " " + " ".join(meridiem)  # "pm" -> "p m": spelt, as people say it
    return spoken


def _percent(match: re.Match[str]) -> str:
    sign = "minus " if match.group("sign") else ""
    return f"{sign}{cardinal(match.group('number'))} percent"


def _ordinal(match: re.Match[str]) -> str:
    return ordinal_or_as_written(match.group("number"), match.group("suffix"))


def _year(match: re.Match[str]) -> str:
    words = year(int(match.group("year")))
    return f"{match.group('cue')}{match.group('colon')} {words}"


def _decade(match: re.Match[str]) -> str:
    return _plural_of_year(year(int(match.group("year"))))


def _unit(match: re.Match[str]) -> str:
    number = match.group("number")
    singular, plural = _UNITS[match.group("unit").lower()]
    sign = "minus " if match.group("sign") else ""
    is_one = number.replace(",", "") in ("1", "1.0") and not sign
    return f"{sign}{cardinal(number)} {singular if is_one else plural}"


def _signed_number(match: re.Match[str]) -> str:
    sign = "minus " if match.group("sign") else ""
    return sign + cardinal(match.group("number"))


def _abbreviation(match: re.Match[str]) -> str:
    return _ABBREVIATIONS[match.group(1).lower()]


def _title(match: re.Match[str]) -> str:
    return _TITLES[match.group(1).lower()]


# A minus sign counts only where a word could not end just before it ("-3", "(-3", but not the
# hyphen of "2-3" or "COVID-19").
_SIGN = r"(?P<sign>(?<![\w.])[-−])?"
_UNIT_NAMES = "|".join(sorted((re.escape(unit) for unit in _UNITS), key=len, reverse=True))
_MONTH_NAME = (
    r"(?P<month>Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?"
)

_RULES: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    (
        re.compile(r"(?<!\w)(e\.g\.|i\.e\.|a\.m\.|p\.m\.)", re.I),
        lambda m: _LATIN[m.group(1).lower()],
    ),
    # A title before a capitalised name, or before a name from a pronunciation lexicon (a
    # private-use placeholder by now, see models/text/lexicon.py).
    (re.compile(r"(?<!\d\s)\b(" + "|".join(_TITLES) + r")\.(?=\s+[A-Z\ue000-\uf8ff])", re.I),
     _title),
    (re.compile(r"\b(" + "|".join(_ABBREVIATIONS) + r")\.", re.I), _abbreviation),
    (re.compile(r"\bNo\.\s*(?=\d)"), "number "),
    (
        re.compile(
            r"(?P<symbol>[$£€¥])\s?(?P<amount>" + _NUMBER + r")"
            r"(?:\s?(?P<scale>" + "|".join(_SCALES) + r")\b)?",
            re.I,
        ),
        _money,
    ),
    (re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b"), _iso_date),
    (
        re.compile(
            r"\b"
            + _MONTH_NAME
            + r"\s+(?P<day>\d{1,2})(?P<suffix>st|nd|rd|th)?\b(?:,?\s+(?P<year>\d{4})\b)?"
        ),
        _month_day,
    ),
    (
        re.compile(
            r"\b(?P<day>\d{1,2})(?P<suffix>st|nd|rd|th)?\s+(?P<of>of\s+)?"
            + _MONTH_NAME
            + r"(?:,?\s+(?P<year>\d{4})\b)?"
        ),
        _day_month,
    ),
    (
        re.compile(
            r"\b(?P<hour>\d{1,2}):(?P<minute>\d{2})(?::\d{2})?"
            r"(?:\s*(?P<meridiem>[ap]\.?m\.?)(?!\w))?",
            re.I,
        ),
        _time,
    ),
    (re.compile(_SIGN + r"(?P<number>" + _NUMBER + r")\s?%"), _percent),
    (re.compile(r"\b(?P<number>\d+)(?P<suffix>st|nd|rd|th)\b", re.I), _ordinal),
    (re.compile(r"\b(?P<year>1\d\d0|20\d0)'?s\b"), _decade),
    # "Year: 1961" too: a table's cell read after its column's header (models/books/parse).
    (re.compile(r"\b(?P<cue>" + _YEAR_CUES + r")(?P<colon>:?)\s+(?P<year>1[1-9]\d\d|20\d\d)\b",
                re.I), _year),
    (
        re.compile(
            _SIGN + r"(?P<number>" + _NUMBER + r")\s?(?P<unit>" + _UNIT_NAMES + r")(?![\w/])", re.I
        ),
        _unit,
    ),
    (re.compile(r"(?<=\d)\s?[-–]\s?(?=\d)"), " to "),  # ranges: "2-3" -> "2 to 3"
    (re.compile(_SIGN + r"(?P<number>" + _NUMBER + r")"), _signed_number),
    # Each starts only at a run of whitespace's first character, for the reason given at
    # _NUMBER: a long run of spaces would otherwise be rescanned from each of its characters.
    (re.compile(r"(?<!\s)\s*&\s*"), " and "),
    (re.compile(r"(?<!\s)\s*\+\s*"), " plus "),
    (re.compile(r"(?<!\s)\s*=\s*"), " equals "),
    (re.compile(r"(?<!\s)\s*@\s*"), " at "),
]


def normalize_en(text: str) -> str:
    """Spell out the numbers, symbols and abbreviations of English ``text`` as words."""
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return re.sub(r"\s+", " ", text).strip()
