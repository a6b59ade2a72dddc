"""The response models: every JSON answer of the API and every event of the socket, declared
once for the document and the view (`Model.answer(...)` answers what the document says, or
fails loudly). States come from `app.stores.states`, never restated.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.stores.states import BookState, JobState
from app.zones.peers import PeerStatus, Serving
from models.voices import ENGINE_NAMES
from web.schemas.constants import OPENAI_MODELS, RESPONSE_FORMATS, VOICE_KINDS
from web.schemas.fields import OneOf


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
    suggestions: list[str] = Field(None, description="an unknown voice: the closest names")


class Error(ResponseModel):
    """The one error body of the whole API."""

    error: ErrorDetail


class Progress(ResponseModel):
    done: int = Field(ge=0)
    total: int = Field(ge=0)


class JobProgress(ResponseModel):
    """A job's segments: `total` is open (-1) while the web still segments the job's text;
    its segments are queued as they come, and the count is known once the last one is."""

    done: int = Field(ge=0)
    total: int = Field(ge=-1, description="the job's segment count; -1 while its text is "
                                          "still being segmented")


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
    segments: JobProgress
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
    segments: int = Field(None, ge=-1, description="the job's segment count; -1 while its "
                                                   "text is still being segmented")
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
    """A voice `voice` accepts: one the farm offers, or a custom voice (a name for a voice
    spec: `spec`, `version`, `scope` and what it was made of)."""

    name: str
    engine: Annotated[str, OneOf(ENGINE_NAMES)]
    language: str
    display_name: str = None
    variant: str | None = None
    sample_rate: int
    speakers: list[str] = Field(description="a multi-speaker voice's speakers, addressed as "
                                            "NAME:SPEAKER")
    gender: str = Field(description="`female`, `male`, or empty where nobody said")
    kind: Annotated[str, OneOf(VOICE_KINDS)] = Field(
        description="`model`: as installed; `shaped`: a base voice shaped; `mix`: a weighted "
                    "mix of style voices of one model")
    rate: float = Field(description="its speed factor (1: the model's own)")
    custom: bool = Field(description="a custom voice (`POST /v1/voices`)")
    spec: str = Field(None, description="custom voices: what it renders as (a job carries "
                                        "this)")
    version: str = Field(None, description="custom voices: the newest version's id")
    base: str | None = Field(None, description="custom voices: the voice shaped (None for "
                                               "a mix)")
    mix: dict[str, float] | None = Field(None, description="custom voices: a mix's parts "
                                                           "and weights")
    pitch: float = Field(None, description="custom voices: semitones")
    formant: float = Field(None, description="custom voices: the envelope's frequency ratio")
    scope: Literal["key", "public", "shared"] = Field(
        None, description="custom voices: the calling key's own, every key's (an admin "
                          "published it), or with keys off everyone's")


class CustomVoiceVersion(ResponseModel):
    version: str
    spec: str
    created_at: str
    base: str | None = None
    mix: dict[str, float] | None = None
    pitch: float
    formant: float
    rate: float
    language: str


class CustomVoice(Voice):
    """A voice by name: a custom voice has its versions, oldest first (`NAME@2` names the
    second; the name alone, the newest)."""

    versions: list[CustomVoiceVersion] = Field(None, description="custom voices only")


class Voices(ResponseModel):
    default: str = None
    voices: list[Voice] = Field(description="every voice name `voice` accepts (but OpenAI's "
                                            "names), ordered by language, then quality "
                                            "(neural first), then name; custom voices too")


class QueueStats(ResponseModel):
    depth: int
    workers: int = Field(description="live workers consuming it")
    pool: str


class PeerInfo(ResponseModel):
    """A peer farm as this web process's probes last found it (app/zones/peers.py)."""

    name: str
    url: str
    state: PeerStatus = Field(description="`ready`: its /readyz said it serves locally; "
                              "`not_ready`: it answered otherwise; `unreachable`: no answer "
                              "in time (or a request sent to it got none); `unknown`: not "
                              "probed yet. Only ready peers are sent work")
    since: float = Field(description="Unix time the state began")
    checked_at: float = Field(description="Unix time of the last probe (0: none yet)")
    failures: int = Field(description="probes or requests in a row that did not find it ready")
    room: bool = Field(description="its last /readyz said it has room for interactive work")
    store: bool = Field(description="its last /readyz said its store answers: reads of the "
                        "jobs and books it owns are sent to it, ready pools or not")
    detail: str = Field(description="why it is not ready")


class Zone(ResponseModel):
    farm: str = Field(description="this farm's name (VOXFARM_FARM_NAME)")
    serving: Serving = Field(description="who serves this farm's clients now: `local`, a "
                             "`peer` (this farm's own store or pools being down), or `none`")
    through: str | None = Field(description="the peer that serves them, when `serving` is "
                                "`peer`")
    peers: list[PeerInfo]


class Stats(ResponseModel):
    scope: Literal["farm", "key"] = Field(description="`farm`: the whole farm's figures (no "
                                          "keys, or an admin key); `key`: the calling key's "
                                          "own jobs only")
    mel_cache: dict[str, Any]
    queues: dict[str, QueueStats] = Field(None, description="every queue, batch and book "
                                          "included (scope `farm` only)")
    peers: list[PeerInfo] = Field(None, description="the peer farms and their states "
                                  "(scope `farm`, a farm with peers only)")


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


_LOCAL_READY = ("this farm's own readiness: its store reachable and a live worker on every "
                "interactive pool (`ready` is true without it when a peer serves)")
_ROOM = ("ready locally, and admission would take an interactive job now (peers send their "
         "overflow where there is room)")
_ZONE = "with a farm name (VOXFARM_FARM_NAME): who serves, and the peers' states"


class Ready(ResponseModel):
    ready: bool
    workers: dict[str, Any] = None
    warnings: list[Any] = None
    local_ready: bool = Field(None, description=_LOCAL_READY)
    room: bool = Field(None, description=_ROOM)
    zone: Zone = Field(None, description=_ZONE)


class NotReady(ResponseModel):
    ready: Literal[False]
    missing: list[Any] = None
    local_ready: bool = Field(None, description=_LOCAL_READY)
    room: bool = Field(None, description=_ROOM)
    zone: Zone = Field(None, description=_ZONE)


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


class BookPackaging(ResponseModel):
    chapters_done: int = Field(description="chapters encoded in every format asked for")
    chapters_total: int
    eta_s: float | None = Field(None, description="seconds left while assembling, at the "
                                                  "pace chapters were encoded so far")


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
    packaging: BookPackaging | None = None
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
