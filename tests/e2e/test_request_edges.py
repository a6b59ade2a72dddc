"""What a hostile or careless client tries at the web's edges, and what it must get.

JSON nested thousands deep on every JSON route and on the WebSocket: a 400 `invalid_json`
(an error event, the socket kept), never a 500 with a traceback in the log. A chunked body
past the limit: 413, as one with a Content-Length gets. Security headers on every kind of
answer, and a page that a script-only policy does not break. The farm's figures (/v1/stats)
for an open farm; each key's own are in test_auth.py. The admin canary reads voice files in
the voices directory only, with one answer for a file missing there and one anywhere else.
Flower started open by `voxfarm up --flower` closes once the farm has API keys.

The shared farm: the Flask test client where HTTP is not needed, gunicorn (a server of this
module's own, whose log is read) for the WebSocket and the chunked body.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import uuid
from pathlib import Path

import click
import pytest
import redis
import requests

from app.settings import Settings
from tests import wsclient
from tests.e2e.test_streaming import events_until
from tests.helpers import ROOT, free_port, gunicorn_server, stop_group, wait_http_ok, wait_until

pytestmark = pytest.mark.e2e

CANARY_VOICE = "en_us-joe-medium"
# Every route that reads a JSON body (a test below holds the app to this list).
JSON_ROUTES = ["/v1/jobs", "/v1/phonemize", "/v1/books", "/v1/audio/speech",
               "/v1/audio/captioned_speech", "/dev/captioned_speech",
               f"/v1/admin/voices/{CANARY_VOICE}/canary", "/v1/voices",
               "/v1/voices/narrator/versions"]
# POST routes with no body to read.
NO_BODY = {"/v1/books/<book_id>/retry", "/v1/admin/voices/<voice>/promote",
           "/v1/admin/voices/<voice>/rollback"}


def deep_bodies(levels: int) -> list[str]:
    """Bodies nested `levels` deep: arrays and objects, closed where that fits the web's body
    limit, and nesting inside a field of an otherwise good request."""
    bodies = ["[" * levels, '{"text": "Hi.", "lexicon": ' + "[" * levels]
    if levels <= 1000:
        bodies += ["[" * levels + "]" * levels, '{"a": ' * levels + "0" + "}" * levels,
                   '{"text": "Hi.", "lexicon": ' + '{"a": ' * levels + "0" + "}" * levels + "}"]
    return bodies


def refusals(caplog) -> list[logging.LogRecord]:
    """Log records a refusal must not leave: errors, or anything with a traceback."""
    return [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_every_json_route_is_in_the_list(client):
    posts = {rule.rule for rule in client.application.url_map.iter_rules()
             if "POST" in (rule.methods or ())}
    listed = {re.sub(r"^/v1/voices/[^/]+/", "/v1/voices/<name>/",
                     re.sub(r"admin/voices/[^/]+/", "admin/voices/<voice>/", r))
              for r in JSON_ROUTES}
    assert posts - NO_BODY == listed


@pytest.mark.parametrize("levels", [1000, 100_000])
def test_deep_json_is_invalid_json_on_every_json_route(client, caplog, levels):
    caplog.set_level(logging.INFO)
    for route in JSON_ROUTES:
        for body in deep_bodies(levels):
            resp = client.post(route, data=body, content_type="application/json")
            assert resp.status_code == 400, (route, body[:30], resp.status_code, resp.data[:200])
            err = resp.get_json()["error"]
            assert err["code"] == "invalid_json", (route, err)
            assert err["message"].startswith("the request body"), err
    assert refusals(caplog) == [], [r.getMessage() for r in refusals(caplog)]


def test_json_of_ordinary_depth_still_parses(client):
    # Four levels, as a phoneme list with its items nests: the bound refuses nothing real.
    resp = client.post("/v1/phonemize", json={"text": "Hello there.",
                                              "lexicon": {"there": "ðˈɛɹ"}})
    assert resp.status_code == 200, resp.get_json()
    resp = client.post("/v1/phonemize", json={"text": "[[[[{{{{" * 50 + " words."})
    assert resp.status_code == 200, resp.get_json()  # brackets in a string are text


# -- through gunicorn --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def web(farm, tmp_path_factory):
    log = tmp_path_factory.mktemp("edges") / "web.log"
    with gunicorn_server(farm.env, log) as base:
        yield base, log


def no_tracebacks(log: Path) -> None:
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and "internal_error" not in text, text[-3000:]


def test_deep_json_on_the_websocket_is_an_error_event_and_the_socket_stays(web):
    base, log = web
    ws = wsclient.connect(base.replace("http://", "ws://") + "/v1/ws")
    try:
        events_until(ws, "ready")
        for levels in (1000, 100_000):
            for message in deep_bodies(levels):
                ws.send(message)
                event = events_until(ws, "error", 30)[-1]
                assert event["error"]["code"] == "invalid_json", (levels, event)
                assert event["error"]["message"].startswith("the message"), event
        ws.send(json.dumps({"text": "Still here.", "flush": True}))
        msgs = events_until(ws, "flushed")
        assert any(isinstance(m, bytes) for m in msgs)
    finally:
        ws.close()
    no_tracebacks(log)


def test_a_chunked_body_over_the_limit_is_413(web):
    base, log = web
    size = int(6.5 * 1024 * 1024)

    def chunked(total: int):
        yield b'{"text": "'
        piece = b"a" * 65536
        for _ in range(total // len(piece)):
            yield piece
        yield b'"}'

    # requests sends a generator with Transfer-Encoding: chunked, no Content-Length.
    resp = requests.post(f"{base}/v1/jobs", data=chunked(size), timeout=120,
                         headers={"Content-Type": "application/json"})
    assert resp.status_code == 413, resp.text[:300]
    err = resp.json()["error"]
    assert err["code"] == "request_too_large" and err["limit_bytes"] > 0, err
    # A chunked body within the limit is read whole, as before.
    small = requests.post(f"{base}/v1/phonemize", timeout=30,
                          data=iter([b'{"text": "Chunked', b' is fine."}']),
                          headers={"Content-Type": "application/json"})
    assert small.status_code == 200, small.text[:300]
    no_tracebacks(log)


# -- security headers --------------------------------------------------------------------------


def test_every_kind_of_answer_carries_the_security_headers(client):
    answers = {
        "JSON": client.get("/v1/voices"),
        "the page": client.get("/"),
        "a static file": client.get("/static/voxfarm.js"),
        "the docs": client.get("/docs"),
        "an error": client.get("/v1/jobs/no-such-job"),
        "a refusal": client.post("/v1/jobs", data="[" * 2000, content_type="application/json"),
    }
    for what, resp in answers.items():
        assert resp.status_code in (200, 400, 404), (what, resp.status_code)
        h = resp.headers
        assert h.get("X-Content-Type-Options") == "nosniff", what
        assert h.get("X-Frame-Options") == "DENY", what
        assert h.get("Referrer-Policy") == "no-referrer", what
        policy = dict(p.strip().split(" ", 1) for p in h["Content-Security-Policy"].split(";"))
        assert policy["frame-ancestors"] == "'none'", what
        assert policy["script-src"] == "'self'" and policy["default-src"] == "'none'", what
        assert "unsafe" not in h["Content-Security-Policy"], what


def test_the_page_has_nothing_inline_that_its_policy_would_block(client):
    for path in ("/", "/docs"):
        html = client.get(path).get_data(as_text=True)
        scripts = re.findall(r"<script\b[^>]*>", html)
        assert all("src=" in s for s in scripts), scripts  # no inline script
        assert "<style" not in html and not re.search(r"\sstyle=", html), path
        assert not re.search(r"\son[a-z]+=", html), path  # no inline event handlers
        assert not re.search(r"(src|href)=\"(https?:)?//", html), path  # nothing off-site
    js = client.get("/static/voxfarm.js").get_data(as_text=True)
    assert not re.search(r"\beval\(|new Function\(|setAttribute\(\"style", js)


# -- /v1/stats on an open farm -----------------------------------------------------------------


def test_an_open_farm_shows_the_farms_figures(client):
    stats = client.get("/v1/stats").get_json()
    assert stats["scope"] == "farm"
    assert {"mel_cache_hits", "entries", "bytes"} <= set(stats["mel_cache"])
    assert "acoustic" in stats["queues"]


# -- the canary's voice files ------------------------------------------------------------------


def test_the_canary_reads_voice_files_in_the_voices_directory_only(farm, tmp_path):
    from models.voices import default_piper_model, use_voices_dir, voices_dir
    from web import create_app

    bundled = default_piper_model()
    if bundled is None:
        pytest.skip("the bundled Piper voice is not installed")
    voices = tmp_path / "voices"
    voices.mkdir()
    (voices / "candidate.onnx").symlink_to(bundled)
    (voices / "candidate.onnx.json").symlink_to(f"{bundled}.json")
    (voices / "notes.txt").write_text("not a voice")
    settings = farm.settings.with_(voices_dir=str(voices),
                                   key_prefix=f"canary-files-{uuid.uuid4().hex[:8]}")
    before = voices_dir()
    try:
        client = create_app(settings).test_client()
        path = f"/v1/admin/voices/{CANARY_VOICE}/canary"

        def answer(file: str) -> tuple[int, dict]:
            resp = client.post(path, json={"file": file})
            return resp.status_code, resp.get_json()

        missing = answer("missing.onnx")
        assert missing[0] == 422, missing
        assert missing[1]["error"]["code"] == "invalid_candidate"
        assert missing[1]["error"]["field"] == "file"
        for elsewhere in ("/etc/passwd", "../../../../../../etc/passwd", "/etc/hostname",
                          "/", str(tmp_path / "missing.onnx"), "notes.txt",
                          str(bundled), f"../{voices.name}/../candidate.onnx", "x\x00.onnx"):
            assert answer(elsewhere) == missing, elsewhere
        started = client.post(path, json={"file": "candidate.onnx", "share": 0.0})
        assert started.status_code == 201, started.get_json()
        assert started.get_json()["versions"][-1]["file"] == str(voices / "candidate.onnx")
        assert client.post(f"/v1/admin/voices/{CANARY_VOICE}/rollback").status_code == 200
    finally:
        use_voices_dir(before)


# -- Flower once keys are on -------------------------------------------------------------------


def test_up_opens_flower_only_while_the_farm_has_no_keys():
    from app.cli.up import flower_auth_args

    open_farm = Settings().with_(flower_user="", flower_password="")
    assert flower_auth_args(open_farm, "127.0.0.1", False) == ["--open-until-keys"]
    assert flower_auth_args(open_farm, "127.0.0.1", True) == ["--no-auth"]
    with pytest.raises(click.UsageError):
        flower_auth_args(open_farm, "0.0.0.0", False)
    with_user = Settings().with_(flower_user="ops", flower_password="s3cret")
    assert flower_auth_args(with_user, "0.0.0.0", False) == []


def test_flower_started_open_refuses_once_the_farm_has_keys(farm, tmp_path):
    from app.security.apikeys import ApiKeys

    # Keys under a prefix of this test's own: the shared farm's web stays open.
    prefix = f"flower-keys-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in farm.env.items() if not k.startswith("VOXFARM_FLOWER_")}
    env["VOXFARM_KEY_PREFIX"] = prefix
    keys = ApiKeys(redis.Redis.from_url(farm.settings.redis_url), prefix)
    port, log = free_port(), tmp_path / "flower.log"
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "flower", "--open-until-keys",
                             "--port", str(port)], env=env, cwd=ROOT, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{base}/healthcheck", proc, log)
        assert requests.get(f"{base}/api/queues/length", timeout=10).status_code == 200
        key, _ = keys.create("tenant")

        def shut() -> bool:
            return all(requests.get(f"{base}{p}", timeout=10).status_code == 401
                       for p in ("/api/tasks", "/api/queues/length", "/", "/tasks"))

        wait_until(shut, 30, lambda: f"Flower still open:\n{log.read_text()[-2000:]}")
        # Started again with the key there, it refuses to start at all.
        out = subprocess.run([sys.executable, "-m", "app.cli", "flower", "--open-until-keys",
                              "--port", str(free_port())], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and "VOXFARM_FLOWER_USER" in out.stderr, out.stderr
        assert "--no-auth" in out.stderr
    finally:
        stop_group(proc)
        for name in keys.r.scan_iter(f"{prefix}:*"):
            keys.r.delete(name)
