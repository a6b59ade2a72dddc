"""What the tests share besides fixtures: bounded waits, the farm and web harness, audio checks.

Test files and benches import these from here; `tests/conftest.py` holds the fixtures that
build on them. Every wait has a bound and fails saying what never happened; a test that
asserts "nothing changed" first waits for a sign that the change had its chance (see the
cancel tests), never a fixed sleep.
"""

from __future__ import annotations

import base64
import io
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import wave
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlparse, urlsplit, urlunsplit

import numpy as np
import pytest
import redis

from app.farm import Farm
from app.settings import Settings
from app.stores.states import JOB_FINAL, BookState
from tests import brokers

ROOT = Path(__file__).resolve().parents[1]
SR = 24_000  # the default voice's rate (en_us-hibari-heart)
PIPER_SR = ESPEAK_SR = 22_050  # en_us-joe-medium's and eSpeak's

T = TypeVar("T")

# -- waits ---------------------------------------------------------------------------------


SLOWDOWN_ENV = "VOXFARM_TEST_SLOWDOWN"


def slowdown() -> float:
    """How many times slower than an idle box this one runs now, for deadlines written for an
    idle one: `VOXFARM_TEST_SLOWDOWN` when set (a CI host known to be slow), else the
    runnable processes per core over the last minute (`os.getloadavg`), never under 1. The
    suite alone keeps a two-core box near 1; two CPU burners beside it make it about 2, and
    other test runs beside it more. A deadline bounds how long a test waits for what it
    checks, never what it checks, so a longer one on a busy box passes nothing that would
    fail."""
    fixed = os.environ.get(SLOWDOWN_ENV)
    if fixed:
        return max(1.0, float(fixed))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1.0, os.getloadavg()[0] / (cores or 1))


def scaled(seconds: float) -> float:
    """`seconds`, a bound written for an idle box, stretched by `slowdown()` now."""
    return seconds * slowdown()


