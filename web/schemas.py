"""The API declared once: a pydantic model for every request body, query and JSON response.

The request models validate (`web.helpers.parse` turns their errors into the API's one error
shape) and every model writes its part of `/openapi.json` (web/openapi.py). Nothing here
restates a fact: states come from `app.stores.states`, formats and limits from the modules that own
them, and a bound or default that is a setting (`max_text_chars`, `max_wait_s`,
`default_voice`) is read from the app's settings: at validation from the context
(`{"settings": ...}`), in the document from the settings it is built for (`document_for`).

What only the farm can check (a voice name, a lexicon's or phonemes' symbols, SSML) is
checked by the helpers that know the voice; here those fields say their shape for the
document and pass through.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationInfo,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

from app.settings import Settings
from app.stores.books import BOOK_FORMATS, DEFAULT_FORMATS
from app.stores.states import BookState, JobState
from models.audio.encode import CONTENT_TYPES as AUDIO_CONTENT_TYPES
from models.books.parse import EXTENSIONS as BOOK_EXTENSIONS
from models.neural.voice_file import INFERENCE_RANGES  # what a voice version may override
from models.text.captions import CAPTION_FORMATS
from models.text.frontend import MAX_BREAK_MS
from models.text.lexicon import MAX_ENTRIES as LEXICON_MAX_ENTRIES
from models.text.lexicon import MAX_PHONEME_CHARS as LEXICON_MAX_PHONEMES
from models.text.ssml import SPEED_MAX, SPEED_MIN  # the speeds the farm renders
from models.voices import ESPEAK, HIBARI, PIPER

# -- the values the API takes ----------------------------------------------------------------

# A job's `format`: what `/audio` encodes (models/audio/encode.py can write each).
AUDIO_FORMATS = tuple(AUDIO_CONTENT_TYPES)
# The formats a job stream offers; `wav` (open length) plays in any browser's <audio>.
JOB_STREAM_FORMATS = ("wav", "pcm", "ogg", "mp3", "aac", "flac")
TEXT_TYPES = ("text", "ssml")
# Chunks returned by one long-poll answer, at most; the client asks again for the rest.
MAX_CHUNKS_PER_POLL = 32
# A whole book's audio, by format; and its captions, files only.
BOOK_AUDIO_TYPES = {"m4b": "audio/mp4", "mp3": "audio/mpeg"}
BOOK_CAPTION_FORMATS = tuple(f for f in CAPTION_FORMATS if f != "json")

# OpenAI's speech API (web/openai_compat.py has the reasons).
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage",
                 "shimmer", "verse", "marin", "cedar")
# response_format -> (stream encoder format, output rate or None for the voice's own)
RESPONSE_FORMATS: dict[str, tuple[str, int | None]] = {
    "mp3": ("mp3", None), "opus": ("ogg", None), "aac": ("aac", None),
    "flac": ("flac", None), "wav": ("wav", None), "pcm": ("pcm", 24_000)}
OPENAI_SPEED_MIN, OPENAI_SPEED_MAX = 0.25, 4.0
STREAM_FORMATS = ("audio", "sse")  # raw audio bytes (OpenAI's default) or server-sent events
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "voxfarm")


# -- settings in the document ----------------------------------------------------------------

_DOCUMENT_SETTINGS: ContextVar[Settings] = ContextVar("voxfarm_document_settings")


@contextmanager
def document_for(settings: Settings) -> Iterator[None]:
    """Build JSON schemas inside this block: bounds and defaults that are settings are
    these settings' values."""
    token = _DOCUMENT_SETTINGS.set(settings)
    try:
        yield
    finally:
        _DOCUMENT_SETTINGS.reset(token)


def _setting(name: str | float) -> Any:
    """The setting called `name` (a number stands for itself)."""
    return getattr(_DOCUMENT_SETTINGS.get(), name) if isinstance(name, str) else name


def _settings_of(info: ValidationInfo) -> Settings:
    return (info.context or {})["settings"]


def from_settings(**keywords: str | float) -> Callable[[dict], None]:
    """A field's `json_schema_extra` whose keywords are settings (`default="default_voice"`)
    or numbers."""
    def extra(schema: dict) -> None:
        schema.update({k: _setting(name) for k, name in keywords.items()})
    return extra


def refusal(code: str, message: str, status: int = 422, **extra: Any) -> PydanticCustomError:
    """A validation error that leaves as exactly this API error (web.helpers.parse)."""
    return PydanticCustomError(code, message, {"status": status, **extra})


