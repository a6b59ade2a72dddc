"""API keys, as a client of the served farm sees them.

Open while no key exists; once one does, every API route needs a live key (401), a key
sees only its own jobs and books (404 for another's, the same answer as an unknown id),
and its rate and running-work limits answer 429 with Retry-After. Probes stay open."""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import simple_websocket

from tests.helpers import Deadline, gunicorn_server, job_ids, running_farm, scaled, wait_until
from tests.wsclient import Client, ConnectionClosed

pytestmark = pytest.mark.e2e

TEXT = "Only the key that asked may listen."


@pytest.fixture(scope="module")
def served(redis_url, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("auth")
    with running_farm(redis_url, 4, log_dir) as tf, \
            gunicorn_server(tf.env, log_dir / "web.log") as base:
        yield tf, base


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def submit(base: str, headers: dict, text: str = TEXT) -> requests.Response:
    return requests.post(f"{base}/v1/jobs", json={"text": text}, headers=headers, timeout=30)


def wait_done(base: str, job_id: str, headers: dict) -> None:
    wait_until(lambda: requests.get(f"{base}/v1/jobs/{job_id}", headers=headers, timeout=10)
               .json()["state"] == "done", 120, f"job {job_id} not done")


@pytest.fixture(scope="module")
def keyed(served):
    """The farm with keys: two tenants, and the moment the web has noticed."""
    tf, base = served
    assert submit(base, {}).status_code == 202  # no key yet: open
    a, token_a = tf.farm.apikeys.create("tenant a")
    _, token_b = tf.farm.apikeys.create("tenant b")
    wait_until(lambda: submit(base, {}).status_code == 401, 10,
               "the web still took a job without a key")
    return tf, base, token_a, token_b


def test_without_a_live_key_every_api_route_is_401_and_probes_stay_open(keyed):
    tf, base, token_a, _ = keyed
    resp = submit(base, {})
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "unauthorized"
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    for path in ("/v1/voices", "/v1/stats", "/v1/jobs/abc", "/v1/books/abc"):
        assert requests.get(f"{base}{path}", timeout=10).status_code == 401, path
    wrong = token_a[:-2] + ("xy" if not token_a.endswith("xy") else "zz")
    bad = submit(base, bearer(wrong))
    assert bad.status_code == 401 and bad.json()["error"]["message"] == "the API key is not valid"
    for path in ("/healthz", "/readyz"):
        assert requests.get(f"{base}{path}", timeout=10).status_code == 200, path
    # /metrics and /docs are behind a key only with VOXFARM_AUTH_OPS.
    assert requests.get(f"{base}/metrics", timeout=10).status_code == 200


def test_a_key_sees_its_own_jobs_and_another_keys_are_404(keyed):
    _, base, token_a, token_b = keyed
    resp = submit(base, bearer(token_a))
    assert resp.status_code == 202, resp.text
    job_id = resp.json()["id"]
    mine = {"X-API-Key": token_a}  # the other header form
    wait_done(base, job_id, mine)
    assert requests.get(f"{base}/v1/jobs/{job_id}/audio", headers=mine,
                        timeout=30).status_code == 200
    unknown = requests.get(f"{base}/v1/jobs/0123456789abcdef", headers=bearer(token_b),
                           timeout=10).json()
    for path in ("", "/chunks", "/audio", "/captions", "/stream"):
        theirs = requests.get(f"{base}/v1/jobs/{job_id}{path}", headers=bearer(token_b),
                              timeout=10)
        assert theirs.status_code == 404, (path, theirs.text)
        assert theirs.json()["error"]["code"] == unknown["error"]["code"] == "job_not_found"
    assert requests.delete(f"{base}/v1/jobs/{job_id}", headers=bearer(token_b),
                           timeout=10).status_code == 404


def test_a_keys_book_is_its_own_even_for_the_same_text(keyed):
    _, base, token_a, token_b = keyed
    book = {"title": "Mine", "author": "A", "chapters": [{"title": "One", "text": TEXT}]}
    a = requests.post(f"{base}/v1/books", json=book, headers=bearer(token_a), timeout=30)
    assert a.status_code == 202, a.text
    assert requests.get(f"{base}/v1/books/{a.json()['id']}", headers=bearer(token_b),
                        timeout=10).status_code == 404
    b = requests.post(f"{base}/v1/books", json=book, headers=bearer(token_b), timeout=30)
    assert b.status_code == 202 and b.json()["id"] != a.json()["id"]


def test_the_openai_client_sends_its_key_as_a_bearer_token(keyed):
    openai = pytest.importorskip("openai")
    _, base, token_a, _ = keyed
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=token_a)
    audio = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT,
                                       response_format="wav")
    assert len(audio.content) > 20_000
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base}/v1", api_key="sk-not-a-key").audio.speech.create(
            model="tts-1", voice="alloy", input=TEXT)


