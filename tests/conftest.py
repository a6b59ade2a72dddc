"""Shared fixtures: a real Redis, real Celery worker processes, the app as gunicorn serves it.

Redis: `VOXFARM_REDIS_URL` when set (give the tests a database of their own), else an
embedded `redis-server` started for the session. Each farm a test needs lives in its own
Redis database, so killing one farm's workers never disturbs another's queues.
"""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import sys
import time
import wave
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
import redis

from app.embedded_redis import EmbeddedRedis, free_port
from app.farm import Farm
from app.settings import Settings
from tests import brokers

ROOT = Path(__file__).resolve().parents[1]
SR = 22050


def with_db(url: str, offset: int) -> str:
    """The database `offset` places after the URL's own (each test farm gets one)."""
    head, _, tail = url.rpartition("/")
    if url.count("/") > 2 and tail.isdigit():
        return f"{head}/{int(tail) + offset}"
    return f"{url.rstrip('/')}/{offset}"


def pytest_report_header(config) -> str:
    if not brokers.use_amqp():
        return "voxfarm broker: Redis (VOXFARM_TEST_BROKER=amqp runs the farms on RabbitMQ)"
    why = brokers.amqp_unavailable()
    return f"voxfarm broker: RabbitMQ at {brokers.AMQP_WHERE}" + (
        f" -- UNAVAILABLE: {why}; the farm tests skip" if why else "")


def pytest_sessionstart(session) -> None:
    if brokers.use_amqp() and not brokers.amqp_unavailable():
        brokers.remove_stale_vhosts()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    url = os.environ.get("VOXFARM_REDIS_URL")
    if url:
        yield url
        return
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), persist=False).start()
    yield server.url
    server.stop()


@dataclass
class WorkerProc:
    queue: str
    env: dict
    log: Path
    proc: subprocess.Popen | None = None
    extra: tuple[str, ...] = ()  # more `voxfarm worker` options (--work batch, --nice 10)

    def start(self) -> WorkerProc:
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "worker", self.queue, "--loglevel", "WARNING",
             "--name", f"{self.queue}-{os.getpid()}-{time.monotonic_ns()}@test", *self.extra],
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

    def start_worker(self, queue: str, *extra: str) -> WorkerProc:
        w = WorkerProc(queue, self.env, self.log_dir / f"{queue}.log", extra=extra).start()
        self.workers.append(w)
        return w

    def wait_live(self, queue: str, count: int = 1, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.farm.live_workers(queue)) >= count:
                return
            if any(w.proc.poll() is not None for w in self.workers if w.queue == queue):
                break
            time.sleep(0.2)
        logs = (self.log_dir / f"{queue}.log").read_text(errors="replace")[-3000:]
        raise AssertionError(f"no live {queue} worker; log tail:\n{logs}")

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


@pytest.fixture(scope="session")
def farm(redis_url, tmp_path_factory) -> FarmUnderTest:
    """The shared farm (database 0): one acoustic and one vocoder worker process."""
    with running_farm(redis_url, 0, tmp_path_factory.mktemp("farm"),
                      visibility_timeout=60) as tf:
        yield tf


@pytest.fixture(scope="session")
def client(farm):
    from web import create_app

    app = create_app(farm.settings, farm.farm)
    return app.test_client()


# -- gunicorn ------------------------------------------------------------------------------


def wait_http_ok(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 60) -> None:
    """Wait until `url` answers 200; fail with the log's tail if `proc` dies or time runs out."""
    import requests

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if requests.get(url, timeout=5).status_code == 200:
                return
        except requests.RequestException:  # not listening yet, or still booting
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{url} did not come up:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


@contextmanager
def gunicorn_server(env: dict, log: Path, workers: int = 1):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "ops" / "gunicorn.conf.py"),
         "--bind", f"127.0.0.1:{port}", "--workers", str(workers), "web.wsgi:app"],
        env=env, cwd=ROOT, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
        start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    try:
        wait_http_ok(f"{base}/healthz", proc, log)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def server(farm, tmp_path_factory) -> str:
    """The web app as gunicorn (gevent workers) serves it, on the shared farm."""
    with gunicorn_server(farm.env, tmp_path_factory.mktemp("web") / "gunicorn.log") as base:
        yield base


# -- audio helpers -------------------------------------------------------------------------


def wav_to_pcm(data: bytes) -> tuple[np.ndarray, int]:
    with wave.open(io.BytesIO(data)) as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2"), w.getframerate()


def decode_chunk(chunk: dict) -> np.ndarray:
    pcm, rate = wav_to_pcm(base64.b64decode(chunk["audio"]))
    assert rate == SR
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


def assert_speech(pcm: np.ndarray, words: int) -> None:
    """Audio a listener would call speech: loud enough, voiced most of the time, with
    pauses, and as long as `words` words take to say (1.2 to 5 words a second)."""
    x = pcm.astype(np.float32) / 32768
    seconds = len(x) / SR
    assert words / 5.0 <= seconds <= words / 1.2, f"{seconds:.2f} s for {words} words"
    frames = x[: len(x) // 512 * 512].reshape(-1, 512)
    rms = np.sqrt((frames**2).mean(axis=1))
    assert rms.max() > 0.02, "silence"
    active = (rms > 0.1 * rms.max()).mean()
    assert 0.3 < active < 0.98, f"{active:.2f} of frames active: not speech-like"
