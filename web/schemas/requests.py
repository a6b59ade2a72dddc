"""The request models: every body, query string and socket message the API takes.

They validate as JSON types (strict: a string is no number, null is no string); a refusal
leaves as the API's one error shape (`web.helpers.parse`), and each model writes its part of
`/openapi.json` (web/openapi.py).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from app.stores.books import DEFAULT_FORMATS
from models.books.parse import EXTENSIONS as BOOK_EXTENSIONS
from models.neural.voice_file import INFERENCE_RANGES  # what a voice version may override
from models.text.captions import CAPTION_FORMATS
from models.voices import ENGINE_NAMES
from web.schemas.constants import (
    BOOK_AUDIO_TYPES,
    BOOK_CAPTION_FORMATS,
    JOB_STREAM_FORMATS,
    MAX_CHUNKS_PER_POLL,
    OPENAI_VOICES,
    RESPONSE_FORMATS,
    STREAM_FORMATS,
    VOICE_GENDERS,
    VOICE_KINDS,
)
from web.schemas.document import refusal
from web.schemas.fields import (
    AudioFormat,
    BookFormats,
    Lexicon,
    Name,
    OneOf,
    OpenAISpeed,
    Phonemes,
    QueryInt,
    Range,
    Speed,
    SpokenText,
    StreamedFormat,
    TextType,
    VoiceName,
)


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
                   Field(description="chunks per answer, at most (fewer past the farm's bound on "
                                     "an answer's audio bytes, MAX_CHUNK_BYTES_PER_ANSWER; "
                                     "never none)")] = MAX_CHUNKS_PER_POLL


class AudioQuery(RequestModel):
    format: AudioFormat = Field(None, description="the job's `format` unless given")


class CaptionsQuery(RequestModel):
    format: Annotated[str, OneOf(CAPTION_FORMATS)] = "json"


class StreamQuery(RequestModel):
    format: Annotated[str, StreamedFormat(JOB_STREAM_FORMATS, fold_case=True)] = "wav"


class SpeechRequest(RequestModel):
    """OpenAI's speech request."""

    model: Name = Field(description="any name (`tts-1`, `tts-1-hd`, ...); accepted, not used: "
                                    "the farm has one engine")
    input: SpokenText
    voice: Name = Field(description="an OpenAI voice name (" + ", ".join(OPENAI_VOICES) +
                                    ": each a distinct farm voice, alloy the default one, "
                                    "unless `openai_voices` maps it) or a farm voice from "
                                    "`GET /v1/voices`")
    response_format: Annotated[str, StreamedFormat(tuple(RESPONSE_FORMATS))] = "mp3"
    speed: OpenAISpeed = 1.0
    stream_format: Annotated[str, OneOf(STREAM_FORMATS)] = Field(
        "audio", description="`audio`: the bytes of `response_format`; `sse`: the same bytes "
                             "base64-encoded in `speech.audio.delta` events, then one "
                             "`speech.audio.done`")
    instructions: str | None = Field(None, description="accepted and not used: the voices "
                                                       "have no style control")
    stream: bool = Field(True, description="Kokoro-FastAPI's: `true` (OpenAI's way) streams "
                         "the body as the job renders, so a `wav` declares an open length; "
                         "`false` answers the whole file once the job is done, with its "
                         "`Content-Length` and a `wav` header that states its length")
    # OpenAI's clients send null for "not given"; "" too for the formats.
    null_is_unset: ClassVar = frozenset({"model", "input", "speed", "response_format",
                                         "stream_format", "stream"})

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


def _form_number(raw: object) -> object:
    """A multipart form's number (a string), as JSON would have it."""
    if isinstance(raw, str):
        try:
            return float(raw)
        except ValueError:
            raise refusal("invalid_type", "'speed' must be a number") from None
    return raw


def _chapters(value: object) -> object:
    if not isinstance(value, list) or not value:
        raise refusal("missing_field", "'chapters' must be a non-empty list of "
                      "{\"title\", \"text\"}")
    return value


class BookFields(RequestModel):
    voice: VoiceName = None
    speed: Speed = 1.0
    formats: BookFormats = DEFAULT_FORMATS
    title: str = Field("", description="the book's title in its tags; an upload's own "
                       "(EPUB metadata, a text's opening lines) when left out")
    author: str = Field("", description="the book's author in its tags; an upload's own "
                        "when left out")


