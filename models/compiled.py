"""A compiled OpenVINO graph, and the thread count this process's forward passes run at.

The pools share the host's cores, each process at one inference thread, but a vocoder pass
alone on the host takes the idle cores too (tasks/cores.py picks the count per pass and calls
``use_threads``). torch sizes its intra-op pool at any time; OpenVINO fixes a compiled
model's ``INFERENCE_NUM_THREADS`` when it compiles, so a ``CompiledGraph`` compiles itself
again for each count it is called at (once, on first use; from the blob cache well under a
second) and keeps each variant.

The count changes the time, and for most graphs not the numbers: the hibari decoder, at f32
and at int8, gives equal arrays at one thread and two, and so does every eager torch model
tried. The Piper voice's compiled HiFi-GAN decoder does not (a few samples a sentence move by
one 16-bit step at two threads), and a request must give the same bytes however busy the host
was, so its graph is built with ``widens=False`` and keeps the pool's count
(tests/unit/test_cores.py holds both).

Concurrency: ``use_threads`` and the graphs are called from the one thread that runs the
process's forward passes (the task's, or the batcher's: tasks/batching.py); a graph's lock
serialises callers anyway.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

_LOGGER = logging.getLogger(__name__)

_pass_threads = 0  # the threads of this process's passes now (use_threads); 0: as compiled


def use_threads(threads: int) -> None:
    """Run this process's next forward passes on ``threads`` threads: torch's pool (resized
    only when the count changes: resizing costs) and each widening graph's variant."""
    global _pass_threads
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    _pass_threads = threads


class CompiledGraph:
    """One compiled OpenVINO model and its infer request per thread count (``variants``):
    arrays in, arrays out. ``compile_for(n)`` compiles the model for ``n`` threads;
    ``threads`` is the pool's own count; ``widens``: whether a call follows ``use_threads``
    (False: a graph whose numbers depend on the count, always at ``threads``)."""

    def __init__(self, compile_for: Callable[[int], Any], threads: int, name: str,
                 widens: bool = True) -> None:
        self.name, self.threads, self.widens = name, threads, widens
        self._compile_for = compile_for
        self.variants = {threads: compile_for(threads).create_infer_request()}
        self._lock = threading.Lock()

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        with self._lock:
            threads = (_pass_threads or self.threads) if self.widens else self.threads
            if threads not in self.variants:
                self.variants[threads] = self._compile_for(threads).create_infer_request()
                _LOGGER.info("compiled %s for %d threads", self.name, threads)
            results = self.variants[threads].infer(list(inputs), share_inputs=False)
            # Copies: the request reuses its output buffers on the next call.
            return [np.array(results[i]) for i in range(len(results))]
