"""Per-process state of a worker: the farm's stores and the loaded models.

Models load lazily, once per process, after the fork (CUDA is not fork-safe, and the parent
of a prefork pool never runs a task). `workers/` sets the device and, for the acoustic and
vocoder pools, preloads on `worker_process_init`; the book pool runs no model but warms its
text frontend at start (`warm_frontend`); a task that runs first simply loads on first use.

It also holds the GPU memory rule's probe (`short_of_memory`): the segment tasks ask it before
each forward pass, and `workers/` asks it every few seconds from each pool process, after the
fork too, since probing CUDA in a prefork parent would initialise CUDA before it forks.
"""

from __future__ import annotations

import functools
import logging
import os
import threading

from app.broker.stages import Stage
from app.farm import Farm
from app.settings import Settings
from tasks import cores

_lock = threading.RLock()
_state: dict = {"pid": None}
_device: str | None = None  # None: the settings' (VOXFARM_DEVICE)
_threads = 0  # torch intra-op threads per process; 0 keeps torch's default (one per core)


def configure(device: str, threads: int = 0) -> None:
    global _device, _threads
    _device, _threads = device, threads
    os.environ["VOXFARM_DEVICE"] = device  # for any process this one starts


def settings(celery=None) -> Settings:
    """The worker's settings: read once by its entry point (`voxfarm worker`) and kept on its
    Celery app by `make_celery`, which a forked pool process inherits."""
    from celery import current_app  # celery's proxy to the app this process made

    found = getattr(celery or current_app, "voxfarm_settings", None)
    if found is None:
        raise RuntimeError("no settings: build the worker's app with make_celery(settings)")
    return found


def device() -> str:
    """Where this process's models run: the worker's `--device`, else the settings'."""
    return _device or settings().device


def _mine() -> dict:
    if _state["pid"] != os.getpid():  # a forked child starts with nothing of its parent's
        _state.clear()
        _state["pid"] = os.getpid()
    return _state


def farm(celery=None) -> Farm:
    st = _mine()
    if "farm" not in st:
        with _lock:
            if "farm" not in st:
                chosen = settings(celery)
                from models.voices import use_voices_dir  # torch-free; kept beside its use

                use_voices_dir(chosen.voices_dir)
                st["farm"] = Farm(chosen, celery)
    return st["farm"]


def model_for(stage: Stage, voice):
    """The model of `stage` (acoustic or vocoder) that renders `voice` (a models.voices.Voice),
    loaded once per process for every voice its engine says shares it (`model_key`)."""
    # torch-free; the engine imports its model code inside `load`, after the fork
    from models.voices import Loading, backend_for

    backend = backend_for(voice)
    st = _mine()
    key = backend.model_key(stage, voice)
    if key not in st:
        with _lock:
            if key not in st:
                chosen = farm().settings
                st[key] = backend.load(stage, voice, Loading(
                    device=device(), engine=engine_config(chosen),
                    classic_acoustic=chosen.acoustic_model, classic_vocoder=chosen.vocoder))
    return st[key]


def engine_config(settings: Settings | None = None):
    """How this process runs its neural models (models/engine.py): the settings' engine and
    cache, and the pool's threads (one unless the worker says otherwise)."""
    # the engine (torch, openvino) loads only in the pools, after the fork
    from pathlib import Path

    from models.engine import EngineConfig

    settings = settings or farm().settings
    cache = settings.engine_cache or str(Path(settings.var_dir) / "engine-cache")
    return EngineConfig(settings.engine, cache, threads=_threads or 1,
                        acoustic_precision=settings.acoustic_precision,
                        vocoder_precision=settings.vocoder_precision)


def acoustic_for(voice):
    """The acoustic model that renders `voice` (a models.voices.Voice)."""
    return model_for(Stage.ACOUSTIC, voice)


def vocoder_for(voice):
    """The vocoder that renders `voice`'s features."""
    return model_for(Stage.VOCODER, voice)


def warm_up(queue: str) -> None:
    """Load every model of `queue`'s stage and run each once on a short input.

    Each model the voices on offer share is loaded and run once (one for every eSpeak voice,
    one a neural voice file). The models an engine must have (`required`: eSpeak's, every
    pool's fallback) go first, and their failure stops the warm-up; any other voice whose
    files cannot be loaded is logged with the reason and skipped: the other voices still
    serve, and a job for the broken one fails with that reason. Once done, this process
    counts in `voxfarm_model_processes_warm`.
    """
    if _threads > 0:
        # torch loads in the model pools, after the fork (CUDA is not fork-safe)
        import torch

        torch.set_num_threads(_threads)

    # torch-free; each engine imports its model code as it loads
    from models.voices import backend_for, list_voices

    chosen = farm().settings  # reads the settings, the voices directory among them
    log = logging.getLogger("voxfarm.workers")
    stage = Stage.ACOUSTIC if queue == Stage.ACOUSTIC else Stage.VOCODER
    # Every model process of the farm counts its passes in the host's ledger; a vocoder pass
    # on an otherwise idle host takes the idle cores (tasks/cores.py).
    cores.configure(cores.Config(cores.ledger_path(chosen.redis_url, chosen.key_prefix),
                                 narrow=_threads or 1, cap=chosen.wide_threads,
                                 on_cpu=device() == "cpu"))
    warmed: set[str] = set()
    # Engines that load on first use (the setting lazy_engines) are left cold here.
    lazy = {name.strip() for name in chosen.lazy_engines.split(",") if name.strip()}
    voices = sorted(list_voices(), key=lambda voice: not backend_for(voice).required)
    for voice in voices:
        backend = backend_for(voice)
        key = backend.model_key(stage, voice)
        if key in warmed or (backend.name in lazy and not backend.required):
            continue
        warmed.add(key)
        if backend.required:
            cores.warm_up(stage, functools.partial(backend.warm_up, stage,
                                                   model_for(stage, voice)))
            continue
        try:
            cores.warm_up(stage, functools.partial(backend.warm_up, stage,
                                                   model_for(stage, voice)))
        except Exception as exc:  # a broken voice file must not stop the others
            log.error("voice %s cannot be loaded: %s", voice.name, exc)
    # after multiproc.prepare(): prometheus_client picks its mode when first imported
    from app.obs import metrics

    metrics.MODELS_WARM.set(1)


