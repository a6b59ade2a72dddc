"""`WS /v1/ws`: text in as it is written, audio out as it renders.

Protocol (the README, "WS /v1/ws" has it with examples). Client -> server, JSON text frames:

    {"text": "Hello there. How", "voice": "en-us", "speed": 1.0}   text, appended
    {"text": " are you?"}                                          more text
    {"flush": true}                                                speak what is left
    {"lexicon": {"Nguyen": "ŋwˈɪn"}}                               words said as given, from now

Text is spoken sentence by sentence: as soon as the buffer holds a finished sentence, that
part is submitted as a job; `flush` submits the rest. A change of voice or speed submits the
text buffered under the old ones first. Server -> client:

    {"type": "ready", "sample_rate", "encoding": "pcm_s16le", "channels": 1, ...}
    {"type": "job.started", "job_id", "segments", "sample_rate", "text"}
    {"type": "segment.started", "job_id", "index", "segment", "window", "samples",
     "duration_s", "start_s", "words": [{"word", "start", "end"}, ...]}
    <binary frames: that chunk's 16-bit little-endian PCM>
    {"type": "segment.done", "job_id", "index"}

A pair of segment events frames each chunk: one window of a segment's audio (`index` is
the chunk's place in the job, as in the long-poll), sent as soon as the vocoder has it, with
the words that start in it (times in seconds on the job's timeline, like `start_s`).
    {"type": "job.done", "job_id", "audio_seconds"}
    {"type": "flushed"}            every job submitted before the flush has been sent
    {"type": "error", "error": {"code", "message", "field"?}, "job_id"?}

A bad message gets an error event and the socket stays open. A message past the hard size
limit closes it with 1009 (Message Too Big) before it is read into memory in full. When the
client goes away, every job it started that is still rendering is canceled. The socket's jobs
are listened to (app/stores/listeners.py): from its submission to its end each holds a listener
lease, so a web process that dies with the socket open leaves nothing rendering for long.

The API key of the handshake is checked again before each message is handled and at least
every KEY_CHECK_S while the socket is open: once it is revoked, the socket gets an
`unauthorized` error event and closes with 1008 (Policy Violation), and its jobs are
canceled. Each job the socket submits counts against the key's requests a minute, as an
HTTP request does (past it: a `rate_limited` error event, nothing submitted).

One greenlet per socket: while a job streams, client messages are read between short waits
on the job's event stream, so both directions stay responsive without a thread per socket.

In a zone (app/zones/), a job this farm cannot take (its store away or full, overloaded, no
live interactive worker) is rendered by a ready peer and relayed (web/ws_relay.py): the
client sees the same events and frames. While the store is away the socket opens without a
place among its key's sockets and its key is looked at again once the store answers.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import deque
from typing import get_args

import redis
from flask import Blueprint, current_app, g, request
from flask_sock import Sock
from kombu.exceptions import OperationalError
from simple_websocket import ConnectionClosed

from app.farm import Farm
from app.security.addresses import counted_as
from app.security.apikeys import ApiKey
from app.stores.job_record import JobRecord
from app.stores.states import JOB_FINAL
from app.stores.waits import WaitPlaces
from models.voices import get_voice
from web import apidoc as doc
from web.auth import check_still_live, count_request, current_key
from web.errors import ApiError
from web.helpers import check_unicode, farm, lexicon_or_422, load_json, parse, voice_or_422
from web.schemas import responses
from web.schemas.requests import SocketMessage
from web.synthesis import ChunkFollower, submit_text
from web.ws_relay import (
    PeerFollower,
    PeerJob,
    cancel_at_peer,
    job_body,
    refusal_reason,
    submit_to_peer,
)
from web.zones import early_reason

log = logging.getLogger("voxfarm.web")

ws_bp = Blueprint("ws", __name__)
sock = Sock()

# A text frame larger than this gets a `message_too_large` error event; past the hard limit
# the socket itself refuses it (close code 1009).
MAX_MESSAGE_BYTES = 128 * 1024
HARD_MESSAGE_BYTES = 1024 * 1024
# Binary frames carry at most this much audio, so a long segment arrives as several frames.
AUDIO_FRAME_BYTES = 32 * 1024
# The reason (`error`) of a socket's job canceled because the socket closed before its end.
SOCKET_CLOSED = "canceled: its WebSocket closed before the audio was sent"
# While a job streams, the socket looks for client messages at least this often.
READ_EVERY_S = 0.2
PING_INTERVAL_S = 25
# An open socket looks at its API key again at least this often (and before every message):
# a revoked key's socket closes within this long, idle or streaming.
KEY_CHECK_S = 2.0
# A finished sentence: end punctuation (Latin or CJK) and then whitespace, or CJK end
# punctuation alone (Chinese puts no space after it).
_SENTENCE_BOUNDARY = re.compile(r"[.!?…][\"'”’)\]]*\s+|[。！？；][\"'”’」』）)]*")


# How long a client refused a socket (too many open) is asked to wait before it tries again.
SOCKET_RETRY_AFTER_S = 5


@ws_bp.record_once
def _configure(state) -> None:
    state.app.config.setdefault("SOCK_SERVER_OPTIONS", {
        "max_message_size": HARD_MESSAGE_BYTES, "ping_interval": PING_INTERVAL_S})


# Each event's response model (web/schemas/responses.py), by its `type`: an event leaves as
# the document says, or fails loudly.
_EVENT_MODELS = {get_args(m.model_fields["type"].annotation)[0]: m
                 for m in responses.SOCKET_EVENTS}


def error_event(err: ApiError, **extra) -> dict:
    return {"type": "error", **err.body(), **extra}


class Session:
    """One socket's state: the text buffer, the jobs in order, the job being sent."""

    def __init__(self, ws, farm: Farm, key: ApiKey | None = None) -> None:
        self.ws = ws
        self.farm = farm
        self.buffer = ""
        self.voice = farm.settings.default_voice
        self.speed = 1.0
        self.lexicon: dict[str, str] | None = None
        self.jobs: deque[JobRecord | PeerJob] = deque()  # submitted, not yet sent
        self.current: ChunkFollower | PeerFollower | None = None
        self.started: list[str] = []  # every job id this socket submitted here
        self.at_peers: dict[str, PeerJob] = {}  # its jobs peers render, until they end
        self.flush_marks: deque[int] = deque()  # jobs left to send before each "flushed"
        self.sent_jobs = 0
        self.key = key  # the handshake's; None while the farm is open
        self.tenant = key.id if key else ""  # whom a peer renders the socket's jobs for
        self.key_checked = time.monotonic()

    # -- sending -----------------------------------------------------------------------------

    def send(self, event: dict) -> None:
        self.ws.send(json.dumps(_EVENT_MODELS[event["type"]].answer(**event)))

    def send_error(self, err: ApiError, **extra) -> None:
        self.send(error_event(err, **extra))

    # -- client messages ---------------------------------------------------------------------

    def handle(self, raw) -> None:
        if isinstance(raw, bytes | bytearray):
            raise ApiError(400, "binary_not_supported",
                           "send JSON text frames; binary frames are for audio from the server")
        if len(raw.encode()) > MAX_MESSAGE_BYTES:
            raise ApiError(413, "message_too_large",
                           f"a message may have at most {MAX_MESSAGE_BYTES} bytes",
                           limit=MAX_MESSAGE_BYTES)
        msg = load_json(raw, self.farm.settings.max_json_depth, "the message")
        if not isinstance(msg, dict):
            raise ApiError(400, "invalid_json", "the message must be a JSON object")
        message = parse(SocketMessage, check_unicode(msg), self.farm.settings)
        given = message.model_fields_set
        voice = self.voice if message.voice is None else voice_or_422(message.voice).name
        speed = self.speed if message.speed is None else message.speed
        lexicon = self.lexicon
        if "lexicon" in given or (lexicon and voice != self.voice):
            # A lexicon is in one voice's alphabet: checked again when the voice changes.
            lexicon = lexicon_or_422(message.lexicon if "lexicon" in given else lexicon,
                                     voice_or_422(voice)) or None
        text, flush = message.text, message.flush
        limit = self.farm.settings.max_text_chars
        switch = (voice, speed, lexicon) != (self.voice, self.speed, self.lexicon)
        if (0 if switch else len(self.buffer)) + len(text) > limit:
            raise ApiError(413, "text_too_long", f"more than {limit} characters are waiting "
                           "to be spoken; send a flush or shorter text", field="text",
                           limit=limit)
        if switch:
            pending, self.buffer = self.buffer, ""
            self.submit(pending)  # text so far keeps the voice it was written for
            self.voice, self.speed, self.lexicon = voice, speed, lexicon
        self.buffer += text
        if flush:
            text, self.buffer = self.buffer, ""
            self.submit(text)
            self.flush_marks.append(self.sent_jobs + len(self.jobs) + (1 if self.current else 0))
        else:
            self.submit_sentences()
        self.maybe_flushed()

    def submit_sentences(self) -> None:
        ends = [m.end() for m in _SENTENCE_BOUNDARY.finditer(self.buffer)]
        if ends:
            ready, self.buffer = self.buffer[: ends[-1]], self.buffer[ends[-1]:]
            self.submit(ready)

    def submit(self, text: str) -> None:
        if not text.strip():
            return
        try:
            job = self.submit_somewhere(text)
        except ApiError as err:
            if err.code == "no_speakable_text":
                return  # punctuation or a pause tag alone: nothing to say, nothing wrong
            raise
        if isinstance(job, PeerJob):
            self.at_peers[job.id] = job
        else:
            self.started.append(job.id)
            self.farm.listeners.hold(job.id)  # until its audio is sent, or the socket closes
        self.jobs.append(job)
        self.send({"type": "job.started", "job_id": job.id, "segments": job.total,
                   "sample_rate": job.sample_rate, "text": text})

    def submit_somewhere(self, text: str) -> JobRecord | PeerJob:
        """The job, submitted here, or at a peer when this farm cannot take it (the reasons
        web/ws_relay.py gives); this farm's refusal stands when no peer takes it."""
        body = job_body(text, self.voice, self.speed, self.lexicon)
        rate = get_voice(self.voice).sample_rate
        try:
            count_request(self.farm.apikeys, self.key)  # each job counts, as a request does
            early = early_reason(self.farm)
            job = submit_to_peer(self.farm, early, False, body, self.tenant, rate) if early \
                else None
            return job or submit_text(self.farm, text, self.voice, self.speed, "wav",
                                      entry="websocket", lexicon=self.lexicon, listened=True)
        except (ApiError, redis.RedisError, OperationalError) as exc:
            why = refusal_reason(self.farm, exc)
            job = (submit_to_peer(self.farm, why[0], why[1], body, self.tenant, rate) if why
                   else None)
            if job is None:
                raise
            return job

    # -- audio -------------------------------------------------------------------------------

    def step(self) -> None:
        """Send what the current job has ready; move on when it ends."""
        if self.current is None:
            job = self.jobs.popleft()
            self.current = (PeerFollower(self.farm, job, self.tenant) if isinstance(job, PeerJob)
                            else ChunkFollower(self.farm, job.id))
        follower = self.current
        for chunk in follower.poll(READ_EVERY_S):
            samples = len(chunk.pcm) // 2
            self.send({"type": "segment.started", "job_id": follower.job_id,
                       "index": chunk.index, "segment": chunk.segment,
                       "window": chunk.window, "samples": samples,
                       "duration_s": round(samples / follower.sample_rate, 3),
                       "start_s": chunk.start_s, "words": chunk.words})
            for start in range(0, len(chunk.pcm), AUDIO_FRAME_BYTES):
                self.ws.send(bytes(chunk.pcm[start:start + AUDIO_FRAME_BYTES]))
            self.send({"type": "segment.done", "job_id": follower.job_id, "index": chunk.index})
        if follower.ended:
            self.current = None
            at_peer = self.at_peers.pop(follower.job_id, None)
            if at_peer is None:
                self.farm.listeners.release(follower.job_id)
            self.sent_jobs += 1
            if follower.outcome == "done":
                self.send({"type": "job.done", "job_id": follower.job_id,
                           "audio_seconds": self.audio_seconds(follower)})
            else:
                if follower.outcome == "stalled":
                    if at_peer is None:
                        self.farm.jobs.cancel(follower.job_id)
                    else:
                        cancel_at_peer(self.farm, at_peer, self.tenant)
                self.send_error(ApiError(409, f"job_{follower.outcome}",
                                         f"the job ended early: {follower.outcome}"),
                                job_id=follower.job_id)
            self.maybe_flushed()

    def audio_seconds(self, follower: ChunkFollower | PeerFollower) -> float | None:
        if isinstance(follower, PeerFollower):
            return follower.audio_seconds()
        record = self.farm.jobs.get(follower.job_id)
        return record.audio_seconds if record else None

    def maybe_flushed(self) -> None:
        while self.flush_marks and self.sent_jobs >= self.flush_marks[0]:
            self.flush_marks.popleft()
            self.send({"type": "flushed"})

    @property
    def busy(self) -> bool:
        return self.current is not None or bool(self.jobs)

    def check_key(self) -> None:
        """Raise KeyRevoked once the handshake's key is no longer live."""
        try:
            check_still_live(self.farm.apikeys, self.key)
        except ApiError as err:
            raise KeyRevoked(err) from None
        except redis.RedisError:
            # The store is away: where peers render the socket's jobs the key is looked at
            # again once it answers (no farm can tell a revocation meanwhile); alone, the
            # socket closes as on any store failure.
            if self.farm.peers is None:
                raise
            self.farm.peers.note_local_failure()
        self.key_checked = time.monotonic()

    def cleanup(self) -> None:
        # The peers' jobs first: their cancels need nothing of this farm's store.
        for job in self.at_peers.values():
            cancel_at_peer(self.farm, job, self.tenant)
        # Let go first: that needs no Redis, and a lease not renewed lapses into a cancel.
        for job_id in [*(j.id for j in self.jobs), *([self.current.job_id]
                                                        if self.current else [])]:
            if job_id not in self.at_peers:
                self.farm.listeners.release(job_id)
        for job_id in self.started:
            if self.farm.jobs.state(job_id) not in JOB_FINAL:
                self.farm.jobs.cancel(job_id, SOCKET_CLOSED)

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        # The default voice's rate; every job.started says its own (voices differ).
        rate = get_voice(self.voice).sample_rate
        self.send({"type": "ready", "sample_rate": rate, "encoding": "pcm_s16le",
                   "channels": 1, "voice": self.voice, "max_message_bytes": MAX_MESSAGE_BYTES})
        while True:
            # Busy: take what the client sent meanwhile without waiting; idle: wait for it
            # (up to the next look at the key).
            raw = self.ws.receive(timeout=0 if self.busy else KEY_CHECK_S)
            while raw is not None:
                self.check_key()
                try:
                    self.handle(raw)
                except ApiError as err:
                    self.send_error(err)
                raw = self.ws.receive(timeout=0)
            if not self.ws.connected:
                return
            if time.monotonic() - self.key_checked >= KEY_CHECK_S:
                self.check_key()
            if self.busy:
                self.step()