def test_the_websocket_takes_the_key_at_its_handshake(keyed):
    _, base, token_a, _ = keyed
    url = base.replace("http", "ws") + "/v1/ws"
    with pytest.raises(simple_websocket.ConnectionError) as refused:
        Client.connect(url)
    assert refused.value.status_code == 401
    ws = Client.connect(url, headers=bearer(token_a))
    try:
        assert '"ready"' in ws.receive(timeout=10)
    finally:
        ws.close()


def test_rate_and_running_work_limits_answer_429_with_retry_after(keyed):
    tf, base, _, _ = keyed
    _, slow = tf.farm.apikeys.create("tenant c", rate_per_min=3)
    # Three in each minute of the clock: the fourth request of a minute is refused. Requests
    # that straddle a minute's turn (a busy box) start the count again, so each minute they
    # touched allows three.
    started, answers = time.time(), []
    while not answers or answers[-1].status_code != 429:
        assert len(answers) < 12, [r.status_code for r in answers]
        answers.append(requests.get(f"{base}/v1/voices", headers=bearer(slow), timeout=10))
    minutes = int(time.time() // 60) - int(started // 60) + 1
    assert {r.status_code for r in answers[:-1]} == {200}
    assert 3 <= len(answers) - 1 <= 3 * minutes, (len(answers), minutes)
    assert answers[-1].json()["error"]["code"] == "rate_limited"
    assert 0 < int(answers[-1].headers["Retry-After"]) <= 60

    _, one = tf.farm.apikeys.create("tenant d", max_active=1)
    first = submit(base, bearer(one), " ".join([TEXT] * 6))
    assert first.status_code == 202, first.text
    second = submit(base, bearer(one))
    assert second.status_code == 429, second.text
    assert second.json()["error"]["code"] == "too_many_jobs"
    assert int(second.headers["Retry-After"]) > 0
    wait_done(base, first.json()["id"], bearer(one))
    assert submit(base, bearer(one)).status_code == 202  # the finished one no longer counts


def test_only_an_admin_key_manages_voice_versions(keyed):
    tf, base, token_a, _ = keyed
    path = f"{base}/v1/admin/voices/en_us-joe-medium/versions"
    refused = requests.get(path, headers=bearer(token_a), timeout=10)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    _, admin = tf.farm.apikeys.create("operator", admin=True)
    answer = requests.get(path, headers=bearer(admin), timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json()["voice"].startswith("en_us-joe-medium")


def test_a_revoked_key_is_refused_at_once(keyed):
    tf, base, _, _ = keyed
    key, token = tf.farm.apikeys.create("tenant e")
    assert requests.get(f"{base}/v1/voices", headers=bearer(token), timeout=10).ok
    tf.farm.apikeys.revoke(key.id)
    started = time.monotonic()
    assert requests.get(f"{base}/v1/voices", headers=bearer(token),
                        timeout=10).status_code == 401
    assert time.monotonic() - started < scaled(5)


# -- what a hostile probe found ----------------------------------------------------------------


def ws_events(ws, until, timeout_s: float = 30) -> list[dict]:
    """JSON events (audio frames skipped) until `until(events)` holds; ConnectionClosed
    propagates."""
    events: list[dict] = []
    deadline = Deadline(timeout_s)
    while not until(events):
        assert not deadline.passed(), f"not there yet; got {events[-5:]}"
        raw = ws.receive(timeout=max(0.1, deadline.left()))
        if isinstance(raw, str):
            events.append(json.loads(raw))
    return events


def closed_with(ws, timeout_s: float = 10) -> tuple[int, list[dict]]:
    """Read until the server closes the socket: (close code, the events before it)."""
    events: list[dict] = []
    deadline = Deadline(timeout_s)
    with pytest.raises(ConnectionClosed) as closed:
        while not deadline.passed():
            raw = ws.receive(timeout=0.5)
            if isinstance(raw, str):
                events.append(json.loads(raw))
    return closed.value.reason, events


def jobs_of(tf, key_id: str) -> set[str]:
    return {j for j in job_ids(tf.farm) if tf.farm.jobs.owner(j) == key_id}


def test_static_files_are_open_and_reach_nothing_else(keyed):
    _, base, _, _ = keyed
    for path, kind in (("/static/voxfarm.js", "javascript"), ("/static/voxfarm.css", "css")):
        resp = requests.get(f"{base}{path}", timeout=10)
        assert resp.status_code == 200 and kind in resp.headers["Content-Type"], path
    page = requests.get(f"{base}/", timeout=10)  # it asks for a key before any call
    assert page.status_code == 200 and 'data-keys="1"' in page.text
    # The static route is open, not a path prefix: a trick through it reaches no API route.
    host, port = base.removeprefix("http://").split(":")
    for path in ("/static/../v1/voices", "/static/%2e%2e/v1/voices", "/static//v1/voices",
                 "/static/nope.js"):
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        assert resp.status in (401, 404) and b'"voices"' not in body, (path, resp.status)
    assert requests.post(f"{base}/static/voxfarm.js", timeout=10).status_code == 401


def test_a_revoked_keys_open_websockets_close_and_submit_nothing(keyed):
    tf, base, _, _ = keyed
    key, token = tf.farm.apikeys.create("tenant ws")
    url = base.replace("http", "ws") + "/v1/ws"
    talking = Client.connect(url, headers=bearer(token))
    idle = Client.connect(url, headers=bearer(token))
    try:
        for ws in (talking, idle):
            ws_events(ws, lambda ev: any(e["type"] == "ready" for e in ev))
        talking.send(json.dumps({"text": "Before the revoke.", "flush": True}))
        ws_events(talking, lambda ev: any(e["type"] == "flushed" for e in ev), 120)
        before = jobs_of(tf, key.id)
        assert len(before) == 1
        tf.farm.apikeys.revoke(key.id)
        try:
            for n in range(3):
                talking.send(json.dumps({"text": f"After the revoke, text {n}.",
                                         "flush": True}))
        except (ConnectionClosed, ConnectionResetError, BrokenPipeError):
            # The socket's own look at the key came first: the server closed it, and a send
            # after that finds the connection closed, or reset once the close went through.
            pass
        code, events = closed_with(talking)
        assert code == 1008
        assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["unauthorized"]
        assert not [e for e in events if e["type"] == "job.started"]
        # A socket that says nothing closes too, within the key's look-again interval.
        code, events = closed_with(idle)
        assert code == 1008 and events[-1]["error"]["code"] == "unauthorized"
        assert jobs_of(tf, key.id) == before
    finally:
        for ws in (talking, idle):
            with contextlib.suppress(ConnectionClosed):  # closed by the server already
                ws.close()


def test_each_job_on_a_websocket_counts_against_the_keys_rate(keyed):
    tf, base, _, _ = keyed
    # The budget is per minute: start with time left in this one.
    wait_until(lambda: time.time() % 60 < 45, 20, "the minute's end")
    key, token = tf.farm.apikeys.create("tenant ws rate", rate_per_min=3)
    ws = Client.connect(base.replace("http", "ws") + "/v1/ws", headers=bearer(token))
    try:  # the handshake is request 1; jobs 2 and 3 fit; the other eight do not
        ws_events(ws, lambda ev: any(e["type"] == "ready" for e in ev))
        for n in range(10):
            ws.send(json.dumps({"text": f"Job {n} on one socket.", "flush": True}))
        events = ws_events(ws, lambda ev: sum(e["type"] in ("job.started", "error")
                                              for e in ev) >= 10, 60)
    finally:
        ws.close()
    outcomes = [e["type"] if e["type"] == "job.started" else e["error"]["code"]
                for e in events if e["type"] in ("job.started", "error")]
    assert outcomes == ["job.started"] * 2 + ["rate_limited"] * 8, outcomes
    refused = next(e for e in events if e["type"] == "error")
    assert 0 < refused["error"]["retry_after"] <= 60
    assert len(jobs_of(tf, key.id)) == 2


def test_a_burst_cannot_beat_the_running_work_quota(keyed):
    tf, base, _, _ = keyed
    key, token = tf.farm.apikeys.create("tenant burst", max_active=2)
    # A request refused after its place was taken (nothing speakable) gives the place back.
    for _ in range(3):
        refused = submit(base, bearer(token), "!!! ... ???")
        assert refused.status_code == 422, refused.text
    long_text = " ".join([TEXT] * 8)
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda _: submit(base, bearer(token), long_text), range(12)))
    codes = sorted(r.status_code for r in answers)
    assert codes == [202] * 2 + [429] * 10, codes
    assert {r.json()["error"]["code"] for r in answers if r.status_code == 429} \
        == {"too_many_jobs"}
    accepted = [r.json()["id"] for r in answers if r.status_code == 202]
    assert jobs_of(tf, key.id) == set(accepted)
    for job_id in accepted:  # canceled work no longer counts
        assert requests.delete(f"{base}/v1/jobs/{job_id}", headers=bearer(token),
                               timeout=10).status_code == 200
    assert submit(base, bearer(token)).status_code == 202


