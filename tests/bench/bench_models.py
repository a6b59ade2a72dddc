"""Time log_mel and Griffin-Lim on CPU (or ``--device cuda:0``); prints a table of RTF.

Real-time factor = compute seconds / audio seconds (lower is faster; 0.05 = 20x real time).
Not run by the test command:  .venv/bin/python tests/bench/bench_models.py [--device cuda:0]
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from models.classic.mel import MelConfig, log_mel
from models.classic.vocoder import GriffinLimVocoder

CFG = MelConfig()


def speech_like(seconds: float, seed: int) -> torch.Tensor:
    """Harmonic glide with a syllable-rate envelope: a stand-in for a rendered segment."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(int(seconds * CFG.sample_rate), dtype=torch.float64) / CFG.sample_rate
    f0 = 120.0 + 40.0 * torch.sin(2 * math.pi * 0.7 * t)
    phase = 2 * math.pi * torch.cumsum(f0, 0) / CFG.sample_rate
    voiced = sum(0.3 / k * torch.sin(k * phase) for k in range(1, 12))
    envelope = 0.5 + 0.5 * torch.sin(2 * math.pi * 4.0 * t).clamp(min=0)
    noise = 0.01 * torch.randn(t.shape, generator=g, dtype=torch.float64)
    return (voiced * envelope + noise).float()


def timed(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up (allocator, FFT plans)
    best = math.inf
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'stage':<18}{'audio':>7}{'batch':>7}{'seconds':>10}{'RTF':>9}")
    for seconds in (1.0, 5.0, 30.0):
        for batch in (1, 8):
            audio = torch.stack([speech_like(seconds, i) for i in range(batch)]).to(device)
            total = seconds * batch
            elapsed = timed(lambda a=audio: log_mel(a, CFG), device, args.repeats)
            print(f"{'log_mel':<18}{seconds:>6g}s{batch:>7}{elapsed:>10.4f}{elapsed / total:>9.4f}")
            mels = list(log_mel(audio, CFG))
            for n_iter in (16, 32, 64):
                vocoder = GriffinLimVocoder(device=device, n_iter=n_iter)
                repeats = 1 if seconds * batch * n_iter > 5000 else args.repeats
                elapsed = timed(lambda v=vocoder, m=mels: v.vocode(m), device, repeats)
                label = f"griffinlim n{n_iter}"
                print(f"{label:<18}{seconds:>6g}s{batch:>7}{elapsed:>10.4f}{elapsed / total:>9.4f}")


if __name__ == "__main__":
    main()
