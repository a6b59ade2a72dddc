"""Batching on CPU, measured where the farm would batch: the vocoder decoders on the windows
the farm cuts, batch 1 against 2 and 4 with the same total frames, one thread.

    flock /tmp/voxfarm-heavy.lock .venv/bin/python tests/bench/bench_batch_cpu.py \
        [--items 8] [--repeats 5]

Subjects, each compiled as a vocoder pool compiles it (models/engine.py, one thread, a scratch
engine cache): the hibari decoder graph at f32 and at int8 (static scales, calibrated on the
voice's own frames), and the Piper voice's HiFi-GAN decoder at f32 (the precisions ``auto``
runs). The graphs take any batch (their first dimension is dynamic), so the batched calls run
the same compiled model the farm runs one item at a time.

Sizes: a first-window-sized streaming window of 64 frames and a next one of 128, each with the
voice's context frames either side (hibari 29, Piper 16), and a whole short segment ("Thank you
very much.", no context). ``--items`` pieces of one size, cut from the frames (latents) of real
sentences at different places, run as ``items`` calls of one, ``items / 2`` of two and
``items / 4`` of four. Figures: CPU seconds (process time, best of ``--repeats`` passes) per
second of speech the pieces give (context frames are overhead, not speech). The hibari DSP
after the decoder (one inverse STFT per item, torch) is timed once per item beside it, as
batching leaves it as it is, so the stage's gain is the decoder's diluted by it.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from models.engine import EngineConfig, accelerate  # noqa: E402
from models.hibari import dsp  # noqa: E402
from models.hibari.calibration import decoder_calibration_set  # noqa: E402
from models.hibari.g2p import phonemize  # noqa: E402
from models.hibari.voice import HibariVoice  # noqa: E402
from tests.bench.bench_precision import SENTENCES  # noqa: E402

SHORT = "Thank you very much."
BATCHES = (1, 2, 4)


def pieces(streams: list[torch.Tensor], size: int, items: int) -> list[torch.Tensor]:
    """``items`` pieces ``(C, size)`` cut from the frames ``(C, F)`` of the sentences, each
    from a different place (the sentences joined, a stride apart)."""
    joined = torch.cat(streams, dim=1)
    stride = max(1, (joined.shape[1] - size) // items)
    return [joined[:, i * stride:i * stride + size].contiguous() for i in range(items)]


def cpu_of(call: Callable[[torch.Tensor], object], items: list[torch.Tensor], batch: int,
           repeats: int) -> float:
    """Best process time, over ``repeats`` passes, of running ``items`` ``batch`` at a time."""
    groups = [torch.stack(items[i:i + batch]) for i in range(0, len(items), batch)]
    call(groups[0])  # the first call at a new shape compiles OpenVINO's kernels for it
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for group in groups:
            call(group)
        best = min(best, time.process_time() - started)
    return best


def batch_off(call: Callable[[torch.Tensor], torch.Tensor], items: list[torch.Tensor]
              ) -> float:
    """Most |difference| between an item's output in a batch of four and alone: whether a
    request's bytes would depend on what it was batched with."""
    together = call(torch.stack(items[:4]))
    return max(float((together[k] - call(items[k][None])[0]).abs().max()) for k in range(4))


def sizes(short_frames: int, context: int) -> list[tuple[str, int, int]]:
    """(name, frames decoded, frames of speech) per size the farm cuts."""
    return [("window 64", 64 + 2 * context, 64), ("window 128", 128 + 2 * context, 128),
            (f"short segment ({short_frames})", short_frames, short_frames)]


def hibari_rows(precisions: list[str], items: int, repeats: int, cache: str) -> list[str]:
    voice = HibariVoice("cpu")
    streams = [voice.features([voice.ids(phonemize(s))])[0].frames for s in SENTENCES]
    short = int(voice.features([voice.ids(phonemize(SHORT))])[0].frames.shape[1])
    context, channels = int(voice.WINDOW_CONTEXT), voice.decoder.dec_in.in_channels
    calibration = decoder_calibration_set(voice)
    rows = []
    for precision in precisions:
        config = EngineConfig("openvino", cache, threads=1, vocoder_precision=precision)
        if accelerate(voice.decoder, f"bench-batch-{precision}", config, "cpu",
                      calibration) != "openvino":
            rows.append(f"| hibari decoder | {precision} | did not compile | | | | | | |")
            continue
        stages = voice.decoder.stages
        assert stages is not None

        def decode(x: torch.Tensor, stages=stages) -> torch.Tensor:
            return stages.parts_stage(x[:, :channels])

        for name, frames, speech in sizes(short, context):
            cut = pieces(streams, frames, items)
            seconds = items * speech * voice.hop / voice.sample_rate
            cpu = [cpu_of(decode, cut, b, repeats)
                   / seconds for b in BATCHES]
            dsp_cpu = dsp_cpu_of(voice, cut, repeats) / seconds
            off = batch_off(decode, cut)
            rows.append(_row("hibari decoder", precision, name, cpu, dsp_cpu, off))
    voice.decoder.stages = None
    return rows


