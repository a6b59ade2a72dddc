"""Custom voices as records: the store (create, versions, delete, namespaces, its cache) on a
real Redis, and the routes (409, 422 with the field, ownership with API keys on, public
voices, suggestions) through the web app on that Redis; no worker runs here, so nothing is
rendered (tests/integration/test_custom_voices.py renders)."""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from app.farm import Farm
from app.settings import Settings
from app.stores.keys import Keys
from app.stores.voice_records import (
    NAME_PATTERN,
    OPEN,
    PUBLIC,
    VoiceRecords,
    closest_names,
    key_scope,
    split_version,
)
from tests.helpers import with_db

SHAPED = {"name": "narrator", "base": "en_us-hibari-heart", "pitch": -3, "formant": 0.95}
HEART = "en_us-hibari-heart"


def records_on(redis_url: str) -> VoiceRecords:
    return VoiceRecords(redis.Redis.from_url(with_db(redis_url, 4)), Keys(uuid.uuid4().hex[:8]))


def test_a_record_is_created_once_versioned_and_deleted_with_its_versions(redis_url):
    store = records_on(redis_url)
    facts = {"engine": "hibari"}
    made = store.create(OPEN, "narrator", f"{HEART}[pitch=-3]", {"pitch": -3}, facts)
    assert made is not None and made.newest.id == "v1"
    assert store.create(OPEN, "narrator", HEART, {}, facts) is None  # taken: nothing written
    added = store.add_version(OPEN, "narrator", f"{HEART}[pitch=2]", {"pitch": 2}, facts)
    assert added is not None and [v.id for v in added.versions] == ["v1", "v2"]
    resolve = store.resolver([OPEN, PUBLIC])
    assert resolve("narrator") == f"{HEART}[pitch=2]"  # the newest
    assert resolve("narrator@1") == resolve("Narrator@v1") == f"{HEART}[pitch=-3]"
    assert resolve("narrator@3") is None and resolve("nobody") is None
    assert store.delete(OPEN, "narrator") and not store.delete(OPEN, "narrator")
    assert store.find("narrator", [OPEN, PUBLIC]) is None
    assert store.add_version(OPEN, "narrator", HEART, {}, facts) is None


def test_namespaces_are_apart_and_a_key_sees_its_own_before_the_public_one(redis_url):
    store = records_on(redis_url)
    alice, bob = key_scope("a1"), key_scope("b2")
    store.create(alice, "duo", "jf_alpha", {}, {})
    store.create(PUBLIC, "duo", "jm_kumo", {}, {})
    store.create(PUBLIC, "town", "en-us", {}, {})
    assert store.resolver([alice, PUBLIC])("duo") == "jf_alpha"
    assert store.resolver([bob, PUBLIC])("duo") == "jm_kumo"
    assert set(store.visible([bob, PUBLIC])) == {"duo", "town"}
    assert store.visible([bob]) == {}


def test_another_process_write_is_seen_at_once_and_an_unchanged_read_reuses_the_cache(redis_url):
    store = records_on(redis_url)
    other = VoiceRecords(store.redis, store.keys)  # another web process
    assert store.visible([OPEN]) == {}
    other.create(OPEN, "late", HEART, {}, {})
    first = store.visible([OPEN])
    assert set(first) == {"late"}
    assert store.visible([OPEN])["late"] is first["late"]  # cached: the token did not move
    other.delete(OPEN, "late")
    assert store.visible([OPEN]) == {}


@pytest.mark.parametrize("name, ok", [
    ("narrator", True), ("my.voice_2-b", True), ("a" * 64, True), ("a" * 65, False),
    ("Narrator", False), ("-lead", False), ("a+b", False), ("a(2)", False), ("x[pitch=1]", False),
    ("n@2", False), ("n:0", False), ("", False), ("sp ace", False)])
def test_names_are_plain_and_never_spec_grammar(name, ok):
    assert bool(NAME_PATTERN.fullmatch(name)) is ok


def test_a_versioned_name_splits():
    assert split_version("Narrator@2") == ("narrator", 2)
    assert split_version("narrator@v12") == ("narrator", 12)
    assert split_version("narrator") == ("narrator", None)
    assert split_version("a@b") == ("a@b", None)