class BookRequest(BookFields):
    """A book as JSON chapters."""

    chapters: Annotated[list[Chapter], BeforeValidator(_chapters), Field(min_length=1)]


def _with_file(schema: dict) -> None:
    schema["properties"] = {"file": {"type": "string", "format": "binary",
                                     "description": ", ".join(sorted(BOOK_EXTENSIONS))},
                            **schema["properties"]}
    schema["required"] = ["file"]


def _form_list(raw: object) -> object:
    """A multipart form's list ("m4b,mp3", the field given once or more), as JSON would
    have it."""
    if isinstance(raw, str):
        return [p.strip() for p in raw.split(",") if p.strip()]
    return raw


class BookUpload(BookFields):
    """A book file, multipart; the fields are strings, an empty one is the default."""

    model_config = ConfigDict(json_schema_extra=_with_file)
    speed: Annotated[Speed, BeforeValidator(_form_number)] = 1.0
    formats: Annotated[BookFormats, BeforeValidator(_form_list)] = DEFAULT_FORMATS


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


class CanaryRequest(RequestModel):
    """A candidate version of a Piper or Kokoro voice (docs/models.md, "Voice versions and
    the canary"): another voice file, other inference settings (Piper's), or both."""

    file: str = Field("", description="a voice file in the voices directory "
                      "(VOXFARM_VOICES_DIR, on the workers' disk too): a Piper .onnx with its "
                      ".onnx.json beside it, or a Kokoro style pack (.npy/.pt of 510x1x256, "
                      "or .npz), by name or path; empty: the voice's own file")
    noise_scale: Annotated[float, Range(*INFERENCE_RANGES["noise_scale"])] | None = None
    length_scale: Annotated[float, Range(*INFERENCE_RANGES["length_scale"])] | None = None
    noise_w: Annotated[float, Range(*INFERENCE_RANGES["noise_w"])] | None = None
    share: Annotated[float, Range(0.0, 1.0)] | None = Field(
        None, description="share of new interactive jobs (default VOXFARM_CANARY_SHARE)")
    note: str = ""
    null_is_unset: ClassVar = frozenset({"noise_scale", "length_scale", "noise_w", "share"})


class VoiceShaping(RequestModel):
    """A custom voice's definition: a `base` voice shaped, or a `mix` of style voices of one
    model (shaped too, if asked). The ranges and what each engine can apply are the voice
    spec's (docs/models.md, "Voices as data"); a refusal names its field."""

    base: Name = Field(None, description="a voice from `GET /v1/voices` to shape (or `mix`)")
    mix: dict[str, float] = Field(None, description="style voices of one model and their "
                                  "weights (normalised to sum 1): `{\"jf_alpha\": 0.6, "
                                  "\"jm_kumo\": 0.4}`")
    pitch: float = Field(None, description="semitones, -12..12")
    formant: float = Field(None, description="the spectral envelope's frequency ratio, "
                           "0.75..1.33")
    rate: float = Field(None, description="a speed factor, 0.5..2.0")
    language: str = Field(None, description="a frontend language the base's engine speaks "
                          "(default: the base's)")
    null_is_unset: ClassVar = frozenset({"base", "mix", "pitch", "formant", "rate",
                                         "language"})
    model_config = ConfigDict(json_schema_extra={
        "oneOf": [{"required": ["base"]}, {"required": ["mix"]}]})


class CustomVoiceRequest(VoiceShaping):
    name: str = Field(description="lowercase letters, digits, `-`, `_` and `.`, at most 64 "
                      "characters; not a voice's name already", json_schema_extra={
                          "pattern": "^[a-z0-9][a-z0-9._-]{0,63}$"})
    public: bool = Field(False, description="for every API key (an admin key only); "
                         "default: the calling key's own")


class VoicesQuery(RequestModel):
    language: str = Field(None, description="only voices of this frontend language")
    engine: Annotated[str, OneOf(ENGINE_NAMES)] = None
    gender: Annotated[str, OneOf(VOICE_GENDERS)] = None
    kind: Annotated[str, OneOf(VOICE_KINDS)] = None