# A sentence through the whole text frontend (normaliser, segmenter, the voice's G2P).
_FRONTEND_WARM_TEXT = "Hello, this sentence warms the text frontend up."


def warm_frontend(voice: str) -> None:
    """Load what a book's first `prepare` would, in the book pool: the text frontend (the
    normaliser, libespeak-ng, the segmenter) and `voice`'s G2P (hibari's lexicon and model),
    by planning one sentence in the frontend thread that plans books (app/offload.py). At a
    farm's start, beside the model pools loading theirs, that took a first book 16 s of
    `preparing`. A voice that cannot be planned is logged and skipped: its books fail with
    the reason. Once done (or skipped), this process counts in
    `voxfarm_model_processes_warm`."""
    # the frontend loads here, in the book pool, never in the CLI or the web's import
    import time

    from app.offload import offload
    from models.text.frontend import iter_segments

    log = logging.getLogger("voxfarm.workers")
    started = time.monotonic()
    try:
        # No bound: nothing waits on it but the pool's own first plan, which would pay it.
        offload("frontend", lambda: list(iter_segments(_FRONTEND_WARM_TEXT, voice)),
                timeout_s=None)
    except Exception as exc:  # a broken voice must not stop the pool
        log.error("text frontend for voice %s cannot be loaded: %s", voice, exc)
    else:
        log.info("text frontend warm for voice %s in %.1f s", voice,
                 time.monotonic() - started)
    # after multiproc.prepare(): prometheus_client picks its mode when first imported
    from app.obs import metrics

    metrics.MODELS_WARM.set(1)


# -- the GPU memory rule (docs/operations.md, "GPU memory") ----------------------------------


def parse_memory_probe(value: str) -> float | None:
    """The free share a `memory_probe` setting fixes ("fixed:0.05" -> 0.05), or None (empty:
    measure the device). Anything else is refused, naming the variable."""
    if not value:
        return None
    kind, _, share = value.partition(":")
    try:
        fixed = float(share)
    except ValueError:
        fixed = -1.0
    if kind != "fixed" or not 0.0 <= fixed <= 1.0:
        raise ValueError(f"VOXFARM_MEMORY_PROBE={value!r}: expected fixed:F, F from 0 to 1")
    return fixed


def memory_ruled(chosen: Settings | None = None) -> bool:
    """Whether this process's device is under the GPU memory rule: a CUDA device, or any whose
    probe the settings fix (tests, drills). Such a worker never consumes an overflow queue: it
    would take back what it handed on."""
    chosen = chosen or settings()
    return device().startswith("cuda") or parse_memory_probe(chosen.memory_probe) is not None


def free_fraction() -> float:
    """The share of this process's device memory a forward pass can use, 0..1: what the driver
    reports free plus what torch's caching allocator holds reserved but unused (this process's
    to reuse; the driver counts it as taken), over the device's total. 1.0 on a CPU device;
    the settings' `memory_probe` answers instead of the device when set."""
    fixed = parse_memory_probe(farm().settings.memory_probe)
    if fixed is not None:
        return fixed
    dev_name = device()
    if not dev_name.startswith("cuda"):
        return 1.0
    # torch loads in the model pools, after the fork (CUDA is not fork-safe)
    import torch

    dev = torch.device(dev_name)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(index)
    spare = torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
    return min(1.0, (free + spare) / total)


def short_of_memory(stage: str, worker: str) -> bool:
    """Probe the device before a forward pass of `stage`: True when it must not run here now
    (less than `gpu_min_free` free). What the probe saw goes to the free-memory gauge and to
    the worker's short mark, which admission and /readyz read. Always False for a worker
    outside the rule (a CPU pool), without a probe."""
    chosen = farm().settings
    if not memory_ruled(chosen):
        return False
    free = free_fraction()
    short = free < chosen.gpu_min_free
    # after multiproc.prepare(): prometheus_client picks its mode when first imported
    from app.obs import metrics

    metrics.GPU_MEMORY_FREE.labels(worker, device()).set(free)
    try:
        farm().liveness.mark_short(stage, worker, short)
    except Exception:  # the mark is advice for admission: the rule holds without it
        logging.getLogger("voxfarm.workers").warning("could not mark %s short=%s", worker,
                                                     short, exc_info=True)
    return short
