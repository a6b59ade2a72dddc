"""The field types the request models are made of: bounds (`Range`), choices (`OneOf`), a text
to speak, a voice's name, book formats, a lexicon's and phonemes' shapes, a query string's
integer. Each checks what it can alone and writes its part of the document; what only the farm
can check (a voice name, a lexicon's or phonemes' symbols, SSML) is checked by the helpers that
know the voice (web/helpers.py), and here those fields say their shape and pass through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationInfo,
    WithJsonSchema,
)
from pydantic_core import core_schema

from app.stores.books import BOOK_FORMATS, DEFAULT_FORMATS
from models.audio.encode import FORMATS as AUDIO_TABLE
from models.text.lexicon import MAX_ENTRIES as LEXICON_MAX_ENTRIES
from models.text.lexicon import MAX_PHONEME_CHARS as LEXICON_MAX_PHONEMES
from models.text.segmenting import MAX_BREAK_MS
from models.text.ssml import SPEED_MAX, SPEED_MIN  # the speeds the farm renders
from web.schemas.constants import AUDIO_FORMATS, OPENAI_SPEED_MAX, OPENAI_SPEED_MIN, TEXT_TYPES
from web.schemas.document import document_setting, from_settings, refusal, settings_of


@dataclass(frozen=True)
class Range:
    """`lo <= value <= hi`, else 422 `out_of_range`; `hi` may name a setting (`max_wait_s`)."""

    lo: float
    hi: float | str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler):
        return core_schema.with_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema, handler: GetJsonSchemaHandler) -> dict:
        out = handler(schema)
        out.update(minimum=self.lo, maximum=document_setting(self.hi))
        return out

    def _check(self, value: float, info: ValidationInfo) -> float:
        hi = getattr(settings_of(info), self.hi) if isinstance(self.hi, str) else self.hi
        if not self.lo <= value <= hi:
            raise refusal("out_of_range", f"'{info.field_name}' must be between {self.lo} "
                          f"and {hi}")
        return value


@dataclass(frozen=True)
class OneOf:
    """One of `values` (any case with `fold_case`, answered in lower case), else 422
    `unsupported_format` with the list."""

    values: tuple[str, ...]
    fold_case: bool = False

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler):
        return core_schema.with_info_plain_validator_function(self._check)

    def __get_pydantic_json_schema__(self, schema, handler: GetJsonSchemaHandler) -> dict:
        return {"type": "string", "enum": list(self.values)}

    def _check(self, value: object, info: ValidationInfo) -> str:
        if isinstance(value, str):
            folded = value.lower() if self.fold_case else value
            if folded in self.values:
                return folded
        raise refusal("unsupported_format", f"'{info.field_name}' must be one of "
                      f"{', '.join(self.values)}", valid=list(self.values))


@dataclass(frozen=True)
class StreamedFormat(OneOf):
    """One of the streamable audio formats `values`; a format the farm writes only as a whole
    file (`m4a`) gets the same 422 saying why it cannot stream."""

    def _check(self, value: object, info: ValidationInfo) -> str:
        spec = AUDIO_TABLE.get(value.lower()) if isinstance(value, str) else None
        if spec is not None and not spec.streamable:
            raise refusal("unsupported_format", f"'{info.field_name}': {spec.name} cannot "
                          f"stream: {spec.why_not_streamable}", valid=list(self.values))
        return super()._check(value, info)


def _spoken(value: str, info: ValidationInfo) -> str:
    name, limit = info.field_name, settings_of(info).max_text_chars
    if not value.strip():
        raise refusal("empty_text", f"'{name}' is empty or only whitespace")
    if len(value) > limit:
        raise refusal("text_too_long", f"'{name}' has {len(value)} characters; the limit is "
                      f"{limit}", status=413, limit=limit)
    return value


def _named(value: str, info: ValidationInfo) -> str:
    if not value.strip():
        raise refusal("invalid_type", f"'{info.field_name}' must be a non-empty string")
    return value


# An integer in a query string: ASCII digits, a minus at most. int() alone also takes
# Unicode digits ("٥"), underscores ("1_0"), a plus and surrounding spaces.
_QUERY_INT = re.compile(r"-?[0-9]+")


def _query_int(raw: object, info: ValidationInfo) -> int:
    if not isinstance(raw, str) or not _QUERY_INT.fullmatch(raw):
        raise refusal("invalid_type", f"'{info.field_name}' must be an integer (ASCII digits)")
    try:
        return int(raw)
    except ValueError:  # more digits than int() converts: past any bound
        return 10**30


def _book_formats(value: object) -> tuple[str, ...]:
    # A list: a JSON string ("m4b") is the wrong type, as docs/books.md says (a form's
    # "m4b,mp3" is split into a list first: web.schemas.requests.BookUpload).
    if not isinstance(value, list) or not value or not all(isinstance(f, str) for f in value):
        raise refusal("invalid_type", "'formats' must be a list of formats",
                      valid=list(BOOK_FORMATS))
    bad = [f for f in value if f.lower() not in BOOK_FORMATS]
    if bad:
        raise refusal("unsupported_format", f"unknown format(s) {', '.join(bad)}; 'formats' "
                      f"takes {', '.join(BOOK_FORMATS)}", valid=list(BOOK_FORMATS))
    return tuple(sorted({f.lower() for f in value}))


# A text to speak: not blank (422 `empty_text`), at most `max_text_chars` (413).
SpokenText = Annotated[str, AfterValidator(_spoken), Field(json_schema_extra=from_settings(
    minLength=1, maxLength="max_text_chars"))]
Name = Annotated[str, AfterValidator(_named), Field(json_schema_extra={"minLength": 1})]
Speed = Annotated[float, Range(SPEED_MIN, SPEED_MAX)]
OpenAISpeed = Annotated[float, Range(OPENAI_SPEED_MIN, OPENAI_SPEED_MAX), Field(
    description=f"clamped to the farm's {SPEED_MIN}-{SPEED_MAX}; the applied value is in "
                "`X-Voxfarm-Speed`")]
AudioFormat = Annotated[str, OneOf(AUDIO_FORMATS, fold_case=True)]
TextType = Annotated[str, OneOf(TEXT_TYPES), Field(
    description="`ssml`: `text` is SSML (a `<speak>` root is optional); without `text_type`, "
                "text whose root is `<speak>` is SSML. The subset: `<speak>`, `<p>`, `<s>`, "
                "`<break time|strength>`, `<prosody rate>`, `<say-as interpret-as=characters|"
                "cardinal|ordinal|date|telephone>`, `<sub alias>`, `<phoneme alphabet ph>`, "
                "`<voice name>`. Anything else is a 422 naming the element, its `line`, "
                "`column` and `offset`.")]
BookFormats = Annotated[tuple[str, ...], BeforeValidator(_book_formats), WithJsonSchema({
    "type": "array", "minItems": 1, "items": {"type": "string", "enum": list(BOOK_FORMATS)},
    "default": list(DEFAULT_FORMATS)})]
# Checked against the voice (web.helpers.lexicon_or_422): the shape, for the document.
Lexicon = Annotated[Any, WithJsonSchema({
    "type": "object", "maxProperties": LEXICON_MAX_ENTRIES,
    "additionalProperties": {"type": "string", "minLength": 1,
                             "maxLength": LEXICON_MAX_PHONEMES},
    "description": "word (or phrase) -> phonemes in the voice's alphabet (Piper IPA for a "
                   "Piper voice, misaki symbols for hibari, eSpeak mnemonics for an eSpeak "
                   "voice); matched as whole "
                   "words, case-insensitive, before normalisation, and spoken as given. Adds "
                   "to the server's lexicon for the voice (`NAME.lexicon.json` in the voices "
                   "directory) and wins over it.",
    "examples": [{"Nguyen": "ŋwˈɪn"}]})]
# Checked against the voice (web.helpers.phonemes_or_422): the shape, for the document.
Phonemes = Annotated[Any, WithJsonSchema({
    "description": "instead of `text`: phonemes in the voice's alphabet, spoken as given (no "
                   "normalisation, no G2P). One string (cut into segments after `. ? !` and at "
                   "line breaks), or the segments as a list of strings or `{phonemes, "
                   "pause_ms}` (what `POST /v1/phonemize` answers)",
    "anyOf": [{"type": "string", "minLength": 1},
              {"type": "array", "minItems": 1, "items": {"anyOf": [
                  {"type": "string"},
                  {"type": "object", "required": ["phonemes"], "properties": {
                      "phonemes": {"type": "string"},
                      "pause_ms": {"type": "integer", "minimum": 0,
                                   "maximum": MAX_BREAK_MS}}}]}}]})]
QueryInt = Annotated[int, BeforeValidator(_query_int)]
# A voice by name (`GET /v1/voices`); None: the settings' default voice.
VoiceName = Annotated[str, Field(description="a name from `GET /v1/voices`",
                                 json_schema_extra=from_settings(default="default_voice"))]
