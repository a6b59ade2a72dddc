"""The settings' fields, group by group: what each knob is, its default and its range.

`app/settings.py` joins the groups into one flat `Settings` and reads them from the environment;
nothing here reads it. A field whose variable is not `VOXFARM_<FIELD>` says so with `Env(...)`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, SecretStr
from pydantic.fields import FieldInfo

PREFIX = "VOXFARM_"

# The kinds of value, each with its range.
Share = Annotated[float, Field(ge=0.0, le=1.0)]
Count = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(gt=0)]
Seconds = Annotated[float, Field(ge=0.0)]
PositiveSeconds = Annotated[float, Field(gt=0.0)]


class Env:
    """Field metadata: the variables a field is read from, in order of precedence, where they
    are not `VOXFARM_<FIELD>`."""

    def __init__(self, *names: str) -> None:
        self.names = names


def _names(name: str, info: FieldInfo) -> tuple[str, ...]:
    for meta in info.metadata:
        if isinstance(meta, Env):
            return meta.names
    return (PREFIX + name.upper(),)


class _Group(BaseModel):
    """A group of fields: the mixins below, joined into one `Settings`."""

    model_config = {"frozen": True}


class RedisSettings(_Group):
    # Redis: one URL for everything unless split. The broker wants AOF and noeviction, the
    # mel cache an LRU policy, so production deployments may point them at different servers.
    # REDIS_URL too, the name hosted Redis add-ons set; an empty variable counts as unset.
    redis_url: Annotated[str, Env("VOXFARM_REDIS_URL", "REDIS_URL")] = "redis://127.0.0.1:6379/0"
    broker_url: str = ""
    result_url: str = ""
    cache_url: str = ""
    # Prefix of every key this farm writes, so several farms (or test runs) share one server.
    key_prefix: str = "vf"
    # A Redis call that gets no answer for this long fails (the web answers 503); blocking
    # long-poll reads have their own, longer bound (app/stores/redis_conn.py).
    redis_timeout_s: PositiveSeconds = 5.0
    # Connections a process's Redis pool for short calls may open. A call that finds them all
    # in use waits for one, up to redis_timeout_s, then fails (503), instead of failing at
    # once as redis-py's default pool (of 100 too) did. Calls take about a millisecond: 900
    # long-polls arriving at once were answered as fast through 32 connections as through
    # 1000, which left 568 idle connections open (docs/benchmarks.md, "Many waits").
    redis_max_connections: Positive = 100
    # Connections of the pool the readers that wake long-polls and streams block on (one per
    # job waited on in a process, app/stores/wakeups.py). 1000 is gunicorn's worker_connections
    # (ops/gunicorn.conf.py): a web process serves at most that many requests at once, each
    # waiting on one job, so a reader never waits for a connection (it would wake its job's
    # waiters up to redis_timeout_s late).
    redis_max_readers: Positive = 1000


class VoiceSettings(_Group):
    acoustic_model: str = "espeak"
    vocoder: str = "griffinlim"
    # hibari's voice heart (the hibari-tts wheel): through the farm it read the WER test's
    # sentences at least as clearly as Piper's en_US-joe-medium (pocketsphinx WER 0.081 each;
    # 0.070 vs 0.081 in process) at a fifth of the compute per second of audio (0.026 s vs
    # 0.138 s): docs/benchmarks.md, "The English voices". Piper and eSpeak stay selectable.
    default_voice: str = "en_us-hibari-heart"
    # More Piper voices: every NAME.onnx (+ NAME.onnx.json) here is offered after a restart.
    voices_dir: str = ""
    # OpenAI voice names mapped elsewhere: "alloy=en-us+f2,echo=NAME:2" (web/openai_compat.py).
    openai_voices: str = ""
    mel_cache_ttl: Count = 300
    # The neural vocoder streams each segment in windows, each a chunk as soon as it exists:
    # the first of this many latent frames (256 samples each; 64 is 0.74 s of audio at
    # 22,050 Hz), each next twice the one before (models/neural/piper.py, WINDOW_GROWTH). 64
    # measured best (docs/benchmarks.md, "First audio"): a short first window, and growing
    # windows cost hardly more than whole segments. 0: whole segments.
    vocoder_window_frames: Count = 64
    # After its first window a segment gives way, once, to the listeners still waiting for
    # their first audio: with a job's first segment (or another's rest) waiting on the
    # vocoder lead queue, the rest of this one goes to the back of that queue
    # (tasks/segments.py). So the n-th listener of a burst waits behind the first windows
    # ahead, not behind their whole segments.
    vocoder_yield: bool = True
    # Dynamic batching (tasks/batching.py): a model pool runs up to this many segments or
    # windows, of any jobs, in one forward pass, on that many threads of one process. 0: 8 on
    # a CUDA device, 1 (off) on CPU, where it measured slower (docs/benchmarks.md,
    # "Batching"). A batch waits at most batch_linger_ms for more items, and not at all once
    # every running task has handed its item in.
    batch_max: Count = 0
    batch_linger_ms: Seconds = 5.0
    # Where a worker's models run: "cpu", "cuda", "cuda:1" (tasks/runtime.py).
    device: str = "cpu"
    # `voxfarm worker`: torch threads per process (0: the CLI's default, one).
    torch_threads: Count = 0
    # A CPU vocoder pass takes the cores no other model process of the farm is busy on, up
    # to this many threads (tasks/cores.py; 0: the CPUs the process may use). 1, off, by
    # default: on the 2-core box a lone request through the farm measured slower wide, the
    # web, Redis and the stream using the core the pass took (docs/benchmarks.md).
    wide_threads: Count = 1
    # What runs the neural models (models/engine.py; docs/models.md, "Inference engines"):
    # auto: compiled by OpenVINO on a CPU device, torch on CUDA; torch: eager everywhere;
    # openvino: compiled wherever the device is a CPU. A stage the engine cannot compile
    # stays in torch with one log line. The engine uses the pool's torch_threads.
    engine: Literal["auto", "torch", "openvino"] = "auto"
    # Converted models and compiled blobs kept between starts (a warm start skips the
    # conversion and the compilation); empty: VAR_DIR/engine-cache.
    engine_cache: str = ""
    # Engines whose models a pool loads on their first segment instead of at its start, a
    # comma list ("kokoro"). Empty, the default: every model warm before the pool serves, so
    # no listener pays a load. The test suite's many short-lived farms set "kokoro", whose
    # 82M parameters would cost each farm's start seconds and memory no test of theirs uses.
    lazy_engines: str = ""
    # Each stage's compiled precision (models/engine.py; docs/models.md, "Precision"): f32,
    # bf16, int8 (static scales, where the stage has a calibration set) or auto, the default:
    # per voice and stage the fastest precision that passed the perceptual bound (today the
    # hibari decoder int8, the rest f32). Its cost, an int8 build of a few seconds at a
    # pool's first start, is paid once per engine cache (docs/models.md, "Precision").
    acoustic_precision: Literal["f32", "bf16", "int8", "auto"] = "auto"
    vocoder_precision: Literal["f32", "bf16", "int8", "auto"] = "auto"
    # The GPU memory rule (docs/operations.md, "GPU memory"): a CUDA worker with less than
    # this share of its device's memory free runs no forward pass and never falls back to its
    # CPU; it hands the segment to a pool with room, and the web answers 507 while no pool of
    # a stage has any. 0.15 is the first design's figure, not a measured one: raise it where
    # other processes share the card and allocate in bursts.
    gpu_min_free: Share = 0.15
    # What the memory probe answers instead of measuring: "fixed:0.05" makes a worker, a CPU
    # one too, see 5% of its device free (the rerouting is tested on CPU this way). Empty:
    # measure a CUDA device; a CPU device has no such limit (1.0).
    memory_probe: str = ""
    # A segment handed on this many times at one stage fails its job with the reason instead
    # of bouncing between pools that are all short.
    max_reroutes: Count = 3


class AdmissionSettings(_Group):
    # Interactive jobs keep their audio in Redis this long after their last write.
    job_ttl: Positive = 3600
    max_text_chars: Positive = 20_000
    # Past this many segments waiting on the acoustic queue the farm answers 503.
    max_queue_depth: Count = 5_000
    # A job whose first audio would wait longer than this for the pools (the segments ahead
    # of it times the slower stage's recent run time per live worker) is refused with 503
    # and Retry-After instead of being accepted and served too late.
    max_queue_wait_s: Seconds = 20.0
    # The most segments one job may have (413 past it, pointing at the books API). 20,000
    # characters of prose make 80-200 segments (short sentences merge up to 250 characters:
    # the README's text 121, one-line dialogue 74); only break tags, SSML sentences or a
    # phoneme list make more (`Hi [break=1ms]` over and over: 1,334). 500 keeps one job to a
    # tenth of max_queue_depth, so no single job fills the queue for every other client.
    max_job_segments: Positive = 500
    retry_after_s: Count = 5
    max_wait_s: Count = 60
    # Audio bytes (stored PCM) one chunks long-poll answer carries, besides its `max` count;
    # always at least one chunk, and the client goes on from `next_after`. 32 chunks of a
    # long job are about 2.2 MB (2.9 MB of JSON): a burst of 300 such answers read, wrapped
    # and base64-encoded held each web worker's loop for 15 s. 1 MiB is about 22 s of 24 kHz
    # speech, far ahead of any player; 0 turns it off.
    max_chunk_bytes_per_answer: Count = 1024 * 1024
    # Largest book upload (file or JSON chapters); past it the API answers 413.
    max_book_bytes: Positive = 50 * 1024 * 1024
    # A book's caps, decided while it is read (413 naming the cap; docs/books.md, "Limits").
    # Words: the longest novels in one volume are about 600,000 words (a 1,500-page book),
    # so a million fits any real book and stops a text built to fill a web worker's memory
    # (38 million words of one uploaded EPUB held 1.1 GB). Chapters: long novels have a few
    # hundred, a web serial's collected volume may reach a thousand or so.
    max_book_words: Positive = 1_000_000
    max_book_chapters: Positive = 2_000
    # An EPUB's entries together, inflated: twice max_book_bytes, so an EPUB of pictures
    # (which do not compress) and its text fit, and the web's memory for one book stays
    # bounded by it. The ratio over all entries together (never an entry alone, which 190
    # small entries slip under): XHTML compresses 3-10x, 100x is a zip bomb.
    max_book_unpacked_bytes: Positive = 100 * 1024 * 1024
    max_book_unpacked_ratio: Annotated[float, Field(gt=1.0)] = 100.0
    # Uploads parse one at a time per web process, each in a child process (never on the
    # web's threads that encode audio); the next waits its turn this long at most, then 503
    # with Retry-After. Four books at the caps sent at once on two busy cores parsed in about
    # 16 s each (the child runs niced), so the fourth waited 50 s: 120 s leaves it room. A
    # parse is stopped (the child killed, 503) past the second bound: a book at the caps
    # parses in 5-16 s (docs/reliability.md), and a parser pathology does not run on.
    book_parse_wait_s: PositiveSeconds = 120.0
    book_parse_timeout_s: PositiveSeconds = 120.0
    # A JSON body or WebSocket message nested deeper than this is refused (400 invalid_json)
    # before it is parsed: Python's parser recurses once a level and fails near 1,000, and no
    # request of the API nests past 4 (a book's chapters of phoneme items).
    max_json_depth: Positive = 32
    # A stream or WebSocket client that has not taken the audio sent to it within this many
    # seconds is dropped (it stopped reading).
    stream_write_timeout_s: PositiveSeconds = 60.0
    # A job made for a stream (the OpenAI speech API, captioned speech, the WebSocket) is
    # listened to: the web process that streams it renews its lease every third of this,
    # whatever the client's pace, and a sweep cancels a live stream job whose lease lapsed
    # (its web process died or was stopped: nobody will hear the rest). A web whose renewals
    # stop for two thirds of it (a hung process) loses its streams' jobs; a restarted farm
    # stops counting the old streams' work this long after the stop (app/stores/listeners.py).
    stream_lease_s: PositiveSeconds = 15.0


class ReliabilitySettings(_Group):
    # A task is killed past task_time_limit; an unacked message (its worker died) is
    # redelivered after visibility_timeout, which must outlast the longest task, or a slow
    # task would run twice at once. Kept close to it, so a crash delays a segment minutes,
    # not an hour. Redis broker only: RabbitMQ puts a message back the moment its
    # consumer's connection closes (or misses its heartbeats), whatever the task's length.
    task_time_limit: Positive = 300
    visibility_timeout: Positive = 420
    # RabbitMQ only (a Redis broker has no heartbeats): the worker and the broker exchange
    # heartbeats this often, so a worker host cut off the network is declared dead, and its
    # unacked messages go back to their queue, within about two intervals. RabbitMQ's own
    # default (60 s) would hold a partitioned host's segment for two minutes.
    broker_heartbeat_s: Count = 10
    max_retries: Count = 3
    # The web waits at most this long for a broker producer (then answers 503), and a job
    # whose segments were not all queued this long after it was created is failed by the
    # sweeper (its web process died mid-submit).
    publish_timeout_s: Positive = 5
    publish_grace_s: Positive = 30
    # A job that made no progress (no window stored) for this long is failed with the reason
    # by the acoustic pool's heartbeat, never left queued or running for ever: its segments
    # were lost (a message inside the last second a killed Redis had not yet written, say).
    # Admission keeps a job's expected wait under max_queue_wait_s, so a healthy one never
    # comes near it.
    job_stall_s: Positive = 600
    # A job accepted before a broker restart that made no progress for this long after it is
    # looked for on the broker by the acoustic pool's heartbeat, and what the restart lost
    # of it (a message inside the last writes a killed Redis had not saved) is queued again
    # (Sweeps.resume_lost_jobs). Short, because queue waits are no concern (a segment waiting
    # or held is left alone) and the sweep runs only in the minutes after a restart.
    job_resume_s: Positive = 5
    # A book that made no progress (no segment stored, no planning or encoding running) for
    # this long, with nothing waiting its turn (the batch queues empty while it renders, the
    # book queue while it is planned or assembled), is resumed by the book pool's heartbeat:
    # a segment's, the feeder's, the plan's or the assembly's message was lost. After
    # `book_stall_resumes` such resumes it is failed with the reason (retry with
    # POST /v1/books/ID/retry).
    book_stall_s: Positive = 120
    book_stall_resumes: Count = 3
    # A book's planning (the text frontend over its chapters, in the book worker's one
    # frontend thread) runs in turns of at most this long; between turns the thread serves
    # the other books planning, in order, so a small book waits about a turn per book
    # planning, never for a long one to finish, and a cancel is seen within a turn.
    book_plan_turn_s: PositiveSeconds = 0.25
    # A prepare message plans for this long, then, at the end of the chapter in hand, hands
    # over to a fresh message that carries on from the last planned chapter: no task nears
    # task_time_limit (a chapter still unplanned then fails the book, with the reason), and
    # a lost worker loses at most this much planning.
    book_plan_slice_s: PositiveSeconds = 60.0


class ProcessSettings(_Group):
    store_dir: Annotated[str, Env("VOXFARM_STORE")] = "var/store"
    # The bound on the embedded Redis's memory (`voxfarm up` without a Redis URL): a share of
    # the machine's memory ("25%"), a size in Redis's units ("2gb"), or 0 for none. It keeps
    # noeviction (it is the broker: a queued segment or a job record is never dropped), so
    # past the bound writes are refused (503 store_full) until TTLs free memory. A quarter
    # leaves the rest to the model pools and to the AOF rewrite's fork, which may copy what
    # changes while it runs (docs/operations.md, "The embedded Redis's memory").
    embedded_redis_maxmemory: str = "25%"
    # Where `voxfarm up` keeps the embedded Redis, the store and `farm.json` (the state file
    # that tells the client commands where the farm listens: app/local/farmstate.py).
    var_dir: Annotated[str, Env("VOXFARM_VAR")] = "var"
    # The farm a client command (`voxfarm say`, `book render`) talks to; empty: the one in
    # var_dir's state file, else http://127.0.0.1:8000.
    server_url: Annotated[str, Env("VOXFARM_SERVER")] = ""
    # The pool a worker process serves (its queue), set by `voxfarm worker`; names its logs.
    role: str = ""
    # The share of jobs whose log lines are kept, 0..1 (app/obs/logging_setup.py).
    log_sample_rate: Share = 1.0
    # prometheus_client's multiprocess files; empty: voxfarm-metrics-UID in the temp dir
    # (app/obs/multiproc.py).
    metrics_dir: str = ""
    # `voxfarm worker`: serve the pool's Prometheus metrics on this port (0: off).
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 0
    # gunicorn (ops/gunicorn.conf.py): where the web listens, how many workers, log level.
    bind: str = "127.0.0.1:8000"
    web_workers: Positive = 2
    log_level: str = "info"
    # One client's share of the web (ops/gevent_worker.py; docs/reliability.md, "One client's
    # connections"). Connections one client address may hold open at once across the web's
    # workers (0: no bound): each gevent worker has 1,000 places, and once they are taken
    # nobody else is served. 512 (256 a worker with the default two) leaves room for a
    # benchmark's 128 clients from one address even if all reach one worker, while one
    # address takes at most a quarter of a worker's places. Behind a load balancer that is
    # not a trusted proxy every client has its address: raise it there (docs/operations.md).
    web_max_conns_per_address: Count = 512
    # WebSockets open at once per API key (per client address while the farm has no keys),
    # across every web process (counted in Redis). Each holds a place and a greenlet for its
    # whole life; a browser tab needs one, a server fanning out text a few dozen.
    web_max_sockets_per_key: Count = 64
    # How long a connection may wait for a request's head, the first one included
    # (gunicorn's keepalive): idle keep-alive connections are closed after it, and a head
    # sent slowly (slowloris) is dropped at it. 5 s outlasts a client's pause between
    # requests and a slow network's head; the long waits of the API are inside requests.
    web_keepalive_s: Positive = 5
    # Reverse proxies whose X-Forwarded-For names the client (addresses or networks, comma
    # separated): their connections are not counted at accept time, their requests are, per
    # forwarded client. Empty (the default): X-Forwarded-For is never believed.
    web_trusted_proxies: str = ""
    # A listener of its own for /healthz and /readyz (0: off; they stay on the main port
    # too), which no user connection can fill: point the orchestrator's probes at it.
    web_health_port: Annotated[int, Field(ge=0, le=65535)] = 0


class SecuritySettings(_Group):
    # Flower's basic auth; `voxfarm flower` refuses to start without it (see the README, "Flower").
    flower_user: str = ""
    flower_password: SecretStr = SecretStr("")
    # HTTPS for the web: a PEM certificate (chain) and its key (ops/gunicorn.conf.py). Both
    # or neither; with neither the web speaks plain HTTP (behind a TLS-terminating proxy).
    tls_cert: str = ""
    tls_key: str = ""
    # API keys (app/security/apikeys.py; `voxfarm keys`): per-key defaults for requests a minute and
    # jobs or books running at once (a key's own limits win); 0 turns a limit off. The CLI's
    # own key, sent as a Bearer token when the farm has keys.
    key_rate_per_min: Count = 600
    key_max_active: Count = 16
    # Long-polls and streams one key has open at once, across the web processes (with keys
    # off: one client address); past it 429 too_many_waits (app/stores/waits.py). A listener
    # needs one or two per job and a key runs key_max_active (16) at once; 128 leaves room for
    # a backend relaying its users' streams through one key, yet one key holds at most 128 of
    # the web's 2 x 1000 connections. 0 turns it off.
    key_max_waits: Count = 128
    api_key: SecretStr = SecretStr("")
    # With keys on, /metrics, /docs and /openapi.json need a key too (a Prometheus scrape
    # then sends one: `authorization: {credentials: ...}` in its scrape config).
    auth_ops: bool = False
    # With keys on, cached features serve only the key whose work made them: a hit would tell
    # one key what another said (a faster job, `mel_cache.hits`). True shares them across the
    # farm, for deployments whose texts are all public (fewer model runs for repeated text).
    share_feature_cache: bool = False
    # Encryption at rest (app/security/sealing.py): `id:base64key,...`, 32-byte keys; the first
    # seals cached features, job chunks and book files, every one opens (rotation: put the new
    # key first, keep the old behind it until what it sealed has expired). Empty: nothing
    # sealed. Parsed when the settings are built, so a bad keyring stops the process at boot.
    at_rest_keys: SecretStr = SecretStr("")


class CanarySettings(_Group):
    # The voice canary (app/canary/, docs/models.md "Voice versions and the canary"): the
    # share of interactive jobs a voice's candidate version renders (sticky per job: a hash of
    # the job id), and the share of finished segments of both versions the quality pool
    # scores. 5% is the deployment checklist's canary; scoring a fifth keeps the quality pool
    # (pocketsphinx, about 0.1 s of CPU a segment) far behind the voice pools in cost.
    canary_share: Share = 0.05
    canary_sample_share: Share = 0.2
    # The decision rule (app/canary/ `decide`): promote once both versions have this many
    # scored segments, if the candidate's word error rate is at most this much above live's
    # (absolute), its clipping and silence shares at most these much above, and each stage's
    # p99 run time at most this many times live's (differences under the slack ignored: a
    # cache hit's 2 ms against 3 ms is no regression). Roll back past any of them, and at
    # once when its segments' failure ratio passes the last.
    canary_min_scored: Positive = 20
    canary_max_wer_increase: Share = 0.02
    canary_max_clipping_increase: Share = 0.01
    canary_max_silence_increase: Share = 0.15
    canary_max_latency_ratio: Annotated[float, Field(gt=0.0)] = 1.2
    canary_latency_slack_s: Seconds = 0.05
    canary_max_failure_ratio: Share = 0.01


class ZoneSettings(_Group):
    # Zones (app/zones/, docs/operations.md "Zones"): farms that know their peers and send
    # them the work they cannot take. This farm's name prefixes the ids of its jobs and books
    # (`b-3f2a...`), so any farm of the set knows which one owns an id; empty: ids as before,
    # a lone farm. Required when `peers` is set.
    farm_name: str = ""
    # The other farms of the set, "name=url,name=url" ("b=http://127.0.0.1:8100"): parsed
    # and checked when the settings are built (app/zones/ids.py, `parse_peers`).
    peers: str = ""
    # The secret the farms of a set share: sent to peers, accepted from them. With peers set,
    # this or a client certificate (peer_cert, mutual TLS) is required.
    peer_key: SecretStr = SecretStr("")
    # The CA that verifies peers' HTTPS (and, on this web's TLS listener, peers' client
    # certificates); empty: the system's CAs. This farm's client certificate and its key for
    # calling peers (mutual TLS); the key may be in the certificate's file.
    peer_ca: str = ""
    peer_cert: str = ""
    peer_cert_key: str = ""
    # Each peer's /readyz is probed this often; a peer that did not answer within
    # peer_timeout_s (probe and connect alike) is unreachable and skipped until a probe
    # finds it ready. Two seconds: a farm that fails over is found within about two probes,
    # and a probe costs the peer one Redis ping and a few heartbeat reads.
    peer_check_s: PositiveSeconds = 2.0
    peer_timeout_s: PositiveSeconds = 2.0
    # How long an Idempotency-Key's answer is remembered: a day outlasts any client's
    # retries of one request.
    idempotency_ttl_s: Positive = 86400