def dsp_cpu_of(voice: HibariVoice, items: list[torch.Tensor], repeats: int) -> float:
    """Best process time of the DSP after the decoder over ``items`` ``(131, F)``, one at a
    time (their parts computed first, untimed)."""
    parts = [voice.decoder.parts_stage(x[None, :130].float())[0] for x in items]
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for x, p in zip(items, parts, strict=True):
            dsp.synthesize(p, x[130].float(), dsp.segment_noise(0, x.shape[1], voice.device), 0)
        best = min(best, time.process_time() - started)
    return best


def piper_rows(items: int, repeats: int, cache: str) -> list[str]:
    from models.neural.piper import (  # noqa: PLC0415  (only this subject loads Piper)
        WINDOW_CONTEXT,
        default_voice_path,
        load_piper_voice,
    )

    voice = load_piper_voice(default_voice_path())
    latents = [voice.latents([voice.ids(voice.phonemes(s))], [i]).z[0]
               for i, s in enumerate(SENTENCES)]
    short = int(voice.latents([voice.ids(voice.phonemes(SHORT))], [0]).z[0].shape[1])
    config = EngineConfig("openvino", cache, threads=1, vocoder_precision="f32")
    if accelerate(voice.decoder, "bench-batch-piper", config, "cpu") != "openvino":
        return ["| Piper decoder | f32 | did not compile | | | | | | |"]
    rows = []
    for name, frames, speech in sizes(short, WINDOW_CONTEXT):
        cut = pieces(latents, frames, items)
        seconds = items * speech * voice.hop_length / voice.sample_rate
        cpu = [cpu_of(functools.partial(voice.decoder.decode, max_batch=b), cut, b, repeats)
               / seconds for b in BATCHES]
        off = batch_off(functools.partial(voice.decoder.decode, max_batch=4), cut)
        rows.append(_row("Piper decoder", "f32", name, cpu, None, off))
    voice.decoder.stages = None
    return rows


def _row(subject: str, precision: str, size: str, cpu: list[float],
         dsp_cpu: float | None, off: float) -> str:
    """A table row: the decoder's figures, its gains, and the stage's (with the DSP)."""
    gains = " / ".join(f"{(cpu[0] / c - 1) * 100:+.0f}%" for c in cpu[1:])
    stage = "-"
    if dsp_cpu is not None:
        stage = " / ".join(f"{((cpu[0] + dsp_cpu) / (c + dsp_cpu) - 1) * 100:+.0f}%"
                           for c in cpu[1:])
    extra = f"{dsp_cpu:.4f}" if dsp_cpu is not None else "-"
    return (f"| {subject} | {precision} | {size} | "
            + " | ".join(f"{c:.4f}" for c in cpu)
            + f" | {gains} | {extra} | {stage} | {off:.1e} |")


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=8, help="pieces per size (a multiple of 4)")
    ap.add_argument("--repeats", type=int, default=5, help="timing passes (best taken)")
    ap.add_argument("--precisions", default="f32,int8", help="the hibari decoder's")
    ap.add_argument("--no-piper", action="store_true")
    ap.add_argument("--cache", default="", help="engine cache (default: a temporary folder)")
    args = ap.parse_args()
    if args.items % 4:
        ap.error("--items must be a multiple of 4")
    torch.set_num_threads(1)  # as a pool process runs
    cache = args.cache or tempfile.mkdtemp(prefix="voxfarm-bench-batch-")
    with torch.inference_mode():
        rows = hibari_rows(args.precisions.split(","), args.items, args.repeats, cache)
        if not args.no_piper:
            rows += piper_rows(args.items, args.repeats, cache)
    print(f"\nCPU-s per second of speech, one thread, {args.items} pieces per size, "
          f"best of {args.repeats}; gain = throughput at batch 2 / 4 against batch 1\n")
    print("| subject | precision | size | batch 1 | batch 2 | batch 4 | gain b2 / b4 | "
          "DSP | stage gain b2 / b4 | batched vs alone |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
