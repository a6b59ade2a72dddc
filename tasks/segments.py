"""The two stages of a segment: acoustic (phonemes -> cached mel) and vocoder (mel -> chunk).

Both are thin: they take the small segment message (app/broker/messages.py, read once at
the task's entry), call `models/` and the stores, and return a key or an index. What differs
between a job's segment and a book's is the owner's to do (tasks/owners.py).
Both are idempotent, so at-least-once delivery never loses or duplicates a segment: the mel
cache is keyed by content, and a chunk is stored by its index.

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
from app.broker.messages import Segment, job_place, owner_of, segment_in
from app.broker.queueing import continue_segment, hand_over, publish_again
from app.broker.stages import Stage
from app.obs import metrics
from app.stores.features import (
    cache_owner,
    features_seed,
    mel_cache_key,
    mel_from_bytes,
    mel_to_bytes,
    noise_seed,
    scoped_key,
)
from models.errors import SpeechError
from models.voices import backend_for
from tasks import batching, canary, runtime
from tasks.base import FarmTask, NoRoom
from tasks.owners import side_of

log = logging.getLogger("voxfarm.tasks")

# A mel that expired between the stages is recomputed by re-running the segment's chain;
# past this many regenerations the cache TTL is too short for the queue and the job fails.
MAX_REGENERATIONS = 3

# A segment after a job's first that the window plan cuts into at most this many windows is
# rendered and stored whole, as one chunk. Each window renders context frames on both sides
# and is a call of its own: a one-sentence segment's three windows cost the hibari voice
# 16-18 ms more CPU than its whole decode, a fifth of its model work (docs/benchmarks.md,
# "Per-segment fixed cost"). The audio before such a segment is already playing, so its
# first window would gain the listener nothing; the job's first segment keeps its windows for
# first audio, and a longer segment keeps them, so each part is ready before the one before
# it has played.
WHOLE_UP_TO_WINDOWS = 3

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
        place = job_place(segment_in(args))
        if place is not None:
            job_id, index = place
            runtime.farm().jobs.ledger.mark_queued(job_id, ledger_kind(sender, kwargs), index)
    except Exception:  # noqa: BLE001  (the publish happened; the ledger is a count)
        log.warning("a published segment was not marked in the admission ledger",
                    exc_info=True)


def install() -> None:
    """Mark what this worker publishes in the admission ledger (once per process)."""
    signals.after_task_publish.connect(_published, weak=False,
                                       dispatch_uid="voxfarm-admission-ledger")


class SegmentTask(FarmTask):
    """A segment stage: a failure that outlived its retries fails the job (or the book)."""

    abstract = True

    def on_failure(self, exc, task_id, args, kwargs, einfo) -> None:
        message = args[-1] if args else kwargs.get("spec")
        if owner_of(message) is None:
            return
        try:
            seg = Segment.from_message(message)
        except ValueError:
            log.error("a segment task failed with a message it could not read: %s", exc)
            return
        side_of(seg).failed(self.farm, seg, exc)


def _run_here_or_hand_over(task: SegmentTask, stage: str, seg: Segment, args: tuple,
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
    queue = farm.liveness.room_for(stage, seg.is_book, worker) if reroutes < limit else None
    if queue is None:
        metrics.SEGMENTS_REROUTED.labels(stage, "gpu_memory", "none").inc()
        if reroutes < limit:
            raise NoRoom(f"no {stage} worker has the GPU memory for it and no CPU pool is live")
        raise NoRoom(f"handed on {reroutes} times and no {stage} worker had the GPU memory")
    hand_over(task.app, task.name, args, {**kwargs, "reroutes": reroutes + 1}, queue=queue,
              chain=list(task.request.chain or ()))
    to = "cpu" if queue in OVERFLOW_QUEUES.values() else "gpu"
    metrics.SEGMENTS_REROUTED.labels(stage, "gpu_memory", to).inc()
    log.warning("segment %s: %s is short of GPU memory; its %s stage went to %s",
                seg.describe(), worker, stage, queue)
    raise Ignore()  # handed on: the rest of the chain travels with the new message


@shared_task(name=ACOUSTIC_TASK, base=SegmentTask, bind=True)
def synthesize(self: SegmentTask, spec: dict, reroutes: int = 0, **_: object) -> str:
    """Phonemes -> mel in the cache. Returns the cache key for the vocoder. `reroutes`: how
    often workers short of GPU memory handed this stage on already."""
    with batching.working(Stage.ACOUSTIC):
        return _synthesize(self, Segment.from_message(spec), reroutes)


def _synthesize(task: SegmentTask, seg: Segment, reroutes: int) -> str:
    farm = task.farm
    side = side_of(seg)
    if not side.wanted(farm, seg, Stage.ACOUSTIC, run=True):
        # A job canceled, failed or expired, a book stopped or with the segment stored
        # already: the rest of the chain never runs.
        raise Ignore()
    # UnknownVoice is a SpeechError: the job fails at once. The segment's voice version (the
    # canary's) picks the file and inference settings.
    voice = canary.voice_for(farm, seg)
    backend = backend_for(voice)
    model = runtime.acoustic_for(voice)
    # The key names the model (and, where one model renders many voices, a version's
    # styles: `features_id`), so a hit is always this model's features; the speaker is part
    # of the voice name ("NAME:SPEAKER"). With API keys on it is the owner's alone.
    content = mel_cache_key(backend.features_id(model, voice), seg.phonemes, seg.voice,
                            seg.speed)
    digest = scoped_key(content, cache_owner(farm, seg))
    # The entry holds the timing beside the features, which the vocoder stage turns into word
    # timestamps, hit or miss: a neural voice's frames per phoneme id, eSpeak's word starts.
    timed = backend.timed(model)
    hit = farm.mel_cache.touch(digest, durations=timed)
    task.request.mel_cache_hit = hit  # the canary times a version's model on misses only
    blob: bytes | None = None
    durations: list[int] | None = None
    if not hit:
        _run_here_or_hand_over(task, Stage.ACOUSTIC, seg, (seg.to_message(),), {}, reroutes)
        # An engine that draws noise seeds it by the key: the same request renders the same
        # audio, hit or miss. Batched with other segments where the pool batches.
        # A shaped voice's rate multiplies the request's speed (every engine applies it
        # there); the key covers it, as the spec in `seg.voice` names the rate.
        features, durations = _batched(Stage.ACOUSTIC, backend.acoustic_batch(
            model, voice, seg.phonemes, seg.voice, seg.speed * voice.shape.rate,
            noise_seed(content)))
        blob = mel_to_bytes(features)
    # Put (on a miss), hold for the vocoder stage (which releases it) and count, in one
    # round trip.
    farm.mel_cache.hand_on(digest, hit, blob, durations)
    side.counted(farm, seg, hit)
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
        return _render(self, mel_key, Segment.from_message(spec), regenerations, reroutes,
                       from_window, spent_s)


def _render(task: SegmentTask, mel_key: str, seg: Segment, regenerations: int,
            reroutes: int, from_window: int, spent_s: float) -> int:
    started = time.perf_counter()
    farm = task.farm
    side = side_of(seg)
    if not side.wanted(farm, seg, Stage.REST if from_window else Stage.VOCODER):
        # Stored already (a twin publish of the feeder) or canceled: the acoustic stage
        # held the features for this stage, so let go of them here too.
        farm.mel_cache.release(mel_key, seg)
        raise Ignore()
    # The features and their durations (the word timestamps') in one round trip.
    blob, durations = farm.mel_cache.get_with_durations(mel_key)
    if blob is None:
        # Gone before this stage read it (expired, or a book twin's release dropped it between
        # this segment's hit and its hold): let go of this stage's hold, as the stage run
        # again holds afresh, or the count never comes back to nought and the entry stays.
        farm.mel_cache.release(mel_key, seg)
        if regenerations >= MAX_REGENERATIONS:
            raise SpeechError("the mel expired from the cache before the vocoder ran")
        publish_again(farm.celery, seg, regenerations)
        raise Ignore()
    _run_here_or_hand_over(task, Stage.VOCODER, seg, (mel_key, seg.to_message()),
                           {"regenerations": regenerations, "from_window": from_window,
                            "spent_s": spent_s}, reroutes)
    voice = canary.voice_for(farm, seg)
    vocoder = runtime.vocoder_for(voice)
    features = mel_from_bytes(blob).to(vocoder.device)
    backend = backend_for(voice)
    # A decoder that adds noise (hibari's source-filter) seeds it from the cached features,
    # which the segment's content names (app/stores/features.py).
    seed = features_seed(blob) if backend.decoder_noise else 0
    pause = np.zeros(int(vocoder.sample_rate * seg.pause_ms / 1000), dtype=np.float32)
    # A job's audio may stream window by window; a book's goes to the artifact store whole.
    if side.streams and backend.streams_windows and (
            from_window or farm.settings.vocoder_window_frames):
        words = _word_times(vocoder, voice, durations, seg)
        rest = _stream_windows(farm, vocoder, voice, features, seg, pause, words, from_window,
                               seed)
        if rest is not None:  # it gave way: the rest reads the features this stage holds
            continue_segment(farm.celery, mel_key, seg, rest,
                             queue=_rest_queue(farm.settings),
                             regenerations=regenerations,
                             spent_s=spent_s + time.perf_counter() - started)
            metrics.VOCODER_YIELDS.inc()
            # The segment is not done: the hooks count it when its rest is (observability,
            # canary).
            task.request.gave_way = True
            return seg.index
    else:
        audio = _vocode_piece(vocoder, voice, features, seed=seed)
        words = _word_times(vocoder, voice, durations, seg, len(audio))
        side.store(farm, seg, _pcm(audio, pause), vocoder.sample_rate, words)
    farm.mel_cache.release(mel_key, seg)
    return seg.index


def _pcm(audio: np.ndarray, pause: np.ndarray | None = None) -> bytes:
    # torch loads on first use: the book and quality pools import this too
    from models.audio.encode import pcm16

    if pause is not None and len(pause):
        audio = np.concatenate([audio, pause])
    return pcm16(audio).tobytes()


def _batched(stage: Stage, work):
    """The result of a forward pass an engine describes (models.voices.Batch), in a batch
    with other segments' (or windows') of the same key where the pool batches
    (tasks/batching.py); at once for a model that does not batch."""
    return batching.run(stage, work.key, work.run, work.item)


def _vocode_piece(vocoder, voice, features, piece=None, seed: int = 0) -> np.ndarray:
    """The audio of a window of `features` (the whole segment when `piece` is None), in a
    batch with other segments' windows or wholes where the pool batches. `seed`: the
    decoder's noise (an engine whose decoder draws none ignores it)."""
    audio = _batched(Stage.VOCODER,
                     backend_for(voice).vocode_batch(vocoder, voice, features, piece, seed))
    return audio.float().cpu().numpy()


