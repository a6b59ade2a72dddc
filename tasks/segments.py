"""The two stages of a segment: acoustic (phonemes -> cached mel) and vocoder (mel -> chunk).

Both are thin: they take the small segment spec, call `models/` and the stores, and return a
key or an index. Both are idempotent, so at-least-once delivery never loses or duplicates a
segment: the mel cache is keyed by content, and a chunk is stored by its index.

Both obey the GPU memory rule before their forward pass (`_run_here_or_hand_over`): a worker
short of device memory hands the stage to a pool with room instead of running it.

Both keep the admission ledger (app/stores/ledger.py): each takes its message off the job's waiting
count as it starts (`JobStore.take`, which is also how it learns whether the job still wants
the segment), and what a worker publishes for the next stage (Celery sends a chain's vocoder
stage once the acoustic one returns; a segment's rest after it gave way) is marked waiting
once it is sent (`install`: Celery's after_task_publish signal, in the worker).
"""

from __future__ import annotations

import logging
import time

import numpy as np
from celery import shared_task, signals
from celery.exceptions import Ignore

from app.broker.celery_app import (
    ACOUSTIC_TASK,
    INTERACTIVE_QUEUES,
    OVERFLOW_QUEUES,
    VOCODER_LEAD_QUEUE,
    VOCODER_REST_QUEUE,
    VOCODER_TASK,
)
from app.broker.queueing import continue_segment, hand_over, publish_again
from app.broker.stages import Stage
from app.obs import metrics
from app.stores.melcache import mel_cache_key, scoped_key
from app.stores.states import JobState
from models.errors import SpeechError
from models.voices import HIBARI, NEURAL, PIPER
from tasks import batching, books, canary, runtime
from tasks.base import FarmTask, NoRoom

log = logging.getLogger("voxfarm.tasks")

# A mel that expired between the stages is recomputed by re-running the segment's chain;
# past this many regenerations the cache TTL is too short for the queue and the job fails.
MAX_REGENERATIONS = 3

# A job in one of these states (or gone: None) wants no more of its segments rendered.
_STOPPED = (None, JobState.CANCELED, JobState.FAILED)


# The queues admission counts (a stage's interactive queues): what a worker publishes there
# is marked in the ledger. The overflow queues and the books' batch queues are not counted.
_COUNTED_QUEUES = frozenset(INTERACTIVE_QUEUES)


def ledger_kind(task_name: str, kwargs: dict | None) -> Stage:
    """The ledger's kind of a segment message (app.stores.ledger.LEDGER_STAGES)."""
    if task_name == ACOUSTIC_TASK:
        return Stage.ACOUSTIC
    return Stage.REST if (kwargs or {}).get("from_window") else Stage.VOCODER


def _published(sender=None, body=None, routing_key=None, **_: object) -> None:
    """A worker sent a message of a job's segment to a counted queue: mark it waiting. A
    mark that fails leaves the message counted as live work: the safe side."""
    if sender not in (ACOUSTIC_TASK, VOCODER_TASK) or routing_key not in _COUNTED_QUEUES:
        return
    try:
        if isinstance(body, dict):  # task protocol 1
            args, kwargs = body.get("args") or (), body.get("kwargs") or {}
        else:  # protocol 2: (args, kwargs, embed)
            args, kwargs = body[0], body[1]
        spec = next((a for a in args if isinstance(a, dict) and "job_id" in a), None)
        if spec is not None:
            runtime.farm().jobs.ledger.mark_queued(spec["job_id"], ledger_kind(sender, kwargs),
                                            spec["index"])
    except Exception:  # noqa: BLE001  (the publish happened; the ledger is a count)
        log.warning("a published segment was not marked in the admission ledger",
                    exc_info=True)


def install() -> None:
    """Mark what this worker publishes in the admission ledger (once per process)."""
    signals.after_task_publish.connect(_published, weak=False,
                                       dispatch_uid="voxfarm-admission-ledger")


def noise_seed(digest: str) -> int:
    """A segment's noise seed, from its content's digest (hex): 60 bits, as torch seeds
    take. The same request renders the same audio whoever asks."""
    return int(digest[:15], 16)


def cache_owner(farm, spec: dict) -> str:
    """Whose features a segment may share (app/stores/melcache.py, `scoped_key`): the API key that
    made its job or book; "" for everyone's when there is none or the operator shares the
    cache. Work that is gone shares nothing."""
    if farm.settings.share_feature_cache:
        return ""
    if "book_id" in spec:
        owner = farm.books.owner(spec["book_id"])
    else:
        owner = farm.jobs.owner(spec["job_id"])
    return owner if owner is not None else f"gone:{spec.get('book_id') or spec['job_id']}"


