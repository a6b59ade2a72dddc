"""The voices: the farm's, and custom voices users define as data.

    GET    /v1/voices                      every voice `voice` takes (filters: language,
                                           engine, gender, kind), custom voices included
    POST   /v1/voices                      a custom voice: a name for a shaped or mixed voice
    GET    /v1/voices/<name>               one voice; a custom voice with its versions
    POST   /v1/voices/<name>/versions      a new version of a custom voice (the name then
                                           renders as it; `NAME@1` as the first)
    DELETE /v1/voices/<name>               a custom voice, every version

A custom voice is a record in the farm's Redis (app/stores/voice_records.py) naming a voice
spec (models/voices/spec.py); `voice_or_422` (web/helpers.py) resolves its name to the spec
when work is submitted, so work already submitted keeps rendering after a delete. With API
keys on, a voice is its key's: another key gets 404 for it and may define its own of the
same name; an admin key may publish one for every key (`public`). With keys off there is
one namespace. Thin: each view checks the request and calls one method of the records'
store, on the gevent hub (one or two Redis round trips).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from app.stores.voice_records import (
    NAME_PATTERN,
    NAME_RULE,
    OPEN,
    PUBLIC,
    VoiceRecord,
    key_scope,
)
from models.errors import InvalidVoiceSpec, UnknownSpeaker, UnknownVoice
from models.voices import Voice, backend_for, get_voice, list_voices
from models.voices.base import Shape
from models.voices.catalog import describe
from models.voices.spec import format_spec
from web import apidoc as doc
from web.auth import current_key
from web.errors import ApiError
from web.helpers import (
    farm,
    given_args,
    iso_time,
    json_body,
    openai_voice_table,
    parse,
    unknown_voice,
    voice_scopes,
)
from web.schemas import responses
from web.schemas.requests import CustomVoiceRequest, VoiceShaping, VoicesQuery

voices_api = Blueprint("voices", __name__)

_VOICE = doc.json(responses.CustomVoice, "the voice")
_NOT_FOUND = doc.error("no voice of this name the key may see (`voice_not_found`)")
_SCOPE_LABELS = {PUBLIC: "public", OPEN: "shared"}  # any other scope is a key's own


# -- answers ---------------------------------------------------------------------------------


def model_answer(vc: Voice) -> dict:
    """A farm voice as `responses.Voice` has it."""
    return {"name": vc.name, "engine": vc.engine, "language": vc.language,
            "display_name": vc.display_name, "variant": vc.variant,
            "sample_rate": vc.sample_rate, "speakers": list(vc.speakers),
            "gender": vc.gender, "kind": vc.kind, "rate": vc.shape.rate, "custom": False}


def custom_answer(record: VoiceRecord) -> dict:
    """A custom voice as `responses.Voice` has it: its newest version."""
    newest, facts = record.newest, record.newest.facts
    return {"name": record.name, "engine": facts["engine"], "language": facts["language"],
            "display_name": f"{record.name} ({newest.spec})", "variant": None,
            "sample_rate": facts["sample_rate"], "speakers": [], "gender": facts["gender"],
            "kind": facts["kind"], "rate": facts["rate"], "custom": True,
            "spec": newest.spec, "version": newest.id, "base": facts["base"],
            "mix": facts["mix"], "pitch": facts["pitch"], "formant": facts["formant"],
            "scope": _SCOPE_LABELS.get(record.scope, "key")}


def _with_versions(record: VoiceRecord) -> dict:
    return {**custom_answer(record), "versions": [
        {"version": v.id, "spec": v.spec, "created_at": iso_time(v.created_at),
         **{k: v.facts[k] for k in ("base", "mix", "pitch", "formant", "rate", "language")}}
        for v in record.versions]}


def _listing_order(answer: dict, ranks: dict[str, int]) -> tuple:
    """By language, then the engine's quality (its `listing_rank`), farm voices before
    custom ones, then name."""
    return (answer["language"], ranks.get(answer["engine"], 50), answer["custom"],
            answer["name"])


def _matches(answer: dict, query: VoicesQuery) -> bool:
    return all(value is None or answer[field] == value
               for field, value in (("language", query.language), ("engine", query.engine),
                                    ("gender", query.gender), ("kind", query.kind)))


@doc.route(voices_api, "/v1/voices", "get", doc.op("voices", "listVoices", "The voices offered", {
    "200": doc.json(responses.Voices, "every voice name `voice` accepts"), "422": doc.INVALID},
    query=VoicesQuery))
def list_all():
    query = parse(VoicesQuery, given_args(request.args))
    # One round trip (the namespaces' tokens) while no custom voice changed.
    custom = farm().voice_records.visible(voice_scopes())
    answers = [model_answer(vc) for vc in list_voices()]
    answers += [custom_answer(record) for record in custom.values()]
    ranks = {vc.engine: backend_for(vc).listing_rank for vc in list_voices()}
    answers = sorted((a for a in answers if _matches(a, query)),
                     key=lambda a: _listing_order(a, ranks))
    return jsonify(responses.Voices.answer(default=farm().settings.default_voice,
                                           voices=answers))


# -- one voice -------------------------------------------------------------------------------


def _spec_of(req: VoiceShaping) -> tuple[str, dict]:
    """The canonical spec `req` asks for and what it is (the record's facts), or the 422
    naming the field at fault."""
    if (req.base is None) == (req.mix is None):
        raise ApiError(422, "invalid_voice", "give `base` (a voice to shape) or `mix` (style "
                       "voices and their weights), one of them", field="base")
    shape = Shape(pitch=0.0 if req.pitch is None else req.pitch,
                  formant=1.0 if req.formant is None else req.formant,
                  rate=1.0 if req.rate is None else req.rate, language=req.language or "")
    whole = "mix" if req.mix is not None else "base"
    try:
        voice = get_voice(format_spec(req.mix if req.mix is not None else [(req.base, 1.0)],
                                      shape))
    except InvalidVoiceSpec as exc:
        field = {"voice": whole, "lang": "language"}.get(exc.field, exc.field)
        raise ApiError(422, "invalid_voice", exc.message, field=field) from None
    except UnknownVoice as exc:
        raise unknown_voice(exc, whole, [v.name for v in list_voices()]) from None
    except UnknownSpeaker as exc:
        raise ApiError(422, "unknown_speaker", str(exc), field=whole, valid=exc.valid) from None
    facts: dict[str, Any] = {**describe(voice), "engine": voice.engine, "gender": voice.gender,
                             "kind": voice.kind, "sample_rate": voice.sample_rate}
    return voice.name, facts


def _asked(req: VoiceShaping) -> dict:
    return {k: v for k, v in req.model_dump(include={"base", "mix", "pitch", "formant",
                                                     "rate", "language"}).items()
            if v is not None}


def _taken(name: str) -> bool:
    """Whether `name` is a voice already: the farm's, an OpenAI name, a custom one seen."""
    try:
        get_voice(name)
        return True
    except (UnknownVoice, UnknownSpeaker, InvalidVoiceSpec):
        pass
    return (name in openai_voice_table()
            or farm().voice_records.exists(name, voice_scopes()))


def _own_scope(public: bool) -> str:
    key = current_key()
    if public:
        if key is not None and not key.admin:
            raise ApiError(403, "forbidden", "only an admin key may publish a voice for every "
                           "key (`public`)", field="public")
        return PUBLIC
    return key_scope(key.id) if key is not None else OPEN


@doc.route(voices_api, "/v1/voices", "post", doc.op(
    "voices", "createVoice", "Define a custom voice: a name for a shaped or mixed voice", {
        "201": doc.json(responses.CustomVoice, "created"), **doc.JSON_BODY,
        "403": doc.error("`public` from a key that is not an admin key (`forbidden`)"),
        "409": doc.error("the name is a voice already (`voice_exists`)"),
        "422": doc.error("a field is wrong: out of range, a voice the farm lacks, or shaping "
                         "the base's engine cannot do (`invalid_voice`); `field` says which")},
    body=CustomVoiceRequest))
def create():
    req = parse(CustomVoiceRequest, json_body(request))
    if not NAME_PATTERN.fullmatch(req.name):
        raise ApiError(422, "invalid_voice_name", f"a voice's name takes {NAME_RULE}",
                       field="name")
    scope = _own_scope(req.public)
    if _taken(req.name):
        raise ApiError(409, "voice_exists", f"there is a voice called '{req.name}' already",
                       field="name")
    spec, facts = _spec_of(req)
    record = farm().voice_records.create(scope, req.name, spec, _asked(req), facts)
    if record is None:  # made meanwhile by another request
        raise ApiError(409, "voice_exists", f"there is a voice called '{req.name}' already",
                       field="name")
    resp = jsonify(responses.CustomVoice.answer(**_with_versions(record)))
    resp.status_code = 201
    return resp


def _record_or_404(name: str) -> VoiceRecord:
    record = farm().voice_records.visible(voice_scopes()).get(name.lower())
    if record is None:
        raise ApiError(404, "voice_not_found", f"no voice '{name}'")
    return record


@doc.route(voices_api, "/v1/voices/<name>", "get", doc.op(
    "voices", "getVoice", "A voice; a custom voice with its versions", {
        "200": _VOICE, "404": _NOT_FOUND}))
def get_one(name: str):
    try:
        return responses.CustomVoice.answer(**model_answer(get_voice(name)))
    except (UnknownVoice, UnknownSpeaker, InvalidVoiceSpec):
        return responses.CustomVoice.answer(**_with_versions(_record_or_404(name)))


def _writable(record: VoiceRecord) -> str:
    """The scope of `record` if the calling key may change it: 403 for a public voice and a
    key that is not an admin key."""
    key = current_key()
    if record.scope == PUBLIC and key is not None and not key.admin:
        raise ApiError(403, "forbidden", f"'{record.name}' is published for every key; only "
                       "an admin key may change it")
    return record.scope


def _builtin_refusal(name: str) -> None:
    try:
        get_voice(name)
    except (UnknownVoice, UnknownSpeaker, InvalidVoiceSpec):
        return
    raise ApiError(403, "voice_builtin", f"'{name}' is one of the farm's voices; only custom "
                   "voices (POST /v1/voices) can be changed or deleted")


@doc.route(voices_api, "/v1/voices/<name>/versions", "post", doc.op(
    "voices", "addVoiceVersion", "A new version of a custom voice: the name renders as it "
    "from now on (`NAME@N` as version N)", {
        "201": _VOICE, **doc.JSON_BODY, "404": _NOT_FOUND,
        "403": doc.error("one of the farm's voices (`voice_builtin`), or a public voice and "
                         "a key that is not an admin key (`forbidden`)")},
    body=VoiceShaping))
def add_version(name: str):
    body = json_body(request)  # a body that is no JSON is refused first, as on every route
    _builtin_refusal(name)
    record = _record_or_404(name)
    req = parse(VoiceShaping, body)
    spec, facts = _spec_of(req)
    updated = farm().voice_records.add_version(_writable(record), record.name, spec,
                                               _asked(req), facts)
    if updated is None:  # deleted meanwhile
        raise ApiError(404, "voice_not_found", f"no voice '{name}'")
    resp = jsonify(responses.CustomVoice.answer(**_with_versions(updated)))
    resp.status_code = 201
    return resp


@doc.route(voices_api, "/v1/voices/<name>", "delete", doc.op(
    "voices", "deleteVoice", "Delete a custom voice and all its versions (work already "
    "submitted keeps rendering: it carries the voice's spec)", {
        "204": {"description": "deleted"}, "404": _NOT_FOUND,
        "403": doc.error("one of the farm's voices (`voice_builtin`), or a public voice and "
                         "a key that is not an admin key (`forbidden`)")}))
def delete(name: str):
    _builtin_refusal(name)
    record = _record_or_404(name)
    if not farm().voice_records.delete(_writable(record), record.name):
        raise ApiError(404, "voice_not_found", f"no voice '{name}'")
    return Response(status=204)