class Deadline:
    """A deadline of `seconds` (written for an idle box) that stretches with the box's load
    while it runs: each look takes the largest `slowdown()` seen since it was set, so a load
    that rises mid-wait (the one-minute load average lags) still gets its time."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.factor, self.start = seconds, 1.0, time.monotonic()

    def passed(self) -> bool:
        self.factor = max(self.factor, slowdown())
        return time.monotonic() - self.start > self.seconds * self.factor

    def left(self) -> float:
        """Seconds left (at least 0), for a blocking call inside the wait."""
        self.factor = max(self.factor, slowdown())
        return max(0.0, self.start + self.seconds * self.factor - time.monotonic())

    def __str__(self) -> str:
        return (f"{self.seconds * self.factor:.1f} s ({self.seconds:g} s on an idle box, "
                f"x {self.factor:.1f} for the load)")


def wait_until(condition: Callable[[], T], timeout_s: float, what: str | Callable[[], str],
               interval_s: float = 0.05) -> T:
    """Call `condition` until it returns something truthy, and return that. Past `timeout_s`
    (written for an idle box, stretched with its load: `Deadline`) fail with `what` (a
    callable is asked at that moment: it can show the state reached). `condition` may raise
    AssertionError itself to fail at once (a worker died, a job failed)."""
    deadline = Deadline(timeout_s)
    while True:
        result = condition()
        if result:
            return result
        if deadline.passed():
            raise AssertionError(f"after {deadline}: {what() if callable(what) else what}")
        time.sleep(interval_s)


def get_json(api, path: str) -> dict:
    """GET `path` from `api`: a Flask test client, or the base URL of a served web."""
    if isinstance(api, str):
        import requests

        return requests.get(f"{api}{path}", timeout=10).json()
    return api.get(path).get_json()


def submit(client, text: str, **extra) -> dict:
    """POST /v1/jobs through a Flask test client; the accepted job (202) or a failed test."""
    resp = client.post("/v1/jobs", json={"text": text, **extra})
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()


def wait_state(api, job_id: str, states=("done",), timeout_s: float = 120) -> dict:
    """The job once it is in one of `states`; a job that ends in another state fails at once.
    `api` is a Flask test client or a base URL (see `get_json`)."""
    last = {}

    def reached() -> dict | None:
        last.update(get_json(api, f"/v1/jobs/{job_id}"))
        if last["state"] in states:
            return dict(last)
        assert last["state"] not in JOB_FINAL, f"job {job_id} ended {last['state']}: {last}"
        return None

    def what() -> str:
        seg = last.get("segments") or {}
        return (f"job {job_id} still {last.get('state')} ({seg.get('done')} of "
                f"{seg.get('total')} segments); {farm_snapshot(api)}")

    return wait_until(reached, timeout_s, what, interval_s=0.1)


def farm_snapshot(api) -> str:
    """One line on the farm behind `api` for a wait that failed: what waits on each queue and
    how many workers read it (GET /v1/stats), so a CI log tells a farm that is behind from one
    whose workers are gone."""
    try:
        queues = get_json(api, "/v1/stats")["queues"]
    except Exception as exc:  # noqa: BLE001  (a diagnosis must not hide the failure)
        return f"no /v1/stats ({exc.__class__.__name__})"
    return "queues " + ", ".join(f"{name} {q['depth']} ({q['workers']} workers)"
                                 for name, q in queues.items())


def wait_book(api, book_id: str, states=("done",), timeout_s: float = 120,
              until: Callable[[dict], bool] | None = None) -> dict:
    """The book once it is in one of `states` or `until(book)` holds; a book that fails or is
    canceled (and was not waited for in that state) fails at once."""
    last = {}

    def reached() -> dict | None:
        last.update(get_json(api, f"/v1/books/{book_id}"))
        if last["state"] in states or (until and until(last)):
            return dict(last)
        assert last["state"] not in (BookState.FAILED, BookState.CANCELED), last
        return None

    return wait_until(reached, timeout_s,
                      lambda: f"book {book_id} still {last.get('state')}: {last}", interval_s=0.1)


def collect_chunks(client, job_id: str, max_per_poll: int = 2, timeout_s: float = 120):
    """Long-poll the job to its end, a few chunks at a time, as a resuming client would.
    Returns the last page and every chunk."""
    after, chunks, deadline = -1, [], Deadline(timeout_s)
    while not deadline.passed():
        resp = client.get(f"/v1/jobs/{job_id}/chunks?after={after}&wait=10&max={max_per_poll}")
        if resp.status_code == 204:
            continue  # the long-poll's own wait passed with nothing new: poll again
        assert resp.status_code == 200, resp.get_json()
        page = resp.get_json()
        chunks += page["chunks"]
        after = page["next_after"]
        if page["end"]:
            return page, chunks
    raise AssertionError(f"long-poll of job {job_id} did not reach the end in {deadline}")


def wait_http_ok(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 60) -> None:
    """Wait until `url` answers 200; fail with the log's tail if `proc` dies or time runs out."""
    import requests

    def up() -> bool:
        try:
            if requests.get(url, timeout=5).status_code == 200:
                return True
        except requests.RequestException:  # not listening yet, or still booting
            pass
        assert proc.poll() is None, f"{url} exited before it came up:\n{log.read_text()[-3000:]}"
        return False

    wait_until(up, timeout_s, lambda: f"{url} did not come up:\n{log.read_text()[-3000:]}",
               interval_s=0.2)


def job_ids(farm: Farm) -> set[str]:
    """The ids of every job record the farm holds: its `{prefix}:job:{id}` keys
    (app/stores/keys.py), not their `:chunks`, `:events`, ... companions."""
    head = farm.keys.job("")
    ids = {k.decode()[len(head):] for k in farm.redis.scan_iter(farm.keys.job("*"))}
    return {i for i in ids if ":" not in i}