def test_suggestions_hold_the_name_or_come_close():
    names = [HEART, "en_us-joe-medium", "en-us", "en-us+f3", "jf_alpha", "jm_kumo"]
    assert closest_names("heart", names) == [HEART]
    assert closest_names("hart", names) == [HEART]
    assert closest_names("alpa", names) == ["jf_alpha"]
    assert closest_names("zzzz", names) == []
    assert len(closest_names("e", names, most=3)) == 3


# -- the routes --------------------------------------------------------------------------------


@pytest.fixture
def app_farm(redis_url):
    farm = Farm(Settings().with_(redis_url=with_db(redis_url, 4),
                                 key_prefix=uuid.uuid4().hex[:8]))
    # imported here: the web app is what these tests build, per test
    from web import create_app

    return create_app(farm.settings, farm).test_client(), farm


def test_create_conflict_and_refusals_name_their_field(app_farm):
    client, _ = app_farm
    made = client.post("/v1/voices", json=SHAPED)
    assert made.status_code == 201, made.json
    assert made.json["spec"] == f"{HEART}[pitch=-3,formant=0.95]"
    assert (made.json["kind"], made.json["engine"], made.json["scope"]) == ("shaped", "hibari",
                                                                         "shared")
    assert client.post("/v1/voices", json=SHAPED).json["error"]["code"] == "voice_exists"
    builtin = client.post("/v1/voices", json={**SHAPED, "name": "en-us"})
    assert (builtin.status_code, builtin.json["error"]["code"]) == (409, "voice_exists")
    for body, field in (({"pitch": 40}, "pitch"), ({"formant": 3}, "formant"),
                        ({"base": "en_us-joe-medium", "pitch": 0, "formant": 0.9}, "formant"),
                        ({"base": "heart"}, "base"), ({"name": "Bad Name"}, "name"),
                        ({"mix": {"jf_alpha": 1}}, "base")):
        resp = client.post("/v1/voices", json={**SHAPED, "name": "other", **body})
        assert resp.status_code == 422 and resp.json["error"]["field"] == field, (body, resp.json)
    unknown = client.post("/v1/voices", json={**SHAPED, "name": "other", "base": "heart"})
    assert unknown.json["error"]["suggestions"] == [HEART]


def test_versions_resolve_and_a_deleted_voice_is_unknown(app_farm):
    client, _ = app_farm
    client.post("/v1/voices", json=SHAPED)
    added = client.post("/v1/voices/narrator/versions", json={"base": HEART, "pitch": 2})
    assert added.status_code == 201 and added.json["version"] == "v2"
    one = client.get("/v1/voices/narrator").json
    assert [v["version"] for v in one["versions"]] == ["v1", "v2"]
    said = client.post("/v1/phonemize", json={"text": "Hello.", "voice": "narrator@1"})
    assert said.status_code == 200 and said.json["voice"] == f"{HEART}[pitch=-3,formant=0.95]"
    assert client.post("/v1/phonemize", json={"text": "Hello.", "voice": "narrator"}
                       ).json["voice"] == f"{HEART}[pitch=2]"
    missing = client.post("/v1/phonemize", json={"text": "Hello.", "voice": "narrator@7"})
    assert missing.json["error"]["code"] == "unknown_voice_version"
    assert client.delete("/v1/voices/narrator").status_code == 204
    gone = client.post("/v1/phonemize", json={"text": "Hello.", "voice": "narrator"})
    assert gone.status_code == 422 and gone.json["error"]["code"] == "unknown_voice"
    assert client.get("/v1/voices/narrator").status_code == 404
    refused = client.delete("/v1/voices/en-us")
    assert (refused.status_code, refused.json["error"]["code"]) == (403, "voice_builtin")


def test_an_unknown_voice_suggests_the_closest_names(app_farm):
    client, _ = app_farm
    resp = client.post("/v1/phonemize", json={"text": "Hello.", "voice": "heart"})
    assert resp.status_code == 422
    assert resp.json["error"]["suggestions"][0] == HEART
    assert HEART in resp.json["error"]["message"]


def test_the_listing_orders_by_language_then_quality_and_filters(app_farm):
    client, _ = app_farm
    client.post("/v1/voices", json=SHAPED)
    voices = client.get("/v1/voices").json["voices"]
    languages = [v["language"] for v in voices]
    assert languages == sorted(languages)
    english = [v for v in voices if v["language"] == "en"]
    assert english[0]["name"] == HEART and english[-1]["engine"] == "espeak"
    assert "narrator" in [v["name"] for v in english]
    shaped = client.get("/v1/voices?kind=shaped").json["voices"]
    assert [v["name"] for v in shaped] == ["narrator"]
    assert all(v["gender"] == "male" for v in client.get("/v1/voices?gender=male").json["voices"])
    assert client.get("/v1/voices?kind=robot").status_code == 422