def test_one_keys_text_is_no_cache_hit_for_another(keyed):
    _, base, token_a, token_b = keyed
    pin = "".join(random.choice("0123456789") for _ in range(4))
    secret = f"My bank PIN is {' '.join(pin)}."

    def cache_of(token: str) -> dict:
        resp = submit(base, bearer(token), secret)
        assert resp.status_code == 202, resp.text
        job_id = resp.json()["id"]
        wait_done(base, job_id, bearer(token))
        job = requests.get(f"{base}/v1/jobs/{job_id}", headers=bearer(token), timeout=10)
        return job.json()["mel_cache"]

    alice = cache_of(token_a)
    assert alice["hits"] == 0 and alice["misses"] >= 1
    assert cache_of(token_b) == {"hits": 0, "misses": alice["misses"]}  # Bob learns nothing
    assert cache_of(token_a) == {"hits": alice["misses"], "misses": 0}  # Alice's own: cached


def test_stats_show_a_key_its_own_figures_and_an_admin_the_farms(keyed):
    tf, base, _, _ = keyed
    _, one = tf.farm.apikeys.create("stats one")
    _, other = tf.farm.apikeys.create("stats other")
    _, admin = tf.farm.apikeys.create("stats operator", admin=True)

    def stats(token: str) -> dict:
        resp = requests.get(f"{base}/v1/stats", headers=bearer(token), timeout=10)
        assert resp.status_code == 200, resp.text
        return resp.json()

    other_before, farm_before = stats(other), stats(admin)
    assert other_before == {"scope": "key", "mel_cache": {
        "mel_cache_hits": 0, "mel_cache_misses": 0, "mel_cache_hit_rate": None}}
    text = f"Figures of one key, run {random.randint(0, 10**9)}."
    job = submit(base, bearer(one), text).json()
    wait_done(base, job["id"], bearer(one))
    record = requests.get(f"{base}/v1/jobs/{job['id']}", headers=bearer(one), timeout=10)
    counted = record.json()["mel_cache"]
    own = stats(one)["mel_cache"]
    assert own["mel_cache_misses"] == counted["misses"] >= 1 and own["mel_cache_hits"] == 0
    assert stats(other) == other_before  # another key's work moves nothing it sees
    farm = stats(admin)
    assert farm["scope"] == "farm" and "acoustic" in farm["queues"]
    assert farm["mel_cache"]["mel_cache_misses"] >= \
        farm_before["mel_cache"]["mel_cache_misses"] + own["mel_cache_misses"]