@contextmanager
def writes_nothing(farm: Farm):
    """Asserts that the block adds no key to the farm's Redis and grows no list (no job
    record, no message). Keys may vanish meanwhile: a shared farm's earlier tests leave keys
    with a TTL (cache entries, rate windows), so a count of keys is no measure."""
    r = farm.redis

    def lists() -> dict[bytes, int]:
        return {k: r.llen(k) for k in r.scan_iter(count=1000) if r.type(k) == b"list"}

    # The workers' own bookkeeping (heartbeats, slots, the redelivery sweep's short lock
    # `workers:<queue>:sweeping`) is written on their timers, whatever a request does.
    background = f"{farm.keys.prefix}:workers:".encode()
    keys, lengths = set(r.scan_iter(count=1000)), lists()
    yield
    added = {k for k in set(r.scan_iter(count=1000)) - keys if not k.startswith(background)}
    assert not added, f"new keys: {sorted(added)[:20]}"  # which: the writer names itself
    assert {k: n for k, n in lists().items() if n > lengths.get(k, 0)} == {}


@contextmanager
def wsgi_served(app, port: int, **server_kw):
    """`app` served on 127.0.0.1:`port` by Werkzeug, a thread per request (as the web's
    greenlets: a long answer holds none of the others), until the block ends; its URL."""
    from werkzeug.serving import make_server  # the zone tests' servers only

    server = make_server("127.0.0.1", port, app, threaded=True, **server_kw)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()


# -- ports ---------------------------------------------------------------------------------

_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    """The first port the kernel hands out for outgoing connections (Linux: 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(count: int = 1) -> int:
    """The first of `count` consecutive loopback ports free now, for a server a test starts.

    Below the kernel's ephemeral range: a port the kernel picked (bind to port 0) is one it
    also gives any outgoing connection, and on a busy box (a farm's Redis clients, other test
    runs) one took the port in the seconds before a slow-starting server bound it ("Connection
    in use"). A random one below that range is taken only by a server that chose the same, and
    none is handed out twice in a session."""
    low = _ephemeral_low()
    first = 15000 if low > 16000 else 1024
    rng = random.Random()
    for _ in range(1000):
        base = rng.randrange(first, low - count)
        ports = range(base, base + count)
        if _handed_out.intersection(ports):
            continue
        try:
            socks = [socket.create_server(("127.0.0.1", p)) for p in ports]
        except OSError:  # in use: another
            continue
        for s in socks:
            s.close()
        _handed_out.update(ports)
        return base
    raise AssertionError(f"no {count} free consecutive ports in {first}-{low}")


# -- the farm under test -------------------------------------------------------------------


def with_db(url: str, offset: int) -> str:
    """The database `offset` places after the URL's own (each test farm gets one)."""
    parts = urlsplit(url)  # a rediss:// URL carries its TLS settings in the query
    base = int(parts.path.lstrip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{base + offset}"))


@dataclass
class WorkerProc:
    queue: str
    env: dict
    log: Path
    proc: subprocess.Popen | None = None
    extra: tuple[str, ...] = ()  # more `voxfarm worker` options (--work batch, --nice 10)
    name: str = ""  # Celery's node name; a fresh one per start unless given

    def start(self) -> WorkerProc:
        out = open(self.log, "ab")
        self.name = self.name or f"{self.queue}-{os.getpid()}-{time.monotonic_ns()}@test"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "worker", self.queue, "--loglevel", "WARNING",
             "--name", self.name, *self.extra],
            env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=ROOT)
        return self

    def kill(self) -> None:
        """SIGKILL the whole worker (parent and pool processes): a crash, no cleanup."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class FarmUnderTest:
    settings: Settings
    farm: Farm
    env: dict
    log_dir: Path
    workers: list[WorkerProc] = field(default_factory=list)

    @property
    def port(self) -> int:
        """The port of the farm's Redis server."""
        return urlparse(self.settings.redis_url).port or 6379

    @property
    def db(self) -> int:
        """The farm's own Redis database."""
        return int(urlparse(self.settings.redis_url).path.lstrip("/") or 0)

    def start_worker(self, queue: str, *extra: str, name: str = "") -> WorkerProc:
        w = WorkerProc(queue, self.env, self.log_dir / f"{queue}.log", extra=extra,
                       name=name).start()
        self.workers.append(w)
        return w

    def log_tail(self, queue: str) -> str:
        return (self.log_dir / f"{queue}.log").read_text(errors="replace")[-3000:]

    def diagnosis(self) -> str:
        """What a failed test on this farm should show: each worker alive or its exit status,
        what waits on each queue, and the tail of each worker's log."""
        from app.broker.celery_app import ALL_QUEUES

        lines = [f"{w.name}: " + ("running" if w.proc.poll() is None else
                                  f"exited {w.proc.returncode}") for w in self.workers]
        try:
            lines.append("queues: " + ", ".join(f"{q} {self.farm.backlog.queue_depth(q)}"
                                                for q in ALL_QUEUES))
        except Exception as exc:  # noqa: BLE001  (a diagnosis must not hide the failure)
            lines.append(f"queues: unknown ({exc.__class__.__name__}: {exc})")
        for queue in dict.fromkeys(w.queue for w in self.workers):
            lines += [f"--- {queue} log, last lines", self.log_tail(queue)]
        return "\n".join(lines)

    def wait_live(self, queue: str, count: int = 1, timeout_s: float = 90) -> None:
        def live() -> bool:
            if len(self.farm.liveness.live_workers(queue)) >= count:
                return True
            assert all(w.proc.poll() is None for w in self.workers if w.queue == queue), \
                f"a {queue} worker exited; log tail:\n{self.log_tail(queue)}"
            return False

        wait_until(live, timeout_s,
                   lambda: f"no live {queue} worker; log tail:\n{self.log_tail(queue)}",
                   interval_s=0.2)

    def stop(self) -> None:
        for w in self.workers:
            w.stop()