class SegmentTask(FarmTask):
    """A segment stage: a failure that outlived its retries fails the job (or the book)."""

    abstract = True

    def on_failure(self, exc, task_id, args, kwargs, einfo) -> None:
        spec = args[-1] if args else kwargs.get("spec")
        if isinstance(spec, dict) and "book_id" in spec:
            books.segment_failed(self.farm, spec, exc)
        elif isinstance(spec, dict) and "job_id" in spec:
            message = f"segment {spec['index']}: {exc.__class__.__name__}: {exc}"
            self.farm.jobs.fail(spec["job_id"], message)
            log.error("job %s failed at %s", spec["job_id"], message)


def _run_here_or_hand_over(task: SegmentTask, stage: str, spec: dict, args: tuple,
                           kwargs: dict, reroutes: int) -> None:
    """The GPU memory rule, before a forward pass of `stage`: a worker short of device memory
    neither runs it nor falls back to its own CPU. It publishes the stage again as it came
    (the rest of the chain with it) for a pool with room (`Liveness.room_for`: a CPU pool's
    overflow queue, else another GPU worker) and stops here. With no pool that has room, or
    `max_reroutes` hand-overs behind it already, the segment fails with the reason (NoRoom).
    Returns when the stage may run here."""
    worker = task.request.hostname or ""
    if not runtime.short_of_memory(stage, worker):
        return
    farm = task.farm
    limit = farm.settings.max_reroutes
    queue = farm.liveness.room_for(stage, "book_id" in spec, worker) if reroutes < limit else None
    if queue is None:
        metrics.SEGMENTS_REROUTED.labels(stage, "gpu_memory", "none").inc()
        if reroutes < limit:
            raise NoRoom(f"no {stage} worker has the GPU memory for it and no CPU pool is live")
        raise NoRoom(f"handed on {reroutes} times and no {stage} worker had the GPU memory")
    hand_over(task.app, task.name, args, {**kwargs, "reroutes": reroutes + 1}, queue=queue,
              chain=list(task.request.chain or ()))
    to = "cpu" if queue in OVERFLOW_QUEUES.values() else "gpu"
    metrics.SEGMENTS_REROUTED.labels(stage, "gpu_memory", to).inc()
    log.warning("segment %s of %s: %s is short of GPU memory; its %s stage went to %s",
                spec["index"], spec.get("job_id") or spec.get("book_id"), worker, stage, queue)
    raise Ignore()  # handed on: the rest of the chain travels with the new message


@shared_task(name=ACOUSTIC_TASK, base=SegmentTask, bind=True)
def synthesize(self: SegmentTask, spec: dict, reroutes: int = 0, **_: object) -> str:
    """Phonemes -> mel in the cache. Returns the cache key for the vocoder. `reroutes`: how
    often workers short of GPU memory handed this stage on already."""
    with batching.working(Stage.ACOUSTIC):
        return _synthesize(self, spec, reroutes)


def _synthesize(task: SegmentTask, spec: dict, reroutes: int) -> str:
    farm = task.farm
    if "book_id" in spec:  # a book's segment: skip it if the book stopped or has it already
        if not books.segment_wanted(farm, spec):
            raise Ignore()
    elif farm.jobs.ledger.take(spec["job_id"], Stage.ACOUSTIC, spec["index"], run=True) in _STOPPED:
        raise Ignore()  # canceled, failed or expired: the rest of the chain never runs
    # UnknownVoice is a SpeechError: the job fails at once. The spec's voice version (the
    # canary's) picks the file and inference settings.
    voice = canary.voice_for(farm, spec)
    model = runtime.acoustic_for(voice)
    # The key names the model, so a hit is always this model's features; the speaker is part
    # of the voice name ("NAME:SPEAKER"). With API keys on it is the owner's alone.
    content = mel_cache_key(model.model_id, spec["phonemes"], spec["voice"], spec["speed"])
    digest = scoped_key(content, cache_owner(farm, spec))
    # The entry holds the timing beside the features, which the vocoder stage turns into word
    # timestamps, hit or miss: a neural voice's frames per phoneme id, eSpeak's word starts.
    timed = voice.engine in NEURAL or hasattr(model, "synthesize_timed")
    hit = farm.mel_cache.touch(digest, durations=timed)
    task.request.mel_cache_hit = hit  # the canary times a version's model on misses only
    if not hit:
        _run_here_or_hand_over(task, Stage.ACOUSTIC, spec, (spec,), {}, reroutes)
        # torch loads on first use: the book and quality pools import this too
        from models.classic.mel import mel_to_bytes

        durations = None
        if voice.engine == PIPER:
            # The noise of the VITS prior and duration predictor comes from a generator
            # seeded by the key: the same request renders the same audio, hit or miss.
            features, durations = _acoustic_piper(model, voice, spec, noise_seed(content))
        elif voice.engine == HIBARI:
            features, durations = _acoustic_hibari(model, spec)
        elif timed:
            features, durations = model.synthesize_timed(spec["phonemes"], spec["voice"],
                                                         spec["speed"])
        else:
            features = model.synthesize(spec["phonemes"], spec["voice"], spec["speed"])
        farm.mel_cache.put(digest, mel_to_bytes(features), durations)
    farm.mel_cache.hold(digest)  # the vocoder stage releases it
    farm.mel_cache.count(hit)
    if "job_id" in spec:
        farm.jobs.count_cache(spec["job_id"], hit)
    return digest