# -- field types -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """`lo <= value <= hi`, else 422 `out_of_range`; `hi` may name a setting (`max_wait_s`)."""

    lo: float
    hi: float | str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler):
        return core_schema.with_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema, handler: GetJsonSchemaHandler) -> dict:
        out = handler(schema)
        out.update(minimum=self.lo, maximum=_setting(self.hi))
        return out

    def _check(self, value: float, info: ValidationInfo) -> float:
        hi = getattr(_settings_of(info), self.hi) if isinstance(self.hi, str) else self.hi
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


def _spoken(value: str, info: ValidationInfo) -> str:
    name, limit = info.field_name, _settings_of(info).max_text_chars
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


def _form_number(raw: object) -> object:
    """A multipart form's number (a string), as JSON would have it."""
    if isinstance(raw, str):
        try:
            return float(raw)
        except ValueError:
            raise refusal("invalid_type", "'speed' must be a number") from None
    return raw


def _book_formats(value: object) -> tuple[str, ...]:
    if isinstance(value, str):  # "m4b,mp3", as a form sends it (JSON may too)
        value = [p.strip() for p in value.split(",") if p.strip()]
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


# -- requests --------------------------------------------------------------------------------


class RequestModel(BaseModel):
    """A request's fields, typed as JSON types them: a string is no number, null is no
    string. A field whose default is None may be left out, and null is refused as any other
    value of the wrong type; fields in `null_is_unset` may be sent as null for their
    default."""

    model_config = ConfigDict(strict=True, extra="allow")
    null_is_unset: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _nulls(cls, data: Any) -> Any:
        if isinstance(data, dict) and cls.null_is_unset:
            return {k: v for k, v in data.items() if not (k in cls.null_is_unset and v is None)}
        return data


class PhonemizeRequest(RequestModel):
    text: SpokenText
    voice: VoiceName = None
    speed: Speed = 1.0
    lexicon: Lexicon = None
    text_type: TextType = None
    null_is_unset: ClassVar = frozenset({"text_type"})