@contextmanager
def running_farm(redis_url: str, db: int, log_dir: Path, workers: bool = True,
                 book: bool = False, broker: str | None = None, **overrides):
    """A farm on database `db`: acoustic and vocoder workers, and a book worker if `book`.

    With VOXFARM_TEST_BROKER=amqp (or `broker="amqp"`) its queues are on RabbitMQ, in a
    virtual host of its own (tests/brokers.py); Redis database `db` still holds its jobs and
    cache."""
    url = with_db(redis_url, db)
    redis.Redis.from_url(url).flushdb()
    # Test farms are shared by many tests and backlogged by some: admission by expected
    # wait (503 past 20 s) is tested on its own; elsewhere it would make answers flaky.
    overrides.setdefault("max_queue_wait_s", 3600)
    vhost, broker_url = "", ""
    amqp = broker == "amqp" if broker else brokers.use_amqp()
    if amqp:
        if brokers.amqp_unavailable():
            pytest.skip(f"VOXFARM_TEST_BROKER=amqp: {brokers.amqp_unavailable()}")
        vhost, broker_url = brokers.create_vhost(str(db))
    settings = Settings.from_env().with_(redis_url=url, broker_url=broker_url, result_url="",
                                        cache_url="", **overrides)
    env = dict(os.environ, VOXFARM_REDIS_URL=url, PYTHONUNBUFFERED="1",
               VOXFARM_VISIBILITY_TIMEOUT=str(settings.visibility_timeout),
               VOXFARM_MAX_RETRIES=str(settings.max_retries),
               VOXFARM_STORE=str(settings.store_dir),
               VOXFARM_PUBLISH_GRACE_S=str(settings.publish_grace_s),
               VOXFARM_MAX_QUEUE_WAIT_S=str(settings.max_queue_wait_s),
               VOXFARM_VOICES_DIR=settings.voices_dir)
    # Every other setting the test chose reaches the workers too.
    names = Settings.env_names()
    for name, value in overrides.items():
        env[names[name][0]] = str(value)
    for k in ("VOXFARM_BROKER_URL", "VOXFARM_RESULT_URL", "VOXFARM_CACHE_URL"):
        env.pop(k, None)
    if broker_url:
        env["VOXFARM_BROKER_URL"] = broker_url
    tf = FarmUnderTest(settings, Farm(settings), env, log_dir)
    try:
        if workers:
            tf.start_worker("acoustic")
            tf.start_worker("vocoder")
            if book:
                tf.start_worker("book")
            tf.wait_live("acoustic")
            tf.wait_live("vocoder")
            if book:
                tf.wait_live("book")
        yield tf
    finally:
        tf.stop()
        if vhost:
            brokers.delete_vhost(vhost)