@shared_task(name=VOCODER_TASK, base=SegmentTask, bind=True)
def render(self: SegmentTask, mel_key: str, spec: dict, regenerations: int = 0,
           reroutes: int = 0, from_window: int = 0, spent_s: float = 0.0,
           **_: object) -> int:
    """Mel from the cache -> 16-bit PCM chunk `spec['index']` of the job. `reroutes`: how
    often workers short of GPU memory handed this stage on already (the features stay held
    for whichever worker runs it). `from_window`: where a segment that gave way to waiting
    listeners carries on (its windows before are stored); `spent_s`: how long its stage ran
    before it gave way (the run time admission estimates from is a whole segment's)."""
    with batching.working(Stage.VOCODER):
        return _render(self, mel_key, spec, regenerations, reroutes, from_window, spent_s)


def _render(task: SegmentTask, mel_key: str, spec: dict, regenerations: int,
            reroutes: int, from_window: int, spent_s: float) -> int:
    started = time.perf_counter()
    farm = task.farm
    if "book_id" in spec:
        wanted = books.segment_wanted(farm, spec)
    else:
        kind = Stage.REST if from_window else Stage.VOCODER
        wanted = farm.jobs.ledger.take(spec["job_id"], kind, spec["index"]) not in _STOPPED
    if not wanted:
        # Stored already (a twin publish of the feeder) or canceled: the acoustic stage
        # held the features for this stage, so let go of them here too.
        farm.mel_cache.release(mel_key, drop="book_id" in spec)
        raise Ignore()
    blob = farm.mel_cache.get(mel_key)
    if blob is None:
        # Gone before this stage read it (expired, or a book twin's release dropped it between
        # this segment's hit and its hold): let go of this stage's hold, as the stage run
        # again holds afresh, or the count never comes back to nought and the entry stays.
        farm.mel_cache.release(mel_key, drop="book_id" in spec)
        if regenerations >= MAX_REGENERATIONS:
            raise SpeechError("the mel expired from the cache before the vocoder ran")
        publish_again(farm.celery, spec, regenerations)
        raise Ignore()
    _run_here_or_hand_over(task, Stage.VOCODER, spec, (mel_key, spec),
                           {"regenerations": regenerations, "from_window": from_window,
                            "spent_s": spent_s}, reroutes)
    # torch loads on first use: the book and quality pools import this too
    from models.classic.mel import mel_from_bytes

    voice = canary.voice_for(farm, spec)
    vocoder = runtime.vocoder_for(voice)
    features = mel_from_bytes(blob).to(vocoder.device)
    # hibari's decoder adds seeded noise (the source-filter's noise part); its seed comes
    # from the cached features, which the segment's content names (models/hibari/stage.py).
    seed = 0
    if voice.engine == HIBARI:
        # torch loads only in the pools that run the voice
        from models.hibari.stage import seed_of

        seed = seed_of(blob)
    pause = np.zeros(int(vocoder.sample_rate * spec["pause_ms"] / 1000), dtype=np.float32)
    if "book_id" in spec:  # book audio goes to the artifact store, not Redis
        audio = _vocode_piece(vocoder, voice, features, seed=seed)
        words = _word_times(farm, vocoder, voice, mel_key, spec, len(audio))
        books.store_segment(farm, spec, _pcm(audio, pause), vocoder.sample_rate, words)
    elif voice.engine in NEURAL and (from_window or farm.settings.vocoder_window_frames):
        words = _word_times(farm, vocoder, voice, mel_key, spec)
        rest = _stream_windows(farm, vocoder, voice, features, spec, pause, words, from_window,
                               seed)
        if rest is not None:  # it gave way: the rest reads the features this stage holds
            continue_segment(farm.celery, mel_key, spec, rest, queue=_rest_queue(farm.settings),
                             regenerations=regenerations,
                             spent_s=spent_s + time.perf_counter() - started)
            metrics.VOCODER_YIELDS.inc()
            # The segment is not done: the hooks count it when its rest is (observability,
            # canary).
            task.request.gave_way = True
            return spec["index"]
    else:
        audio = _vocode_piece(vocoder, voice, features, seed=seed)
        words = _word_times(farm, vocoder, voice, mel_key, spec, len(audio))
        farm.jobs.store_chunk(spec["job_id"], spec["index"], _pcm(audio, pause), words)
    farm.mel_cache.release(mel_key, drop="book_id" in spec)
    return spec["index"]


