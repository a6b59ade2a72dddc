"""Two whole farms, "a" and "b", each the other's zone peer (tests/zones.py): what their
clients see when one farm's Redis dies and comes back, when one farm's pools hang, when one
farm's web is gone, with API keys on, with an Idempotency-Key, and with a request that
already hopped.

One pair of farms for the module; each test lays its fault on them and the `zone` fixture
undoes it and waits until both serve locally again and see each other ready."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
import requests

from app.zones.peers import (
    HOP_HEADER,
    IDEMPOTENCY_HEADER,
    PEER_HEADER,
    PEER_KEY_HEADER,
    TENANT_HEADER,
    PeerStatus,
)
from tests.e2e.test_two_farms import clean_env, submitted
from tests.helpers import (
    Deadline,
    assert_chunk_order,
    assert_speech,
    collect_chunks,
    decode_chunk,
    get_json,
    wait_state,
    wait_until,
)
from tests.zones import (
    PEER_KEY,
    ZoneFarm,
    kill_redis,
    kill_web,
    restart_redis,
    restore,
    stop_pools,
    wait_serving,
    zone_farms,
)

pytestmark = pytest.mark.e2e

TEXT = "The river ran quietly past the mill. Snow fell on the roofs of the town."
WORDS = len(TEXT.split())


@pytest.fixture(scope="module")
def farms(tmp_path_factory):
    with zone_farms(tmp_path_factory.mktemp("zones")) as pair:
        yield pair


@pytest.fixture
def zone(farms):
    """The pair, serving locally; whatever the test did to them undone after it. Each web
    has answered a client first, as a farm in service has: a web process that never read
    its store does not know whether keys are on when the store goes, and stays closed."""
    a, b = farms
    for farm, peer in ((a, "b"), (b, "a")):
        wait_serving(farm, peer)
        assert requests.get(f"{farm.web}/v1/stats", timeout=30).status_code == 200
    yield farms
    for farm in farms:
        restore(farm)
    wait_serving(a, "b")
    wait_serving(b, "a")


def accepted_within(farm: ZoneFarm, seconds: float, owner: str,
                    headers: dict | None = None) -> dict:
    """POST the job to `farm` until it is accepted (202) by the farm named `owner` (its id
    says which), within `seconds` (an idle box's, stretched with the load); the job."""
    deadline, answers = Deadline(seconds), []
    while True:
        try:
            resp = farm.post_job(TEXT, headers, timeout=max(1.0, deadline.left()))
            answers.append((resp.status_code, resp.text[:300]))
            if resp.status_code == 202 and resp.json()["id"].startswith(f"{owner}-"):
                return resp.json()
        except requests.RequestException as exc:
            answers.append((0, repr(exc)))
        assert not deadline.passed(), (f"farm {farm.name} accepted no job owned by {owner} "
                                       f"within {deadline}: {answers[-5:]}")
        time.sleep(0.1)


def assert_renders(farm: ZoneFarm, job_id: str, headers: dict | None = None) -> None:
    """The job's chunks, long-polled through `farm`: in order, none missing, and speech of
    the text's length at the rate they state."""
    api = farm.api(headers)
    _, chunks = collect_chunks(api, job_id, max_per_poll=4)
    segments = get_json_with(api, f"/v1/jobs/{job_id}")["segments"]["total"]
    assert_chunk_order(chunks, segments)
    rates = {c["sample_rate"] for c in chunks}
    assert len(rates) == 1, rates
    assert_speech(np.concatenate([decode_chunk(c) for c in chunks]), WORDS, rates.pop())


def get_json_with(api, path: str) -> dict:
    resp = api.get(path)
    assert resp.status_code == 200, (path, resp.status_code, resp.get_json())
    return resp.get_json()


def zone_of(farm: ZoneFarm) -> tuple[int, dict]:
    status, body = farm.readyz()
    return status, body.get("zone") or {}


def test_a_farm_whose_redis_died_sends_new_jobs_to_its_peer(zone):
    """A's Redis SIGKILLed: within 3 s (an idle box's) a job POSTed to A is accepted, by B
    (its id names b), and its chunks come through A in order as speech; A's /readyz says it
    serves through b. B itself serves the job to a client who asks it directly: both farms
    are open, and an open farm's jobs are anyone's to read."""
    a, b = zone
    kill_redis(a)
    job = accepted_within(a, 3, "b")
    assert_renders(a, job["id"])

    status, z = zone_of(a)
    assert status == 200, z
    assert (z["farm"], z["serving"], z["through"]) == ("a", "peer", "b"), z
    assert not a.readyz()[1]["local_ready"]
    at_b = get_json_with(b.api(), f"/v1/jobs/{job['id']}")
    assert (at_b["id"], at_b["state"]) == (job["id"], "done"), at_b


def test_a_farm_whose_redis_returns_takes_its_own_work_again(zone):
    """A's job from before the kill: while A's Redis is down, B (asked for it by id) says
    503 "unavailable" naming farm a, with Retry-After, never 404. Once A's Redis is back
    (same port, its AOF), within 5 s new jobs posted to A are A's own again, and the old job
    answers at A and, forwarded, at B."""
    a, b = zone
    before = accepted_within(a, 30, "a")
    wait_state(a.web, before["id"])
    kill_redis(a)

    seen = []

    def b_says_unavailable() -> bool:
        resp = requests.get(f"{b.web}/v1/jobs/{before['id']}", timeout=30)
        seen.append((resp.status_code, resp.text[:300]))
        assert resp.status_code == 503, seen  # A's job while A cannot answer: never a 404
        error = resp.json()["error"]
        return (error["code"] == "unavailable" and error.get("farm") == "a"
                and int(resp.headers["Retry-After"]) > 0 and error.get("retry_after", 0) > 0)

    wait_until(b_says_unavailable, 10, lambda: f"B's answers: {seen[-3:]}", interval_s=0.2)

    restart_redis(a)
    after = accepted_within(a, 5, "a")
    assert_renders(a, after["id"])
    assert get_json(a.web, f"/v1/jobs/{before['id']}")["state"] == "done"

    def b_forwards() -> bool:
        resp = requests.get(f"{b.web}/v1/jobs/{before['id']}", timeout=30)
        seen.append((resp.status_code, resp.text[:300]))
        return resp.status_code == 200 and resp.json()["state"] == "done"

    wait_until(b_forwards, 10, lambda: f"B's answers for A's job: {seen[-3:]}",
               interval_s=0.2)


def test_a_peer_whose_pools_hang_is_not_ready_and_the_farm_keeps_its_jobs(zone):
    """B's interactive pools frozen (their heartbeats lapse): A's /readyz shows b not ready,
    and A's jobs stay on A and render."""
    a, b = zone
    stop_pools(b)
    wait_until(lambda: a.peer_state("b") == PeerStatus.NOT_READY, 45,
               lambda: f"A's view of b: {zone_of(a)}", interval_s=0.5)
    status, z = zone_of(a)
    assert (status, z["serving"]) == (200, "local"), z
    job = accepted_within(a, 10, "a")
    assert_renders(a, job["id"])
    status, body = b.readyz()
    assert not body["local_ready"], body


def test_a_peer_whose_web_is_gone_changes_nothing_for_the_other_farms_clients(zone):
    """A's web killed (the rest of A runs): B's clients see nothing change: B's jobs render
    and its /readyz is 200, serving locally; it lists peer a as unreachable."""
    a, b = zone
    kill_web(a)
    wait_until(lambda: b.peer_state("a") == PeerStatus.UNREACHABLE, 10,
               lambda: f"B's view of a: {zone_of(b)}", interval_s=0.25)
    status, z = zone_of(b)
    assert (status, z["serving"]) == (200, "local"), z
    job = accepted_within(b, 10, "b")
    assert_renders(b, job["id"])


def test_an_idempotency_key_gives_the_same_job_across_the_failover(zone):
    """A POST with an Idempotency-Key while A's Redis is down goes to B; retried (A still
    down, then again once A is back) it answers the same job, not a new one."""
    a, b = zone
    key = {IDEMPOTENCY_HEADER: uuid.uuid4().hex}
    kill_redis(a)
    first = accepted_within(a, 3, "b", key)
    again = a.post_job(TEXT, key)
    assert again.status_code in (200, 202), again.text
    assert again.json()["id"] == first["id"]

    restart_redis(a)
    wait_serving(a, "b")
    later = a.post_job(TEXT, key)
    assert later.status_code in (200, 202), later.text
    assert later.json()["id"] == first["id"]
    # A different key is a different job (the key, not the body, names the request).
    other = a.post_job(TEXT, {IDEMPOTENCY_HEADER: uuid.uuid4().hex})
    assert other.status_code == 202 and other.json()["id"] != first["id"], other.text


def test_a_request_that_already_hopped_is_never_sent_back(zone):
    """B's Redis down: a plain POST to B is forwarded to A (A's job), but one that carries
    the hop header (it came from A) gets B's own 503: no second hop, no loop; A counts no
    job for it."""
    a, b = zone
    kill_redis(b)
    forwarded = accepted_within(b, 3, "a")
    assert forwarded["id"].startswith("a-")
    jobs_at_a = submitted(requests.get(f"{a.web}/metrics", timeout=10).text)
    hopped = {HOP_HEADER: "a", PEER_HEADER: "a", PEER_KEY_HEADER: PEER_KEY, TENANT_HEADER: ""}
    resp = b.post_job(TEXT, hopped)
    assert resp.status_code == 503, resp.text
    assert set(resp.json()) == {"error"} and int(resp.headers["Retry-After"]) > 0
    assert submitted(requests.get(f"{a.web}/metrics", timeout=10).text) == jobs_at_a


# -- keys on (last: it leaves both farms keyed until its cleanup opens them again) -----------


def keys_cli(farm: ZoneFarm, *args: str) -> subprocess.CompletedProcess:
    """`voxfarm keys ...` as the operator of `farm` runs it (farm.json names its Redis)."""
    proc = subprocess.run([sys.executable, "-m", "app.cli", "keys", *args, "--var",
                           str(farm.var)], env=clean_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def create_key(farm: ZoneFarm, name: str) -> tuple[str, str]:
    """A new key on `farm`: (its id, its token)."""
    proc = keys_cli(farm, "create", name)
    key_id = re.search(r"key (\S+) \(", proc.stderr)
    assert key_id, proc.stderr
    return key_id[1], proc.stdout.strip()


def test_with_keys_on_a_tenant_of_one_farm_is_served_by_the_peer_through_it(zone):
    """Keys on at both farms; a tenant key made on A only. With A's Redis down, the tenant's
    job goes to B on the peer credential (B does not know the key and needs none from A),
    and the tenant reads it through A. B asked directly with that key says 401; B asked as a
    peer with a wrong peer key says 401."""
    a, b = zone
    made = [(a, *create_key(a, "tenant-a")), (b, *create_key(b, "own-b"))]
    try:
        tenant = {"Authorization": f"Bearer {made[0][2]}"}
        wait_until(lambda: a.post_job(TEXT).status_code == 401, 10, "A never asked for a key")
        wait_until(lambda: b.post_job(TEXT).status_code == 401, 10, "B never asked for a key")
        accepted_within(a, 10, "a", tenant)  # the key works at A, A's own job

        kill_redis(a)
        job = accepted_within(a, 3, "b", tenant)
        assert_renders(a, job["id"], tenant)
        assert b.post_job(TEXT, tenant).status_code == 401
        wrong = {PEER_HEADER: "a", PEER_KEY_HEADER: "not-the-key", TENANT_HEADER: made[0][1]}
        resp = b.post_job(TEXT, wrong)
        assert resp.status_code == 401, resp.text
        assert requests.get(f"{b.web}/v1/jobs/{job['id']}", headers=wrong,
                            timeout=30).status_code == 401
    finally:
        restore(a)
        wait_serving(a)
        for farm, key_id, _ in made:
            keys_cli(farm, "revoke", key_id)
            keys_cli(farm, "open")
