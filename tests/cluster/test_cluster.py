"""The farm across four network-namespace hosts (tests/cluster/hosts.py): broker, web, w1, w2.

One cluster per broker (Redis; RabbitMQ when a second rabbitmq-server can start inside the
broker host), and on it, in order:

1. a book renders across both worker hosts, and both hosts' workers render segments;
2. worker host w1 is killed whole (SIGKILL to every process, then its link down) mid-book;
3. worker host w1 is cut off the network for 30 s mid-book, then reconnected;
4. the web host's processes are killed and started again while clients long-poll; they
   resume from their cursors.

Each checks that nothing was lost and nothing duplicated: every book segment stored exactly
once (one file per segment, the book's done count equal to its total, every chapter's count
right), every job's chunks 0..n-1 each delivered once. Redelivery time is measured from the
workers' logs: from the fault to the moment another host received the last message the
faulted host held. With Redis the scenarios set VOXFARM_VISIBILITY_TIMEOUT=20 (420 s by
default: a dead worker's message waits that long); RabbitMQ redelivers when the
connection closes or misses its heartbeats (VOXFARM_BROKER_HEARTBEAT_S, 10 s).

Run with `make cluster-test` (root, iproute2; about 3 minutes on two cores). The table of
results is printed at the end and written to var/cluster-results.json.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.cluster import hosts
from tests.cluster.hosts import WORKER_HOSTS, Cluster, task_events

pytestmark = pytest.mark.cluster

RESULTS: list[dict] = []
RESULTS_FILE = hosts.ROOT / "var" / "cluster-results.json"

SENTENCES = [
    "The lighthouse keeper climbed the stairs at dusk.",
    "He lit the lamp and watched the ships go by.",
    "A storm gathered far out beyond the reef.",
    "By morning the sea had turned a quiet grey.",
    "Children ran along the sand looking for shells.",
    "The keeper wrote everything down in his log.",
]
# eSpeak and Griffin-Lim: cheap enough that two hosts on two cores render a book in seconds.
VOICE = "en-us"


def book_json(title: str, chapters: int, sentences: int) -> dict:
    return {"title": title, "author": "Cluster Test", "voice": VOICE, "formats": ["chapters"],
            "chapters": [{"title": f"Part {c + 1}", "text": " ".join(
                f"{SENTENCES[(c + i) % len(SENTENCES)]} That was line {i + 1} of part "
                f"{c + 1} of {title}." for i in range(sentences))} for c in range(chapters)]}


@pytest.fixture(scope="module", params=["redis", "amqp"])
def cluster(request, tmp_path_factory):
    why = hosts.unavailable()
    if why:
        pytest.skip(f"cluster tests: {why}")
    if request.param == "amqp" and hosts.rabbitmq_unavailable():
        pytest.skip(f"cluster tests on RabbitMQ: {hosts.rabbitmq_unavailable()}")
    c = Cluster(tmp_path_factory.mktemp(f"cluster-{request.param}"), request.param)
    try:
        t0 = time.monotonic()
        c.up()
        for host in WORKER_HOSTS:
            c.start_workers(host)
        c.start_web()
        c.wait_web()
        c.wait_workers()
        print(f"\n[{request.param}] cluster up in {time.monotonic() - t0:.1f} s; "
              f"logs in {c.work / 'logs'}")
        yield c
    finally:
        c.down()


# -- helpers ---------------------------------------------------------------------------------


def api(c: Cluster, method: str, path: str, **kw) -> requests.Response:
    return requests.request(method, f"{c.web_url}{path}", timeout=kw.pop("timeout", 20), **kw)


def submit_book(c: Cluster, title: str, chapters: int, sentences: int) -> str:
    resp = api(c, "POST", "/v1/books", json=book_json(title, chapters, sentences))
    assert resp.status_code == 202, resp.text
    return resp.json()["id"]


def book(c: Cluster, book_id: str) -> dict:
    return api(c, "GET", f"/v1/books/{book_id}").json()


def wait_book(c: Cluster, book_id: str, until=None, timeout_s: float = 240) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        b = book(c, book_id)
        if (until(b) if until else b["state"] == "done"):
            return b
        assert b["state"] not in ("failed", "canceled"), b
        assert time.monotonic() < deadline, f"book still {b['state']}: {b['segments']}"
        time.sleep(0.05)


def check_book_exactly_once(c: Cluster, book_id: str) -> dict:
    """Done, every segment stored once, each chapter complete; the render counts."""
    from app.stores.artifacts import open_store

    b = wait_book(c, book_id)
    total = b["segments"]["total"]
    assert b["segments"]["done"] == total
    files = open_store(str(c.store)).list(f"books/{book_id}/segments/")
    assert len(files) == total == len(set(files)), (len(files), total)
    for ch in b["chapters"]:
        assert ch["segments"]["done"] == ch["segments"]["total"]
        assert len([f for f in files if f"/segments/{ch['index']:04d}/" in f]) == \
            ch["segments"]["total"]
    renders = [e for e in task_events(c) if e.owner == book_id and e.kind == "succeeded"
               and e.pool == "vocoder"]
    seqs = {e.seq for e in renders}
    return {"segments": total, "vocoder_renders": len(renders),
            "rendered_twice": len(renders) - len(seqs),
            "by_host": {h: sum(1 for e in renders if e.host == h) for h in WORKER_HOSTS}}


def redelivery(c: Cluster, host: str, t_fault: float, since: float) -> dict:
    """What `host` held at `t_fault` (received since `since`, not succeeded there) and when
    another host received each of those messages again."""
    events = task_events(c)
    held = {}
    for e in events:
        if e.host == host and since <= e.ts <= t_fault:
            if e.kind == "received":
                held[e.task_id] = e
            else:
                held.pop(e.task_id, None)
    again = {}
    for e in events:
        if e.task_id in held and e.host != host and e.kind == "received" and e.ts > t_fault:
            again.setdefault(e.task_id, e.ts - t_fault)
    return {"held": len(held), "redelivered": len(again),
            "first_s": round(min(again.values()), 2) if again else None,
            "last_s": round(max(again.values()), 2) if again else None,
            "held_tasks": sorted(f"{e.pool}:{e.owner[:6]}:{e.seq}" for e in held.values())}


def record(c: Cluster, scenario: str, **fields) -> None:
    row = {"broker": c.broker, "scenario": scenario, **fields}
    RESULTS.append(row)
    print(f"\n[{c.broker}] {scenario}: {json.dumps(fields)}")
    RESULTS_FILE.parent.mkdir(exist_ok=True)
    RESULTS_FILE.write_text(json.dumps(RESULTS, indent=1))


def restore_w1(c: Cluster) -> None:
    w1 = c.hosts["w1"]
    w1.set_link(True)
    if not w1.pids():
        c.start_workers("w1")
    c.wait_workers()


# -- scenarios -------------------------------------------------------------------------------


def test_a_book_renders_across_both_worker_hosts(cluster):
    c = cluster
    t0 = time.monotonic()
    book_id = submit_book(c, f"Two Hosts {c.broker}", 3, 8)
    stats = check_book_exactly_once(c, book_id)
    assert all(n > 0 for n in stats["by_host"].values()), stats
    acoustic = {h: sum(1 for e in task_events(c) if e.owner == book_id and e.host == h
                       and e.pool == "acoustic" and e.kind == "succeeded")
                for h in WORKER_HOSTS}
    assert all(n > 0 for n in acoustic.values()), acoustic
    record(c, "book across both hosts", fault="none", redelivery_s=None,
           seconds=round(time.monotonic() - t0, 1), acoustic_by_host=acoustic, **stats)


def test_a_worker_host_killed_mid_book_loses_and_duplicates_nothing(cluster):
    c = cluster
    since = time.time()
    book_id = submit_book(c, f"Killed Host {c.broker}", 4, 10)
    b = wait_book(c, book_id, until=lambda b: b["segments"]["done"] >= 8)
    w1 = c.hosts["w1"]
    try:
        t_fault = w1.kill_all()
        w1.set_link(False)
        done_at_kill = book(c, book_id)["segments"]
        assert done_at_kill["done"] < done_at_kill["total"], "the book finished before the kill"
        stats = check_book_exactly_once(c, book_id)
        moved = redelivery(c, "w1", t_fault, since)
        record(c, "worker host killed mid-book", fault=f"w1: SIGKILL all, link down at "
               f"{b['segments']['done']}/{b['segments']['total']}",
               redelivery_s=moved["last_s"], **moved, **stats)
        # Everything the dead host held was taken by the other one.
        assert moved["held"] > 0, f"the killed host held nothing: nothing was tested {moved}"
        assert moved["redelivered"] == moved["held"], moved
    finally:
        restore_w1(c)


def test_a_worker_host_cut_off_for_30_s_then_back(cluster):
    c = cluster
    since = time.time()
    book_id = submit_book(c, f"Cut Off {c.broker}", 4, 10)
    b = wait_book(c, book_id, until=lambda b: b["segments"]["done"] >= 8)
    w1 = c.hosts["w1"]
    try:
        t_fault = w1.set_link(False)
        time.sleep(30)
        w1.set_link(True)
        stats = check_book_exactly_once(c, book_id)
        moved = redelivery(c, "w1", t_fault, since)
        # Back on the network, w1's workers (never restarted) heartbeat and take work again.
        assert w1.pids(), "w1's processes died while cut off"
        c.wait_workers(hosts=("w1",), timeout_s=120)
        t_back = time.time()
        after = submit_book(c, f"After The Cut {c.broker}", 2, 8)
        after_stats = check_book_exactly_once(c, after)
        record(c, "worker host cut off 30 s", fault=f"w1: link down 30 s at "
               f"{b['segments']['done']}/{b['segments']['total']}",
               redelivery_s=moved["last_s"], **moved, **stats,
               w1_live_again_s=round(t_back - t_fault - 30, 1),
               after_reconnect_by_host=after_stats["by_host"])
        assert after_stats["by_host"]["w1"] > 0, after_stats
    finally:
        restore_w1(c)


TEXT = " ".join(f"Listener {{n}} hears sentence {i} of a long answer, read aloud in order."
                for i in range(12))


def _long_poll(c: Cluster, job_id: str, out: dict, stop_at: float) -> None:
    """A client that resumes from its cursor whatever happens to the web in between."""
    after, chunks, errors, last_error = -1, [], 0, None
    while time.monotonic() < stop_at:
        try:
            resp = api(c, "GET", f"/v1/jobs/{job_id}/chunks?after={after}&wait=5&max=2",
                       timeout=15)
        except requests.RequestException:
            errors, last_error = errors + 1, time.time()
            time.sleep(0.1)
            continue
        if resp.status_code == 204:
            continue
        if resp.status_code >= 500:
            errors, last_error = errors + 1, time.time()
            time.sleep(0.1)
            continue
        assert resp.status_code == 200, resp.text
        page = resp.json()
        chunks += [ch["index"] for ch in page["chunks"]]
        if page["chunks"]:
            after = page["chunks"][-1]["index"]
            out.setdefault("first_chunk_at", time.time())
            if last_error and "resumed_at" not in out:
                out["resumed_at"] = time.time()
        if page.get("end") or (page["state"] == "done" and page.get("total") is not None
                               and after >= page["total"] - 1):
            out.update(chunks=chunks, errors=errors, state=page["state"], total=page["total"])
            return
    out.update(chunks=chunks, errors=errors, state="timeout")


def test_the_web_host_restarts_while_clients_long_poll(cluster):
    import redis

    from app.stores.keys import Keys

    c = cluster
    clients = 4
    jobs = []
    for n in range(clients):
        resp = api(c, "POST", "/v1/jobs", json={"text": TEXT.format(n=n), "voice": VOICE})
        assert resp.status_code == 202, resp.text
        jobs.append(resp.json()["id"])
    outs = [{} for _ in jobs]
    stop_at = time.monotonic() + 180
    threads = [threading.Thread(target=_long_poll, args=(c, j, o, stop_at), daemon=True)
               for j, o in zip(jobs, outs, strict=True)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while not any("first_chunk_at" in o for o in outs):
        assert time.monotonic() < deadline, "no client got a first chunk"
        time.sleep(0.02)
    web = c.hosts["web"]
    t_kill = web.kill_all()
    time.sleep(1.0)
    c.start_web()
    t_up = c.wait_web()
    for t in threads:
        t.join(200)
    r, keys = redis.Redis.from_url(c.redis_url), Keys("vf")
    for job_id, o in zip(jobs, outs, strict=True):
        assert o["state"] == "done", o
        assert o["chunks"] == list(range(o["total"])), o["chunks"]  # each once, in order
        assert r.hlen(keys.chunks(job_id)) == o["total"]
        job = api(c, "GET", f"/v1/jobs/{job_id}").json()
        assert job["segments"]["done"] == job["segments"]["total"]
    resumed = [o["resumed_at"] - t_kill for o in outs if "resumed_at" in o]
    assert sum(o["errors"] for o in outs) > 0, "no client noticed the restart"
    record(c, "web host restarted under long-polls", fault="web: SIGKILL all, restart",
           redelivery_s=None, web_down_s=round(t_up - t_kill, 2),
           clients=clients, clients_interrupted=sum(1 for o in outs if o["errors"]),
           resumed_after_s=round(max(resumed), 2) if resumed else None,
           chunks=[len(o["chunks"]) for o in outs])


def summary_table() -> str:
    cols = ("broker", "scenario", "redelivery_s", "held", "redelivered", "segments",
            "vocoder_renders", "rendered_twice", "by_host", "web_down_s", "resumed_after_s")
    lines = [" | ".join(cols)]
    for row in RESULTS:
        lines.append(" | ".join(str(row.get(k, "")) for k in cols))
    return "\n".join(lines)


def teardown_module(module) -> None:
    if RESULTS:
        print("\n" + summary_table())
        Path(RESULTS_FILE).write_text(json.dumps(RESULTS, indent=1))
