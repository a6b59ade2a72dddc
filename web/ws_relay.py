"""The WebSocket's fallback: a socket's job that this farm cannot take, rendered by a peer.

A socket's job goes to a ready peer (app/zones/peers.py) for the reasons an HTTP submission
does (web/zones.py): this farm's store unreachable or full (or its broker not taking the
job), admission refusing it as overloaded while a peer has room, or no live worker on an
interactive queue. The job is submitted at the peer as `POST /v1/jobs` with the socket's
fields, as the socket's tenant (its API key's id, "" while the farm is open), and its chunks
are followed by long-poll (`GET /v1/jobs/<id>/chunks`) and handed to the socket as
`app.stores.job_audio.Chunk`s, like a local job's: the client gets the same events and PCM
frames, with the peer's job id (which names the peer: app/zones/ids.py).

A peer's job has no listener lease (those live in this farm's store): the socket cancels
its peer jobs still running when it closes, and a web that dies with the socket open leaves
the peer to render the job to its end (bounded work; its audio expires with the job).

Concurrency: everything here runs on the socket's greenlet (gevent), the PeerSet's session
shared with the process's other requests (its own pool, safe for that). Every call to a peer
is bounded: the connection by `peer_timeout_s`, each read by the long-poll's wait plus it.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import time
import wave
from dataclasses import dataclass
from typing import Any

from app.farm import Farm
from app.stores.job_audio import Chunk
from app.stores.states import JobState
from app.zones.forward import ForwardReason, PeerUnavailable, open_stream
from app.zones.peers import PeerSet
from web.errors import ApiError
from web.synthesis import CHUNKS_PER_WAIT, STREAM_IDLE_S
from web.zones import refusal_reason as zone_refusal

log = logging.getLogger("voxfarm.web")

JOBS_PATH = "/v1/jobs"
# The long-poll's `wait` at the peer, in whole seconds (the API's `wait` is an int): client
# messages are read between polls, so a message sent while a peer's job streams waits at
# most about this long; shorter would cost the peer a request (and a store read) more often.
PEER_POLL_S = 1
# A peer that answers none of a job's polls for this long ends the job on the socket
# (`job_unavailable`), well before STREAM_IDLE_S: a farm away is not a slow render.
PEER_LOST_S = 15.0
# How long a submission at the peer may take to answer: its frontend runs on the text first
# (the socket's own farm gives a submission no bound either; this one keeps the socket alive).
SUBMIT_READ_S = 30.0
# A peer's answers that refuse this farm itself (its peer credential), not the client.
DOOR_REFUSALS = (401, 403)
# After an answer that brought nothing (the peer away, or its store), the next poll waits
# this long: a refused connection fails at once, and the loop must not spin on it.
RETRY_PAUSE_S = 0.5


@dataclass(frozen=True)
class PeerJob:
    """A socket's job that a peer renders: its id there (the peer's name is its prefix), the
    peer, its segment count as the submission said, and its voice's sample rate."""

    id: str
    peer: str
    total: int
    sample_rate: int


class PeerRefused(ApiError):
    """The peer answered the submission with a refusal of its own: the client's answer."""


def _call(peers: PeerSet, peer: str, method: str, path: str, tenant: str,
          reason: ForwardReason, body: Any = None,
          read_s: float = PEER_POLL_S) -> tuple[int, dict, dict]:
    """`method path` at `peer`: (status, headers, JSON body or {}). PeerUnavailable when the
    peer gives no answer; a body cut short reads as {}."""
    status, headers, stream = open_stream(peers, peer, method, path, tenant, json=body,
                                          timeout=read_s + peers.settings.peer_timeout_s,
                                          reason=reason)
    raw = b"".join(stream)
    try:
        answer = json.loads(raw) if raw else {}
    except ValueError:
        answer = {}
    return status, headers, answer if isinstance(answer, dict) else {}


def job_body(text: str, voice: str, speed: float, lexicon: dict[str, str] | None) -> dict:
    """A socket's job as `POST /v1/jobs` takes it (the socket's audio is PCM from WAV)."""
    body: dict[str, Any] = {"text": text, "voice": voice, "speed": speed, "format": "wav"}
    if lexicon:
        body["lexicon"] = lexicon
    return body


def refusal_reason(f: Farm, exc: Exception) -> tuple[ForwardReason, bool] | None:
    """web/zones.py's `refusal_reason`, except a peer's refusal of this farm itself, which no
    other try of the same kind helps with."""
    return None if isinstance(exc, PeerRefused) else zone_refusal(f, exc)


def submit_to_peer(f: Farm, reason: ForwardReason, need_room: bool, body: dict, tenant: str,
                   sample_rate: int) -> PeerJob | None:
    """The job (`job_body`), submitted at the first ready peer that answers (with
    `need_room`, only at one that said it has room); None when no peer answered.
    PeerRefused when the peer refused it (a bad field, its own limits): that answer is the
    client's. `sample_rate`: the job's voice's, which the socket announces."""
    peers = f.peers
    if peers is None:
        return None
    for peer in peers.ready(need_room=need_room):
        try:
            status, headers, answer = _call(peers, peer.name, "POST", JOBS_PATH, tenant,
                                            reason, body, read_s=SUBMIT_READ_S)
        except PeerUnavailable as exc:  # its breaker is open now: the next peer
            log.warning("socket job: peer %s did not answer (%s): %s", peer.name, reason, exc)
            continue
        if status in DOOR_REFUSALS:
            # The peer refused this farm, not the client (the set's key or certificate does
            # not match): the client must not read it as its own key refused.
            peers.note_failure(peer.name, f"refused this farm's peer credential ({status})")
            log.error("socket job: peer %s refused this farm's credential (%s)", peer.name,
                      status)
            continue
        if status != 202 or not isinstance(answer.get("id"), str):
            raise _refusal(status, headers, answer, peer.name)
        log.info("socket job %s goes to peer %s (%s)", answer["id"], peer.name, reason)
        return PeerJob(answer["id"], peer.name, (answer.get("segments") or {}).get("total", -1),
                       sample_rate)
    return None