def socket_places(f: Farm) -> WaitPlaces:
    """This process's count of open WebSockets per holder (in Redis, across processes)."""
    places = current_app.extensions.get("voxfarm.socket_places")
    if places is None:
        places = WaitPlaces(f.redis, f.keys, f.settings.web_max_sockets_per_key)
        current_app.extensions["voxfarm.socket_places"] = places
    return places


@ws_bp.before_request
def _take_socket_place() -> None:
    """Before the handshake (so a refusal is a plain HTTP 429 in the one error shape): one
    of the key's `web_max_sockets_per_key` places, or the client address's while the farm
    has no keys. Each socket holds a greenlet and a connection for its whole life, so one key
    cannot take them all; the place is given back when the socket ends (teardown)."""
    f = farm()
    key = current_key()
    holder = f"ws:key:{key.id}" if key else f"ws:addr:{counted_as(request.remote_addr or '')}"
    try:
        place = socket_places(f).take(holder)
    except redis.RedisError:
        if f.peers is None or not f.peers.ready():
            raise
        # The places are counted in the store, which is away: a peer renders this socket's
        # jobs, so it opens without one rather than not at all.
        f.peers.note_local_failure()
        log.warning("socket opens without a place: the store is unreachable")
        return
    if place is None:
        cap = f.settings.web_max_sockets_per_key
        raise ApiError(429, "too_many_sockets",
                       f"{'this API key' if key else 'this address'} has {cap} WebSockets "
                       "open already, the most it may; close one, or try again later",
                       headers={"Retry-After": SOCKET_RETRY_AFTER_S},
                       retry_after=SOCKET_RETRY_AFTER_S, limit=cap)
    g.voxfarm_socket_place = place


