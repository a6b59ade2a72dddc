"""Admin routes for voice versions and the canary: what `voxfarm models` does, over HTTP.

    GET  /v1/admin/voices/<voice>/versions   versions, figures, last decisions
    POST /v1/admin/voices/<voice>/canary     start a candidate (JSON: file, overrides, share)
    POST /v1/admin/voices/<voice>/promote    make the candidate live
    POST /v1/admin/voices/<voice>/rollback   retire the candidate

Behind the API keys like every route (web/auth.py) once any key exists. Thin: each view
checks the request and calls one method of the farm's `Canary` (app/canary/), on the
gevent hub (a few Redis round trips each).
"""

from __future__ import annotations

from flask import Blueprint, request

from app.canary.rule import (
    CanaryError,
    CanaryRunning,
    check_candidate,
    voice_file_in,
    voice_key,
)
from app.canary.store import Canary
from models.errors import InvalidVoiceSpec, UnknownSpeaker, UnknownVoice
from models.neural.voice_file import Inference
from web import apidoc as doc
from web.errors import ApiError, farm_error
from web.helpers import farm, iso_time, json_body, parse
from web.schemas import responses
from web.schemas.requests import CanaryRequest

models_admin = Blueprint("models_admin", __name__)
_VERSIONS = doc.json(responses.VoiceVersions, "the voice's versions, figures and decisions")


def _voice(name: str) -> str:
    """The versioned name of an offered voice, or 404."""
    try:
        return check_candidate(name)
    except (UnknownVoice, UnknownSpeaker, InvalidVoiceSpec):  # a+b spelling no voices
        raise ApiError(404, "voice_not_found", f"no voice '{name}'") from None
    except CanaryError as exc:  # an eSpeak voice: it has no versions
        raise ApiError(404, "voice_not_versioned", str(exc)) from None


def versions_of(canary: Canary, voice: str, decisions: int = 20) -> dict:
    """A voice's versions, figures and last decisions (`responses.VoiceVersions`)."""
    live, candidate, share = canary.state(voice)
    return responses.VoiceVersions.answer(**{
        "voice": voice, "live": live, "candidate": candidate, "share": share,
        "versions": [{"id": v.id, "state": v.state, "file": v.file,
                      "inference": v.inference.as_dict(),
                      "created_at": iso_time(v.created_at), "note": v.note}
                     for v in canary.versions(voice)],
        "figures": {role: canary.figures(voice, vid).summary()
                    for role, vid in (("live", live), ("candidate", candidate)) if vid},
        "decisions": [{**d, "ts": iso_time(d["ts"])} for d in canary.decisions(voice,
                                                                                decisions)],
    })


@doc.route(models_admin, "/v1/admin/voices/<voice>/versions", "get", doc.op(
    "admin", "listVoiceVersions", "A voice's versions, the canary's figures and its last "
    "decisions", {"200": _VERSIONS, "404": doc.VOICE_NOT_FOUND, "503": doc.UNAVAILABLE}))
def list_versions(voice: str):
    name = _voice(voice)
    return versions_of(farm().canary, name)


@doc.route(models_admin, "/v1/admin/voices/<voice>/canary", "post", doc.op(
    "admin", "startCanary", "Start a candidate version: it takes a share of new jobs until "
    "the rule (or an operator) promotes or rolls it back", {
        "201": doc.json(responses.VoiceVersions, "started"), **doc.JSON_BODY,
        "404": doc.VOICE_NOT_FOUND,
        "409": doc.error("the voice has a candidate already (`canary_running`)"),
        "422": doc.error("a field is wrong, or the file is not a voice at the voice's sample "
                         "rate (`invalid_candidate`)")},
    body=CanaryRequest))
def start_canary(voice: str):
    name = _voice(voice)
    req = parse(CanaryRequest, json_body(request))
    inference = Inference(req.noise_scale, req.length_scale, req.noise_w)
    canary = farm().canary
    try:
        # Only a voice in the voices directory: the API is no way to read the server's disk.
        file = voice_file_in(farm().settings.voices_dir, req.file) if req.file else ""
        check_candidate(name, file, inference)
        canary.start(name, file, inference, req.share, req.note)
    except CanaryError as exc:  # 409 one running already, 422 a candidate it cannot take
        err = farm_error(exc, farm().settings.retry_after_s)
        if not isinstance(exc, CanaryRunning) and req.file and "file" in str(exc):
            err.field = "file"
        raise err from None
    return versions_of(canary, name), 201


@doc.route(models_admin, "/v1/admin/voices/<voice>/promote", "post", doc.op(
    "admin", "promoteCanary", "Make the candidate live now", {
        "200": _VERSIONS, "404": doc.VOICE_NOT_FOUND, "409": doc.NO_CANDIDATE,
        "503": doc.UNAVAILABLE}))
def promote(voice: str):
    return _decide(voice, Canary.promote, "promoted")


@doc.route(models_admin, "/v1/admin/voices/<voice>/rollback", "post", doc.op(
    "admin", "rollbackCanary", "Retire the candidate now", {
        "200": _VERSIONS, "404": doc.VOICE_NOT_FOUND, "409": doc.NO_CANDIDATE,
        "503": doc.UNAVAILABLE}))
def rollback(voice: str):
    return _decide(voice, Canary.rollback, "rolled back")


def _decide(voice: str, decision, done: str):
    """An operator's promote or rollback of the voice's candidate; 409 when it has none."""
    name = _voice(voice)
    canary = farm().canary
    if decision(canary, name, reasons=(f"{done} by an operator through the API",)) is None:
        raise ApiError(409, "no_candidate", f"voice {voice_key(name)} has no candidate")
    return versions_of(canary, name)