def _pcm(audio: np.ndarray, pause: np.ndarray | None = None) -> bytes:
    # torch loads on first use: the book and quality pools import this too
    from models.audio.encode import pcm16

    if pause is not None and len(pause):
        audio = np.concatenate([audio, pause])
    return pcm16(audio).tobytes()


def _acoustic_piper(model, voice, spec: dict, seed: int) -> tuple:
    """A neural voice's latent and durations, in a batch with other segments of the same
    model, speed and speaker where the pool batches (tasks/batching.py)."""
    speed, speaker = spec["speed"], voice.speaker

    def run(items: list[tuple[str, int]]) -> list:
        return model.synthesize_timed_batch([p for p, _ in items], [s for _, s in items],
                                            speed, speaker, max_batch=len(items))

    return batching.run(Stage.ACOUSTIC, (model.model_id, speed, speaker), run,
                        (spec["phonemes"], seed))


def _acoustic_hibari(model, spec: dict) -> tuple:
    """hibari's frames and durations, in a batch with other segments of the same speed where
    the pool batches. Its acoustic half draws no noise: nothing to seed here."""
    speed = spec["speed"]

    def run(items: list[str]) -> list:
        return model.synthesize_timed_batch(items, speed)

    return batching.run(Stage.ACOUSTIC, (model.model_id, speed), run, spec["phonemes"])


def _vocode_piece(vocoder, voice, features, piece=None, seed: int = 0) -> np.ndarray:
    """The audio of a window of `features` (the whole segment when `piece` is None), in a
    batch with other segments' windows or wholes where the pool batches. `seed`: hibari's
    decoder noise (the Piper decoder draws none)."""
    if voice.engine == HIBARI:
        # torch loads only in the pools that run the voice
        from models.neural.hifigan import Window

        piece = piece or Window.whole(int(features.shape[-1]))

        def run_hibari(items: list) -> list:
            return vocoder.vocode_windows(items)

        audio = batching.run(Stage.VOCODER, vocoder.model_id, run_hibari,
                             (features, piece, seed))
    elif voice.engine == PIPER:
        if piece is None:
            # torch loads on first use: the book and quality pools import this too
            from models.neural.hifigan import Window

            piece = Window.whole(int(features.shape[-1]))

        def run(items: list) -> list:
            return vocoder.vocode_windows(items, max_batch=len(items))

        audio = batching.run(Stage.VOCODER, vocoder.model_id, run,
                             (features, piece, voice.speaker))
    else:
        audio = batching.run(Stage.VOCODER, vocoder.model_id, vocoder.vocode, features)
    return audio.float().cpu().numpy()