@ws_bp.teardown_request
def _give_socket_place(_exc) -> None:
    place = g.pop("voxfarm_socket_place", None)
    if place is not None:
        place.release()


# The socket's path: flask-sock registers its rule, the document its operation.
WS_PATH = "/v1/ws"


@sock.route(WS_PATH, bp=ws_bp)
@doc.documents(WS_PATH, "get", doc.op(
    "streaming", "websocket", "WebSocket: text in as it is written, PCM frames and events out", {
        "101": {"description": "switching protocols: the socket is open"},
        "400": doc.error("not a WebSocket upgrade request"),
        "429": doc.error("the key (with keys off: the client address) already has its most "
                         "WebSockets open (`too_many_sockets`, with `limit`), or the key's "
                         "requests a minute or its work running at once (`rate_limited`, "
                         "`too_many_jobs`)", doc.RETRY_AFTER)},
    description=(
        "Upgrade with `GET /v1/ws` (`Connection: Upgrade`, `Upgrade: websocket`). Client "
        "messages are JSON text frames, `SocketMessage` (the same fields as a job's); the "
        "server sends JSON events (" + ", ".join(f"`{m.__name__}`" for m in
                                                 responses.SOCKET_EVENTS)
        + " in the schemas) and, between `segment.started` and `segment.done`, binary frames "
        "of 16-bit little-endian mono PCM at the job's `sample_rate` (its voice's). See the "
        "README.")))