class JobRequest(RequestModel):
    text: SpokenText = Field(None, description="plain text, English or Mandarin; "
                             "`[break=300ms]` tags insert pauses")
    phonemes: Phonemes = None
    voice: VoiceName = None
    speed: Speed = 1.0
    format: AudioFormat = Field("wav", description="the default format of `/audio`")
    lexicon: Lexicon = None
    text_type: TextType = None
    null_is_unset: ClassVar = frozenset({"text_type"})
    model_config = ConfigDict(json_schema_extra={
        "anyOf": [{"required": ["text"]}, {"required": ["phonemes"]}]})

    @model_validator(mode="before")
    @classmethod
    def _text_or_phonemes(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if "phonemes" in data and "lexicon" in data and "text" not in data:
                raise refusal("invalid_field", "'lexicon' applies to 'text'; phonemes are "
                              "spoken as given", field="lexicon")
            if "phonemes" in data and "text" in data:
                raise refusal("invalid_field", "send 'text' or 'phonemes', not both",
                              field="phonemes")
            if "phonemes" not in data and data.get("text") is None:
                raise refusal("missing_field", "'text' is required", field="text")
        return data


class ChunksQuery(RequestModel):
    after: Annotated[QueryInt, Range(-1, 10**9),
                     Field(description="cursor; -1 from the start")] = -1
    wait: Annotated[QueryInt, Range(0, "max_wait_s"),
                    Field(description="seconds to wait for a chunk")] = 0
    max: Annotated[QueryInt, Range(1, MAX_CHUNKS_PER_POLL),
                   Field(description="chunks per answer, at most")] = MAX_CHUNKS_PER_POLL


class AudioQuery(RequestModel):
    format: AudioFormat = Field(None, description="the job's `format` unless given")


class CaptionsQuery(RequestModel):
    format: Annotated[str, OneOf(CAPTION_FORMATS)] = "json"


class StreamQuery(RequestModel):
    format: Annotated[str, OneOf(JOB_STREAM_FORMATS, fold_case=True)] = "wav"


class SpeechRequest(RequestModel):
    """OpenAI's speech request."""

    model: Name = Field(description="any name (`tts-1`, `tts-1-hd`, ...); accepted, not used: "
                                    "the farm has one engine")
    input: SpokenText
    voice: Name = Field(description="an OpenAI voice name (" + ", ".join(OPENAI_VOICES) +
                                    ": the farm's default voice unless `openai_voices` maps "
                                    "it) or a farm voice from `GET /v1/voices`")
    response_format: Annotated[str, OneOf(tuple(RESPONSE_FORMATS))] = "mp3"
    speed: OpenAISpeed = 1.0
    stream_format: Annotated[str, OneOf(STREAM_FORMATS)] = Field(
        "audio", description="`audio`: the bytes of `response_format`; `sse`: the same bytes "
                             "base64-encoded in `speech.audio.delta` events, then one "
                             "`speech.audio.done`")
    instructions: str | None = Field(None, description="accepted and not used: the voices "
                                                       "have no style control")
    # OpenAI's clients send null for "not given"; "" too for the formats.
    null_is_unset: ClassVar = frozenset({"model", "input", "speed", "response_format",
                                         "stream_format"})

    @model_validator(mode="before")
    @classmethod
    def _empty_formats(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items()
                    if not (k in ("response_format", "stream_format") and v == "")}
        return data


class CaptionedSpeechRequest(SpeechRequest):
    """The speech request, Kokoro-FastAPI's way: `model` and `voice` may be left out."""

    model: Name = "tts-1"
    voice: Name = "alloy"
    stream: bool = False
    return_timestamps: bool = True
    null_is_unset: ClassVar = frozenset({"input", "speed", "response_format", "stream",
                                         "return_timestamps"})


class Chapter(RequestModel):
    title: str = ""
    text: str
    text_type: TextType = None
    null_is_unset: ClassVar = frozenset({"text_type"})


def _chapters(value: object) -> object:
    if not isinstance(value, list) or not value:
        raise refusal("missing_field", "'chapters' must be a non-empty list of "
                      "{\"title\", \"text\"}")
    return value


class BookFields(RequestModel):
    voice: VoiceName = None
    speed: Speed = 1.0
    formats: BookFormats = DEFAULT_FORMATS


class BookRequest(BookFields):
    """A book as JSON chapters."""

    title: str = ""
    author: str = ""
    chapters: Annotated[list[Chapter], BeforeValidator(_chapters), Field(min_length=1)]


def _with_file(schema: dict) -> None:
    schema["properties"] = {"file": {"type": "string", "format": "binary",
                                     "description": ", ".join(sorted(BOOK_EXTENSIONS))},
                            **schema["properties"]}
    schema["required"] = ["file"]


class BookUpload(BookFields):
    """A book file, multipart; the fields are strings, an empty one is the default."""

    model_config = ConfigDict(json_schema_extra=_with_file)
    speed: Annotated[Speed, BeforeValidator(_form_number)] = 1.0


class BookAudioQuery(RequestModel):
    format: Annotated[str, OneOf(tuple(BOOK_AUDIO_TYPES), fold_case=True)] = None


class BookCaptionsQuery(RequestModel):
    format: Annotated[str, OneOf(BOOK_CAPTION_FORMATS, fold_case=True)] = "srt"


class SocketMessage(RequestModel):
    """A client's message on `WS /v1/ws`: text appended, a flush, a change of voice, speed or
    lexicon (from now on). The same fields as a job's, as the socket takes them."""

    model_config = ConfigDict(extra="forbid")
    text: str = ""
    voice: Name = None
    speed: Speed = None
    lexicon: Lexicon = None
    flush: bool = False

    @model_validator(mode="before")
    @classmethod
    def _known(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(cls.model_fields))
            if unknown:
                raise refusal("unknown_field", f"unknown field '{unknown[0]}'; a message has "
                              f"{', '.join(cls.model_fields)}", field=unknown[0])
            if not data:
                raise refusal("missing_field", "a message needs 'text' or 'flush'",
                              field="text")
        return data


# -- responses -------------------------------------------------------------------------------


class ResponseModel(BaseModel):
    """A JSON answer, declared once for the document and the view: a view that builds its
    answer with `Model.answer(...)` answers what the document says, or fails loudly."""

    model_config = ConfigDict(extra="allow")

    @classmethod
    def answer(cls, **fields: Any) -> dict:
        """The answer's JSON object: `fields` validated by this model and written out as given
        (a field left out stays out; extras pass through)."""
        return cls.model_validate(fields).model_dump(mode="json", exclude_unset=True)


class ErrorDetail(ResponseModel):
    code: str = Field(description="machine-readable, stable")
    message: str = Field(description="what went wrong, for people")
    field: str = Field(None, description="the request field at fault")
    valid: list[str] = Field(None, description="the accepted values, when there is "
                                                       "a list")
    limit: int = None
    state: str = None


class Error(ResponseModel):
    """The one error body of the whole API."""

    error: ErrorDetail


class Progress(ResponseModel):
    done: int = Field(ge=0)
    total: int = Field(ge=0)


class Word(ResponseModel):
    """A spoken word and when it is said, in seconds of the job's audio. `word` is the
    normalised text (`$12` is said as `twelve` `dollars`); `text_start`/`text_end` are the
    characters of the submitted text it was read from (every word of `$12` points at `$12`)."""

    word: str
    start: float
    end: float
    segment: int = None
    text_start: int = None
    text_end: int = None


class CacheCounts(ResponseModel):
    hits: int
    misses: int


class JobLinks(ResponseModel):
    self: str
    chunks: str
    audio: str
    captions: str


class Job(ResponseModel):
    id: str
    state: JobState
    segments: Progress
    voice: str
    speed: float
    format: str
    audio_seconds: float
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    error: str | None
    mel_cache: CacheCounts
    links: JobLinks


class Chunk(ResponseModel):
    index: int = Field(ge=0)
    segment: int = Field(ge=0)
    window: int = Field(ge=0)
    segment_end: bool = Field(description="the segment's last window")
    format: Literal["wav"]
    sample_rate: int = Field(description="the job's voice's rate")
    duration_s: float
    start_s: float | None = Field(None, description="where the chunk starts in the job's "
                                  "audio, seconds (null while an earlier segment's length is "
                                  "unknown)")
    words: list[Word] = Field(None, description="the words that start in this chunk, "
                                      "on the job's timeline (neural voices)")
    audio: str = Field(description="a WAV file of this window of a segment",
                       json_schema_extra={"contentEncoding": "base64"})


class ChunkPage(ResponseModel):
    job_id: str
    state: JobState
    total: int | None = Field(description="the job's chunk count, null until every segment's "
                                          "window count is known")
    segments: int = Field(None, description="the job's segment count")
    chunks: list[Chunk]
    next_after: int = Field(description="the cursor to pass as `after` next time")
    end: bool = Field(description="no more chunks will come")


class PhonemizedWord(ResponseModel):
    word: str
    phonemes: str
    text_start: int = None
    text_end: int = None


class PhonemizedSegment(ResponseModel):
    index: int
    text: str = Field(description="the normalised text")
    phonemes: str = Field(description="what the acoustic model is given")
    ipa: str
    pause_ms: int
    voice: str = Field(None, description="the segment's voice (SSML `<voice>`)")
    speed: float = Field(None, description="the segment's speed (SSML `<prosody "
                                                   "rate>`)")
    words: list[PhonemizedWord]


class Phonemized(ResponseModel):
    voice: str
    alphabet: Literal["ipa", "misaki", "espeak"] = Field(
        description="what `phonemes` are written in: `ipa` (a Piper voice), `misaki` (hibari: "
                    "IPA with `A I O W Y` for its diphthongs, its vocab.json), `espeak`")
    segments: list[PhonemizedSegment]


class Cue(ResponseModel):
    start: float
    end: float
    text: str


class Captions(ResponseModel):
    job_id: str
    state: JobState = None
    complete: bool = Field(None, description="false while the job renders: the words "
                                   "of the chunks stored so far")
    audio_seconds: float = None
    words: list[Word]
    cues: list[Cue] = Field(description="the words grouped as the SRT and VTT captions group "
                                        "them")


class Voice(ResponseModel):
    name: str
    engine: Annotated[str, OneOf((PIPER, HIBARI, ESPEAK))]
    language: str
    display_name: str = None
    variant: str | None = None
    sample_rate: int
    speakers: list[str] = Field(description="a multi-speaker voice's speakers, addressed as "
                                            "NAME:SPEAKER")


class Voices(ResponseModel):
    default: str = None
    voices: list[Voice] = Field(description="every voice name `voice` accepts")


class QueueStats(ResponseModel):
    depth: int
    workers: int = Field(description="live workers consuming it")
    pool: str


class Stats(ResponseModel):
    mel_cache: dict[str, Any]
    queues: dict[str, QueueStats] = Field(description="every queue, batch and book included")


class CanaryRequest(RequestModel):
    """A candidate version of a Piper voice (docs/models.md, "Voice versions and the
    canary"): another voice file, other inference settings, or both."""

    file: str = Field("", description="a Piper .onnx on the workers' disk (its .onnx.json "
                      "beside it); empty: the voice's own file")
    noise_scale: Annotated[float, Range(*INFERENCE_RANGES["noise_scale"])] | None = None
    length_scale: Annotated[float, Range(*INFERENCE_RANGES["length_scale"])] | None = None
    noise_w: Annotated[float, Range(*INFERENCE_RANGES["noise_w"])] | None = None
    share: Annotated[float, Range(0.0, 1.0)] | None = Field(
        None, description="share of new interactive jobs (default VOXFARM_CANARY_SHARE)")
    note: str = ""
    null_is_unset: ClassVar = frozenset({"noise_scale", "length_scale", "noise_w", "share"})


class VoiceVersion(ResponseModel):
    id: str
    state: Literal["live", "candidate", "retired"]
    file: str = Field(description="empty: the voice's own file")
    inference: dict[str, float] = Field(description="overrides of the voice config's")
    created_at: str
    note: str = ""


class CanaryDecision(ResponseModel):
    ts: str
    action: Literal["start", "promote", "rollback"]
    by: Literal["rule", "operator"]
    candidate: str
    live: str
    reasons: list[str]
    figures: dict[str, Any] = Field(description="both versions' figures when it was taken")


class VoiceVersions(ResponseModel):
    voice: str
    live: str = Field(description="empty: the voice has no versions and renders as offered")
    candidate: str
    share: float
    versions: list[VoiceVersion]
    figures: dict[str, Any] = Field(description="the live and candidate versions' figures")
    decisions: list[CanaryDecision] = Field(description="the last decisions, oldest first")


class Health(ResponseModel):
    status: Literal["ok"]


class Ready(ResponseModel):
    ready: bool
    workers: dict[str, Any] = None
    warnings: list[Any] = None


class NotReady(ResponseModel):
    ready: Literal[False]
    missing: list[Any] = None


class Model(ResponseModel):
    """An OpenAI model entry; every one is the farm's engine."""

    id: Annotated[str, OneOf(OPENAI_MODELS)]
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(ResponseModel):
    object: Literal["list"]
    data: list[Model]


class SpeechVoices(ResponseModel):
    voices: list[str] = Field(description="OpenAI's voice names, then the farm's voices "
                                          "(details in `GET /v1/voices`)")


class Timestamp(ResponseModel):
    word: str
    start_time: float
    end_time: float


class CaptionedSpeech(ResponseModel):
    audio: str = Field(json_schema_extra={"contentEncoding": "base64"})
    audio_format: Annotated[str, OneOf(tuple(RESPONSE_FORMATS))]
    timestamps: list[Timestamp]


class BookChapter(ResponseModel):
    index: int
    title: str
    segments: Progress
    audio: str = None


class BookError(ResponseModel):
    message: str
    chapter: int | None = None
    text: str | None = None


class Book(ResponseModel):
    id: str
    state: BookState
    title: str = None
    author: str = None
    voice: str = None
    speed: float = None
    formats: list[str] = None
    words: int = None
    segments: Progress
    chapters: list[BookChapter]
    audio_seconds: float = None
    throughput: float | None = Field(None, description="audio seconds rendered per second "
                                                       "of rendering (x real time)")
    eta_s: float | None = None
    duration_s: float | None = None
    error: BookError | None = None
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    links: dict[str, str]


class Manifest(ResponseModel):
    chapters: list[dict[str, Any]]


# -- the WebSocket's frames (the same field models as REST) ----------------------------------


class SocketReady(ResponseModel):
    type: Literal["ready"]
    sample_rate: int = Field(description="the default voice's; each `job.started` says its "
                                         "job's")
    encoding: Literal["pcm_s16le"]
    channels: Literal[1]
    voice: str
    max_message_bytes: int


class SocketJobStarted(ResponseModel):
    type: Literal["job.started"]
    job_id: str
    segments: int
    sample_rate: int = Field(description="the rate of this job's PCM frames (its voice's)")
    text: str


class SocketSegmentStarted(ResponseModel):
    """Frames one chunk: this event, its binary PCM frames, then `segment.done`."""

    type: Literal["segment.started"]
    job_id: str
    index: int
    segment: int
    window: int
    samples: int
    duration_s: float
    start_s: float | None
    words: list[Word]


class SocketSegmentDone(ResponseModel):
    type: Literal["segment.done"]
    job_id: str
    index: int


class SocketJobDone(ResponseModel):
    type: Literal["job.done"]
    job_id: str
    audio_seconds: float | None


class SocketFlushed(ResponseModel):
    type: Literal["flushed"]


class SocketError(Error):
    type: Literal["error"]
    job_id: str = None


SOCKET_EVENTS = (SocketReady, SocketJobStarted, SocketSegmentStarted, SocketSegmentDone,
                 SocketJobDone, SocketFlushed, SocketError)