def _refusal(status: int, headers: dict, answer: dict, peer: str) -> PeerRefused:
    error = answer.get("error")
    if not isinstance(error, dict):
        error = {}
    extra = {k: v for k, v in error.items() if k not in ("code", "message", "field")}
    retry = headers.get("Retry-After")
    return PeerRefused(status if status >= 400 else 502, str(error.get("code") or "peer_error"),
                       str(error.get("message") or f"farm '{peer}' answered {status}"),
                       field=error.get("field"), headers={"Retry-After": retry} if retry else None,
                       **extra)


def decode_chunk(view: dict) -> tuple[Chunk, int]:
    """A chunk of a long-poll answer (web/api.py, `_chunk_view`: its audio a base64 WAV) as
    the socket sends a local one, and its sample rate."""
    with wave.open(io.BytesIO(base64.b64decode(view["audio"]))) as w:
        pcm, rate = w.readframes(w.getnframes()), w.getframerate()
    return Chunk(index=int(view["index"]), pcm=pcm, segment=int(view.get("segment", 0)),
                 window=int(view.get("window", 0)),
                 segment_end=bool(view.get("segment_end", True)),
                 start_s=view.get("start_s"), words=list(view.get("words") or [])), rate


class PeerFollower:
    """A peer's job's chunks in order, as `web.synthesis.ChunkFollower` gives a local job's:
    `poll(wait_s)` the next run (maybe none), `ended` and `outcome` ("done", "canceled",
    "failed", "expired", "stalled", or "unavailable": the peer answered no poll for
    PEER_LOST_S), `job_id`, `sample_rate`. Each poll is one long-poll of PEER_POLL_S at the
    peer, whatever `wait_s` asks (a wait the API counts in whole seconds)."""

    def __init__(self, f: Farm, job: PeerJob, tenant: str, idle_s: float = STREAM_IDLE_S):
        assert f.peers is not None, "a peer's job on a farm without peers"
        self.peers: PeerSet = f.peers
        self.job, self.job_id, self.tenant = job, job.id, tenant
        self.sample_rate = job.sample_rate
        self.cursor, self.idle_s = -1, idle_s
        self.ended = False
        self.outcome: str | None = None
        self._heard = self._progress = time.monotonic()

    def _end(self, outcome: str) -> None:
        self.ended, self.outcome = True, outcome

    def poll(self, wait_s: float) -> list[Chunk]:
        if self.ended:
            return []
        path = (f"{JOBS_PATH}/{self.job_id}/chunks?after={self.cursor}&wait={PEER_POLL_S}"
                f"&max={CHUNKS_PER_WAIT}")
        try:
            status, _, page = _call(self.peers, self.job.peer, "GET", path, self.tenant,
                                    ForwardReason.READ)
        except PeerUnavailable as exc:
            status, page = 0, {}
            log.info("socket job %s: peer did not answer a poll: %s", self.job_id, exc)
        now = time.monotonic()
        if status:
            self._heard = now
        if status == 404:
            self._end("expired")
            return []
        if status in DOOR_REFUSALS:
            self.peers.note_failure(self.job.peer, f"refused this farm's peer credential "
                                    f"({status})")
            self._end("unavailable")
            return []
        chunks = [decode_chunk(c) for c in page.get("chunks") or []] if status == 200 else []
        if chunks:
            self.sample_rate = chunks[-1][1]
            self.cursor = chunks[-1][0].index
            self._progress = now
        if status == 200 and page.get("end"):
            state = page.get("state")
            self._end("done" if state == JobState.DONE else str(state))
        elif now - self._heard >= PEER_LOST_S:
            self._end("unavailable")
        elif now - self._progress >= self.idle_s:
            self._end("stalled")
        elif status not in (200, 204):  # no answer, or the peer's store away: not a spin
            time.sleep(min(RETRY_PAUSE_S, max(wait_s, 0.05)))
        return [chunk for chunk, _ in chunks]

    def audio_seconds(self) -> float | None:
        """The finished job's audio length, as the peer's record says (None if it cannot)."""
        try:
            status, _, answer = _call(self.peers, self.job.peer, "GET",
                                      f"{JOBS_PATH}/{self.job_id}", self.tenant,
                                      ForwardReason.READ)
        except PeerUnavailable:
            return None
        return answer.get("audio_seconds") if status == 200 else None


def cancel_at_peer(f: Farm, job: PeerJob, tenant: str) -> None:
    """Cancel a socket's peer job (its socket closed before the job's end); a job already
    finished, or a peer away, is left as it is (the job ends or expires there)."""
    if f.peers is None:
        return
    try:
        _call(f.peers, job.peer, "DELETE", f"{JOBS_PATH}/{job.id}", tenant, ForwardReason.READ)
    except PeerUnavailable as exc:
        log.warning("could not cancel socket job %s at its peer: %s", job.id, exc)
