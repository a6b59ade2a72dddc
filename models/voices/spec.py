"""The voice spec grammar: a shaped or mixed voice written as one string, in place of a name.

A custom or derived voice travels through the farm as its canonical spec: the web resolves a
user's name to it at submission, and segments, books, the feature cache key and the workers
only ever see the spec, which they parse here with no Redis and no model.

Spellings (Kokoro-FastAPI's for mixes)::

    jf_alpha+jm_kumo                 a mix, equal weights
    jf_alpha(2)+jm_kumo(1)           a mix, weights normalised to sum 1
    en_us-hibari-heart[pitch=-3,formant=0.95,rate=1.1]
    jf_alpha[lang=en]                a voice speaking another of its engine's languages
    jf_alpha(0.6)+jm_kumo(0.4)[pitch=2]

Canonical form (what ``Voice.name`` holds, so one voice is one cache key): parts sorted by
name with a part named twice summed, weights normalised and written with at most 4 decimals
(weights that already sum to 1 within rounding are kept, so the form is stable when parsed
again), one part alone written without a weight, the shape's keys in the order pitch,
formant, rate, lang with defaults left out, and no brackets for the identity shape.

Ranges (:data:`RANGES`): pitch -12..12 semitones, formant 0.75..1.33 (the ratio the spectral
envelope's frequencies are scaled by), rate 0.5..2.0 (a speed factor). Which base voices may
be shaped how, and which mixed, is the engine's to say: ``models.voices.catalog`` checks it.

Pure: no torch, no catalog. A voice's own name may hold ``+`` (eSpeak's ``en-us+f3``), so the
parser takes a ``known`` predicate that says which ``+``-joined runs are one name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from models.errors import InvalidVoiceSpec
from models.voices.base import Shape

# shaping -> (lowest, highest) it may be; outside these a voice stops sounding like its base
RANGES: dict[str, tuple[float, float]] = {
    "pitch": (-12.0, 12.0),
    "formant": (0.75, 1.33),
    "rate": (0.5, 2.0),
}
SHAPE_KEYS = ("pitch", "formant", "rate", "lang")  # the canonical order
_ALIASES = {"language": "lang"}
DECIMALS = 4  # of a written weight or shaping value
# Weights summing to 1 within this are taken as normalised already (they were rounded).
_SUM_TOLERANCE = 1e-3
_PART = re.compile(r"(?P<name>[^\s\[\]()+,=]+)(?:\((?P<weight>[^()]*)\))?")
SPEC_CHARACTERS = frozenset("+[]()")  # a string holding none of these is a plain name


@dataclass(frozen=True)
class VoiceSpec:
    """A parsed spec: ``parts`` (name, weight) sorted by name, the weights summing to 1 (one
    part alone weighs 1), and ``shape``."""

    parts: tuple[tuple[str, float], ...]
    shape: Shape = Shape()

    @property
    def is_mix(self) -> bool:
        return len(self.parts) > 1

    @property
    def base(self) -> str:
        """The one part's name (a shaped voice's base); a mix's heaviest part."""
        return heaviest(self.parts)

    def text(self) -> str:
        """The canonical spelling."""
        return format_spec(self.parts, self.shape)


def looks_like_spec(text: str) -> bool:
    """Whether ``text`` uses the spec grammar (rather than being one plain name)."""
    return any(c in SPEC_CHARACTERS for c in text)


def heaviest(parts: Iterable[tuple[str, float]]) -> str:
    """The name of the part with the most weight (the first by name among equals)."""
    ordered = sorted(parts, key=lambda part: (-part[1], part[0]))
    return ordered[0][0]


def number(value: float) -> str:
    """``value`` written compactly and stably: at most 4 decimals, no trailing zeros."""
    rounded = round(float(value), DECIMALS) + 0.0  # + 0.0: no "-0"
    return f"{rounded:.{DECIMALS}f}".rstrip("0").rstrip(".")


def format_spec(parts: Iterable[tuple[str, float]] | dict[str, float],
                shape: Shape = Shape()) -> str:
    """The canonical spelling of ``parts`` (name, weight; or a dict) shaped by ``shape``.
    Formats only: the catalog checks the names and what the engine can do."""
    items = list(parts.items()) if isinstance(parts, dict) else list(parts)
    merged = normalise(items)
    if len(merged) == 1:
        head = merged[0][0]
    else:
        head = "+".join(f"{name}({number(weight)})" for name, weight in merged)
    settings = []
    if shape.pitch != 0.0:
        settings.append(f"pitch={number(shape.pitch)}")
    if shape.formant != 1.0:
        settings.append(f"formant={number(shape.formant)}")
    if shape.rate != 1.0:
        settings.append(f"rate={number(shape.rate)}")
    if shape.language:
        settings.append(f"lang={shape.language}")
    return f"{head}[{','.join(settings)}]" if settings else head


