"""Helpers the Piper voice's two halves share: masks, length buckets, sub-batch sizes and the
exact weight loader (``models.neural.vits`` and ``models.neural.hifigan`` both pad a batch by
length bucket and load a Piper ``.onnx``'s tensors the same way).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from models.neural.voice_file import VoiceFileError


def sequence_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """``(B,)`` lengths -> ``(B, max_length)`` bool, True inside each item."""
    return torch.arange(max_length, device=lengths.device)[None, :] < lengths[:, None]


# On CPU a stage pads each item to a multiple of this many frames (or phoneme ids), not to
# the coarser buckets that let a GPU batch similar lengths (up to a quarter padding: a
# streaming window's 80 frames decoded as 96, 58 ms against 49): a CPU pool runs one item a
# pass, and OpenVINO compiles kernels per length, so steps of 8 keep the lengths it meets
# few (docs/benchmarks.md, "Inference engines").
CPU_PAD_STEP = 8


def pad_step(device: torch.device) -> int | None:
    """The padding step of a stage on ``device`` for :func:`bucket_groups`: ``CPU_PAD_STEP``
    on CPU, None (the batching buckets) elsewhere."""
    return CPU_PAD_STEP if device.type == "cpu" else None


def bucket_length(n: int, min_step: int = 32) -> int:
    """``n`` rounded up to a padded length shared by similar lengths.

    Steps of 32 up to 128, then a quarter of the power of two below ``n`` (64 from 256, 128
    from 512...): at most a quarter of a sub-batch is padding, and similar lengths share a
    bucket so they batch together.
    """
    step = max(min_step, (1 << max(0, n.bit_length() - 1)) // 4)
    return max(step, -(-n // step) * step)


def bucket_groups(lengths: Sequence[int], max_batch: int | None = None, step: int | None = None
                  ) -> list[tuple[list[int], int]]:
    """Indices of ``lengths`` grouped by :func:`bucket_length` (at most ``max_batch`` to a
    group), with each group's padded length; with ``step``, by multiples of ``step`` instead
    (finer buckets: less padding, fewer items that share one)."""
    buckets: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        padded = -(-int(n) // step) * step if step else bucket_length(int(n))
        buckets.setdefault(padded, []).append(i)
    size = max_batch or len(lengths) or 1
    return [
        (members[k : k + size], padded)
        for padded, members in sorted(buckets.items())
        for k in range(0, len(members), size)
    ]


def default_max_batch(device: torch.device) -> int:
    """Items per sub-batch: 1 on CPU, 16 on accelerators.

    On CPU batching buys nothing (docs/benchmarks.md, "Figures that lived in code comments"),
    while oneDNN picks kernels by batch size, so batching moved some items' z slightly. One
    at a time, an item's result never depends on its batch.
    On a GPU, batching is where the throughput is; there the last bits may depend on the batch.
    """
    return 1 if device.type == "cpu" else 16


def load_state(module: nn.Module, state: dict[str, np.ndarray], source: str) -> None:
    """Copy ``state`` into ``module`` exactly: every parameter present, same shapes.

    Raises:
        VoiceFileError: naming ``source`` and the missing, unexpected or misshapen weights.
    """
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    misshapen = sorted(
        f"{k} {tuple(state[k].shape)} != {tuple(own[k].shape)}"
        for k in set(own) & set(state)
        if tuple(state[k].shape) != tuple(own[k].shape)
    )
    problems = []
    for label, names in (("missing", missing), ("unexpected", unexpected),
                         ("wrong shape", misshapen)):
        if names:
            shown = ", ".join(names[:5]) + (f" (+{len(names) - 5} more)" if len(names) > 5 else "")
            problems.append(f"{label} weights: {shown}")
    if problems:
        raise VoiceFileError(source, "; ".join(problems))
    module.load_state_dict({k: torch.from_numpy(np.array(v, dtype=np.float32))
                            for k, v in state.items()})