def websocket(ws) -> None:
    serve(ws, farm(), current_key())


def serve(ws, f: Farm, key: ApiKey | None = None) -> None:
    """One socket's session, however it ends; nothing escapes to the server. `key`: the
    API key of the handshake (None while the farm is open)."""
    session = Session(ws, f, key)
    try:
        session.run()
    except ConnectionClosed:
        pass
    except KeyRevoked as revoked:
        _close_with(ws, revoked.error, 1008)
    except OSError as exc:
        # The client stopped reading (a send timed out) or vanished (reset, broken pipe):
        # an ordinary end of a socket, not a server fault.
        log.info("socket dropped: the client stopped reading or went away (%s)",
                 exc.__class__.__name__)
    except redis.RedisError as exc:
        log.warning("socket closed, Redis unavailable: %s", exc)
        _close_with(ws, ApiError(503, "redis_unavailable",
                                 "the job store is unreachable; try again shortly"))
    except Exception:
        log.exception("socket closed by an unexpected error")
        _close_with(ws, ApiError(500, "internal_error", "an unexpected error occurred"))
    finally:
        try:
            session.cleanup()
        except Exception:  # Redis gone as well: the jobs expire with their TTL
            log.warning("could not cancel the jobs of a closed socket", exc_info=True)


class KeyRevoked(Exception):
    """The socket's API key is no longer live: the socket closes (1008)."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


def _close_with(ws, err: ApiError, code: int = 1011) -> None:
    """Last words on a socket that cannot go on: the error event, then close with `code`
    (1011 Internal Error by default)."""
    try:
        ws.send(json.dumps(error_event(err)))
        ws.close(reason=code, message=err.code)
    except (ConnectionClosed, OSError):  # the client is gone already
        pass