def _word_times(vocoder, voice, durations: list[int] | None, seg: Segment,
                samples: int = 0) -> list[dict]:
    """The segment's words with their start and end in seconds of its audio (`samples`
    long, pause excluded): for a neural voice, the model's durations (cached with the
    features) summed over each word's phonemes, which the frontend found (`seg.words`,
    see models/text/words.py); for eSpeak, its own word starts. `durations`: those cached
    with the features (`MelCache.get_with_durations`). Empty for a message from before word
    timestamps."""
    if not seg.words:
        return []
    if durations is None:
        log.warning("segment %s: no timing cached; no word timestamps", seg.describe())
        return []
    # read where a vocoder stage times a segment's words
    from models.text.words import WordSpan

    spans = [WordSpan.from_list(item) for item in seg.words]
    return backend_for(voice).word_times(vocoder, seg.phonemes, spans, durations, samples)


def _stream_windows(farm, vocoder, voice, features, seg: Segment, pause: np.ndarray,
                    words: list[dict], start: int = 0, seed: int = 0) -> int | None:
    """Vocode the segment window by window from window `start`, storing each as a chunk the
    moment it exists. Returns None when its last window is stored, or the window it stopped
    before to give way to listeners waiting for their first audio (`_give_way`): once a
    segment, after its first window. Its rest then renders to the end. (A rest that gave way
    again at every window would share the process round robin, at a task's overhead a turn;
    docs/benchmarks.md, "Load", has what each cost.)

    The window plan is the segment's first writer's (a retry on a worker with another
    window setting cuts the same windows), and each window is rendered with context frames
    on both sides, so the windows joined equal the whole segment's audio. A short segment
    after the job's first is planned as one window, the whole decode (WHOLE_UP_TO_WINDOWS).
    Each window carries the words that start in it.
    """
    frames = int(features.shape[-1])
    window = farm.settings.vocoder_window_frames or frames  # a plan set before stands
    cut = vocoder.windows(frames, window)
    if seg.index > 0 and len(cut) <= WHOLE_UP_TO_WINDOWS:
        window = frames  # one window: the whole decode
        cut = vocoder.windows(frames, window)
    _, planned = farm.jobs.window_plan(seg.owner_id, seg.index, (len(cut), window))
    if planned != window:  # a retry on a worker with another setting cuts the same windows
        window, cut = planned, vocoder.windows(frames, planned)
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
        stored = farm.jobs.store_window(seg.owner_id, seg.index, w,
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