def _keyed(farm: Farm, admin: bool = False) -> dict:
    _, token = farm.apikeys.create(uuid.uuid4().hex[:6], admin=admin)
    return {"Authorization": f"Bearer {token}"}


def test_with_keys_a_voice_is_its_keys_and_an_admin_may_publish_one(app_farm):
    client, farm = app_farm
    alice, bob, admin = _keyed(farm), _keyed(farm), _keyed(farm, admin=True)
    assert client.post("/v1/voices", json=SHAPED, headers=alice).json["scope"] == "key"
    assert client.get("/v1/voices/narrator", headers=bob).status_code == 404
    assert client.delete("/v1/voices/narrator", headers=bob).status_code == 404
    refused = client.post("/v1/phonemize", json={"text": "Hi.", "voice": "narrator"},
                          headers=bob)
    assert refused.json["error"]["code"] == "unknown_voice"
    theirs = client.post("/v1/voices", json={**SHAPED, "pitch": 3}, headers=bob)
    assert theirs.status_code == 201  # the same name, bob's own
    public = {"name": "town", "base": HEART, "public": True}
    assert client.post("/v1/voices", json=public, headers=alice).status_code == 403
    assert client.post("/v1/voices", json=public, headers=admin).json["scope"] == "public"
    assert client.get("/v1/voices/town", headers=bob).json["scope"] == "public"
    assert client.delete("/v1/voices/town", headers=bob).status_code == 403
    assert client.delete("/v1/voices/town", headers=admin).status_code == 204


def test_the_cli_table_has_a_column_each_and_marks_custom_voices():
    from app.cli.voices import table

    out = table([
        {"name": HEART, "language": "en", "gender": "female", "engine": "hibari", "rate": 1.0,
         "kind": "model", "custom": False},
        {"name": "narrator", "language": "en", "gender": "female", "engine": "hibari",
         "rate": 1.1, "kind": "shaped", "custom": True, "scope": "key"}]).splitlines()
    assert out[0].split() == ["NAME", "LANGUAGE", "GENDER", "ENGINE", "RATE", "KIND"]
    assert out[1].split() == [HEART, "en", "female", "hibari", "1", "model"]
    assert out[2].split() == ["narrator", "en", "female", "hibari", "1.1", "shaped", "(key)"]
    assert len({line.index("LANGUAGE") if "LANGUAGE" in line else line.index(" en ") + 1
                for line in out}) == 1  # aligned


def test_the_answers_are_what_the_document_says(app_farm):
    """Each voices answer validates against the schema the document gives its status."""
    import jsonschema_rs

    from web.openapi import build_spec

    client, farm = app_farm
    spec = json.loads(json.dumps(build_spec(farm.settings)))

    def check(path: str, method: str, resp) -> None:
        answers = spec["paths"][path][method]["responses"]
        assert str(resp.status_code) in answers, (path, method, resp.status_code)
        schema = answers[str(resp.status_code)]["content"]["application/json"]["schema"]
        validator = jsonschema_rs.Draft202012Validator({**schema,
                                                        "components": spec["components"]})
        assert not [e.message for e in validator.iter_errors(resp.json)], resp.json

    check("/v1/voices", "post", client.post("/v1/voices", json=SHAPED))
    check("/v1/voices", "post", client.post("/v1/voices", json=SHAPED))  # 409
    check("/v1/voices", "post", client.post("/v1/voices", json={**SHAPED, "pitch": 99}))
    check("/v1/voices", "get", client.get("/v1/voices"))
    check("/v1/voices/{name}", "get", client.get("/v1/voices/narrator"))
    check("/v1/voices/{name}", "get", client.get(f"/v1/voices/{HEART}"))
    check("/v1/voices/{name}", "get", client.get("/v1/voices/nobody"))  # 404
    check("/v1/voices/{name}/versions", "post",
          client.post("/v1/voices/narrator/versions", json={"base": HEART, "rate": 1.2}))
    check("/v1/voices/{name}", "delete", client.delete(f"/v1/voices/{HEART}"))  # 403
    assert client.delete("/v1/voices/narrator").status_code == 204