def _word_times(farm, vocoder, voice, mel_key: str, spec: dict,
                samples: int = 0) -> list[dict]:
    """The segment's words with their start and end in seconds of its audio (`samples`
    long, pause excluded): for a neural voice, the model's durations (cached with the
    features) summed over each word's phonemes, which the frontend found (`spec["words"]`,
    see models/text/words.py); for eSpeak, its own word starts. Empty for a spec from before word
    timestamps."""
    if not spec.get("words"):
        return []
    durations = farm.mel_cache.get_durations(mel_key)
    if durations is None:
        log.warning("segment %s of %s: no timing cached; no word timestamps",
                    spec["index"], spec.get("job_id"))
        return []
    # torch loads on first use: the book and quality pools import this too
    from models.neural.voice_file import ids_and_positions
    from models.text.words import WordSpan, espeak_word_times, word_times

    if voice.engine == HIBARI:
        # Frames per id, as for a Piper voice; one frame is 300 samples at 24 kHz.
        from models.hibari.stage import word_positions

        spans = [WordSpan.from_list(item) for item in spec["words"]]
        return word_times(spans, spec["phonemes"], word_positions(spec["phonemes"], durations),
                          durations, vocoder.hop_length / vocoder.sample_rate)
    if voice.engine != PIPER:
        spans = [WordSpan.from_list(item) for item in spec["words"]]
        return espeak_word_times(spans, durations, len(spec["phonemes"]),
                                 samples / vocoder.sample_rate)
    config = vocoder.voice.config
    _, positions = ids_and_positions(spec["phonemes"], config)
    spans = [WordSpan.from_list(item) for item in spec["words"]]
    return word_times(spans, spec["phonemes"], positions, durations,
                      vocoder.voice.hop_length / config.sample_rate)


def _stream_windows(farm, vocoder, voice, features, spec: dict, pause: np.ndarray,
                    words: list[dict], start: int = 0, seed: int = 0) -> int | None:
    """Vocode the segment window by window from window `start`, storing each as a chunk the
    moment it exists. Returns None when its last window is stored, or the window it stopped
    before to give way to listeners waiting for their first audio (`_give_way`): once a
    segment, after its first window. Its rest then renders to the end. (A rest that gave way
    again at every window would share the process round robin, at a task's overhead a turn;
    docs/benchmarks.md, "Load", has what each cost.)

    The window plan is the segment's first writer's (a retry on a worker with another
    window setting cuts the same windows), and each window is rendered with context frames
    on both sides, so the windows joined equal the whole segment's audio. Each window
    carries the words that start in it.
    """
    frames = int(features.shape[-1])
    window = farm.settings.vocoder_window_frames or frames  # a plan set before stands
    plan = (len(vocoder.windows(frames, window)), window)
    _, window = farm.jobs.window_plan(spec["job_id"], spec["index"], plan)
    cut = vocoder.windows(frames, window)
    hop, rate = vocoder.hop_length, vocoder.sample_rate
    segment_samples = frames * hop + len(pause)
    for w, piece in enumerate(cut[start:], start):
        if w == 1 and start == 0 and _give_way(farm):
            return w
        audio = _vocode_piece(vocoder, voice, features, piece, seed)
        last = w == len(cut) - 1
        mine = [word for word in words
                if (w == 0 or word["start"] * rate >= piece.start * hop)
                and (last or word["start"] * rate < piece.end * hop)]
        stored = farm.jobs.store_window(spec["job_id"], spec["index"], w,
                                        _pcm(audio, pause if last else None),
                                        (len(cut), window), mine, piece.start * hop,
                                        segment_samples)
        if stored == -1:
            raise Ignore()  # canceled or failed meanwhile: the rest is not wanted
    return None


def _rest_queue(settings) -> str:
    """Where the rest of a segment that gave way waits. On Redis, `vocoder_rest`: a worker
    BRPOPs its queues in order, so a first window on the lead queue always goes first, even
    one that came after the rest. RabbitMQ delivers each queue's next message to a worker as
    soon as that queue's prefetch slot is free, whatever the order of its queues: the rest on
    a queue of its own reached the worker while the lead queue's slot was still held by the
    segment that gave way, and ran before the first window that had waited. There the rest
    goes to the back of the lead queue, behind the first windows already waiting."""
    return VOCODER_LEAD_QUEUE if settings.broker_is_amqp else VOCODER_REST_QUEUE


def _give_way(farm) -> bool:
    """Whether a segment after its first window should let others go first: the setting is
    on and work waits on the vocoder lead queue (jobs' first segments; on RabbitMQ also the
    rests of segments that gave way, `_rest_queue`). A broker that does not answer says no:
    the segment carries on."""
    if not farm.settings.vocoder_yield:
        return False
    try:
        return farm.backlog.queue_depth(VOCODER_LEAD_QUEUE) > 0
    except Exception as exc:  # noqa: BLE001  (the depth is a hint; rendering goes on)
        log.debug("no vocoder lead depth (%s); the segment carries on", exc)
        return False
