"""Per-process state of a worker: the farm's stores and the loaded models.

Models load lazily, once per process, after the fork (CUDA is not fork-safe, and the parent
of a prefork pool never runs a task). `workers/` sets the device and preloads on
`worker_process_init`; a task that runs first simply loads on first use.
"""

from __future__ import annotations

import os
import threading

from app.farm import Farm
from app.settings import Settings

_lock = threading.RLock()
_state: dict = {"pid": None}
_device = os.environ.get("VOXFARM_DEVICE", "cpu")
_threads = 0  # torch intra-op threads per process; 0 keeps torch's default (one per core)


def configure(device: str, threads: int = 0) -> None:
    global _device, _threads
    _device, _threads = device, threads
    os.environ["VOXFARM_DEVICE"] = device


def device() -> str:
    return _device


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
                settings = getattr(celery, "voxfarm_settings", None) or Settings.from_env()
                st["farm"] = Farm(settings, celery)
    return st["farm"]


def acoustic_model():
    st = _mine()
    if "acoustic" not in st:
        with _lock:
            if "acoustic" not in st:
                from models.acoustic import load_acoustic

                st["acoustic"] = load_acoustic(farm().settings.acoustic_model, device=_device)
    return st["acoustic"]


def vocoder():
    st = _mine()
    if "vocoder" not in st:
        with _lock:
            if "vocoder" not in st:
                from models.vocoder import load_vocoder

                st["vocoder"] = load_vocoder(farm().settings.vocoder, device=_device)
    return st["vocoder"]


def warm_up(queue: str) -> None:
    """Load the model of `queue`'s stage and run it once on a short input."""
    if _threads > 0:
        import torch

        torch.set_num_threads(_threads)
    if queue == "acoustic":
        acoustic_model().synthesize("h@l'oU", "en-us", 1.0)
    else:
        import math

        import torch

        model = vocoder()
        cfg = model.mel_config
        silence = torch.full((cfg.n_mels, 32), math.log(cfg.log_floor), device=model.device)
        model.vocode([silence])