def normalise(parts: Iterable[tuple[str, float]]) -> list[tuple[str, float]]:
    """Parts sorted by name, a name given twice summed, the weights scaled to sum 1 and rounded
    (left as they are when they already sum to 1 within rounding: the canonical form parses
    back to itself)."""
    summed: dict[str, float] = {}
    for name, weight in parts:
        if not math.isfinite(weight) or weight <= 0:
            raise InvalidVoiceSpec("mix", f"the weight of {name} in a mix must be a positive "
                                          f"number, not {weight:g}")
        summed[name] = summed.get(name, 0.0) + weight
    if not summed:
        raise InvalidVoiceSpec("voice", "a voice spec names at least one voice")
    total = sum(summed.values())
    scale = 1.0 if abs(total - 1.0) <= _SUM_TOLERANCE else 1.0 / total
    return [(name, round(summed[name] * scale, DECIMALS)) for name in sorted(summed)]


def _value(key: str, raw: str) -> float:
    """A shaping's number, checked against :data:`RANGES`."""
    try:
        value = float(raw)
    except ValueError:
        raise InvalidVoiceSpec(key, f"{key} must be a number, not {raw!r}") from None
    low, high = RANGES[key]
    if not math.isfinite(value) or not low <= value <= high:
        unit = " semitones" if key == "pitch" else ""
        raise InvalidVoiceSpec(key, f"{key} must be between {number(low)} and {number(high)}"
                                    f"{unit}, not {raw}")
    return value


def parse_shape(text: str) -> Shape:
    """``pitch=-3,formant=0.95,rate=1.1,lang=en`` (any order, each at most once) -> Shape.
    The language is not checked here (the catalog knows what the base's engine speaks)."""
    values: dict[str, str] = {}
    for item in filter(None, (piece.strip() for piece in text.split(","))):
        key, equals, raw = (part.strip() for part in item.partition("="))
        key = _ALIASES.get(key.lower(), key.lower())
        if not equals or key not in SHAPE_KEYS:
            raise InvalidVoiceSpec("voice", f"{item!r} is not a shaping: say "
                                            f"{', '.join(k + '=...' for k in SHAPE_KEYS)}")
        if key in values:
            raise InvalidVoiceSpec(key, f"{key} is given twice")
        values[key] = raw
    language = values.get("lang", "").lower()
    if "lang" in values and not re.fullmatch(r"[a-z]{2,3}", language):
        raise InvalidVoiceSpec("language", f"{values['lang']!r} is not a language code "
                                           "(say lang=en, lang=ja, ...)")
    return Shape(pitch=_value("pitch", values.get("pitch", "0")),
                 formant=_value("formant", values.get("formant", "1")),
                 rate=_value("rate", values.get("rate", "1")), language=language)


def _tokens(head: str) -> list[tuple[str, str | None]]:
    """``a(2)+b`` -> [("a", "2"), ("b", None)]: each ``+``-separated piece's name and weight."""
    out: list[tuple[str, str | None]] = []
    for piece in head.split("+"):
        found = _PART.fullmatch(piece.strip())
        if found is None:
            shown = piece.strip() or "nothing"
            raise InvalidVoiceSpec("mix" if "+" in head else "base",
                                   f"{shown!r} is not a voice name (a mix is written "
                                   "a+b or a(2)+b(1))")
        out.append((found["name"], found["weight"]))
    return out


def _join_names(tokens: list[tuple[str, str | None]],
                known: Callable[[str], bool]) -> list[tuple[str, str | None]]:
    """Pieces joined back where ``+`` is part of one voice's name (``en-us+f3``): at each
    piece, the longest run of unweighted pieces (the last may have a weight) that is a name."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(tokens):
        taken = 1
        for j in range(len(tokens), i + 1, -1):
            run = tokens[i:j]
            if all(weight is None for _, weight in run[:-1]) and \
                    known("+".join(name for name, _ in run)):
                taken = j - i
                break
        run = tokens[i: i + taken]
        out.append(("+".join(name for name, _ in run), run[-1][1]))
        i += taken
    return out


def parse_spec(text: str, known: Callable[[str], bool] | None = None) -> VoiceSpec:
    """Parse a spec (any spelling above) into its canonical parts and shape. ``known(name)``:
    whether a ``+``-joined run is one voice's name (None: every ``+`` separates parts).
    Names are lower-cased, but for a ``:SPEAKER`` (speaker names keep their case).

    Raises:
        InvalidVoiceSpec: not the grammar, a weight or a shaping out of range.
    """
    text = text.strip()
    head, bracket, rest = text.partition("[")
    shape = Shape()
    if bracket:
        if not rest.endswith("]") or "[" in rest or "]" in rest[:-1]:
            raise InvalidVoiceSpec("voice", f"{text!r}: the shaping goes in one [...] at the "
                                            "end, as in en_us-hibari-heart[pitch=-3]")
        shape = parse_shape(rest[:-1])
    tokens = [(_lower_name(name), weight) for name, weight in _tokens(head)]
    joined = _join_names(tokens, known or (lambda name: False))
    parts = []
    for name, raw in joined:
        try:
            weight = 1.0 if raw is None else float(raw)
        except ValueError:
            raise InvalidVoiceSpec("mix", f"the weight of {name} must be a number, "
                                          f"not {raw!r}") from None
        parts.append((name, weight))
    return VoiceSpec(parts=tuple(normalise(parts)), shape=shape)


def _lower_name(name: str) -> str:
    voice, colon, speaker = name.partition(":")
    return voice.lower() + colon + speaker