@contextmanager
def served_web_only(redis_url: str, db: int, log_dir: Path):
    """A farm with no workers behind a real gunicorn web: (the farm, the web's base URL), for
    what the web and the CLI answer alone."""
    with running_farm(redis_url, db, log_dir, workers=False) as tf, \
            gunicorn_server(tf.env, log_dir / "web.log") as base:
        yield tf, base


@contextmanager
def gunicorn_server(env: dict, log: Path, workers: int = 1, procs: list | None = None):
    """The web app as gunicorn serves it (ops/gunicorn.conf.py); yields its base URL.
    `procs`, if given, receives the server's process (a test that kills it: its process
    group holds the workers too)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "ops" / "gunicorn.conf.py"),
         "--bind", f"127.0.0.1:{port}", "--workers", str(workers), "web.wsgi:app"],
        env=env, cwd=ROOT, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
        start_new_session=True)
    if procs is not None:
        procs.append(proc)
    base = f"http://127.0.0.1:{port}"

    try:
        wait_http_ok(f"{base}/healthz", proc, log)
        yield base
    finally:
        stop_group(proc)


def stop_group(proc: subprocess.Popen, grace_s: float = 15) -> None:
    """Stop a process started in a session of its own, and everything in its group: SIGTERM,
    then SIGKILL past `grace_s`."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# -- audio ---------------------------------------------------------------------------------


def wav_to_pcm(data: bytes) -> tuple[np.ndarray, int]:
    with wave.open(io.BytesIO(data)) as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2"), w.getframerate()


def decode_chunk(chunk: dict) -> np.ndarray:
    pcm, rate = wav_to_pcm(base64.b64decode(chunk["audio"]))
    assert rate == chunk["sample_rate"]  # each chunk says its voice's rate, and so does its WAV
    return pcm


def assert_chunk_order(chunks: list[dict], segments: int, total: int | None = None) -> None:
    """Chunks as a listener needs them: indices 0, 1, 2, ... with none missing or repeated,
    and within them every segment's windows in order, each segment ending once."""
    assert [c["index"] for c in chunks] == list(range(len(chunks)))
    if total is not None:
        assert len(chunks) == total
    expected = []
    for seg in range(segments):
        windows = [c for c in chunks if c["segment"] == seg]
        assert windows, f"segment {seg} has no chunk"
        assert [c["window"] for c in windows] == list(range(len(windows)))
        assert [c["segment_end"] for c in windows] == [False] * (len(windows) - 1) + [True]
        expected += [(seg, w) for w in range(len(windows))]
    assert [(c["segment"], c["window"]) for c in chunks] == expected


def assert_speech(pcm: np.ndarray, words: int, rate: int = SR) -> None:
    """Audio a listener would call speech: loud enough, voiced most of the time, with
    pauses, and as long as `words` words take to say (1.2 to 5 words a second) at `rate`."""
    x = pcm.astype(np.float32) / 32768
    seconds = len(x) / rate
    assert words / 5.0 <= seconds <= words / 1.2, f"{seconds:.2f} s for {words} words"
    frames = x[: len(x) // 512 * 512].reshape(-1, 512)
    rms = np.sqrt((frames**2).mean(axis=1))
    assert rms.max() > 0.02, "silence"
    active = (rms > 0.1 * rms.max()).mean()
    assert 0.3 < active < 0.98, f"{active:.2f} of frames active: not speech-like"
