"""Precision chosen by ear: the hibari vocoder stage at f32, bf16 and int8 (static scales),
each against the eager f32 reference, on 24 sentences; and its CPU cost per second of speech.

    flock /tmp/voxfarm-heavy.lock .venv/bin/python tests/bench/bench_precision.py \
        [--precisions f32,bf16,int8] [--repeats 3]

For each precision the decoder is compiled as a vocoder pool compiles it (models/engine.py, one
thread, int8 calibrated on the voice's own frames: models/hibari/calibration.py) and decodes the
acoustic half's frames of every sentence with the same noise seed. Per precision, over all
sentences: the log-mel distance to the wheel's own audio (its onnxruntime graph and numpy DSP,
the same seed: the measure of tests/unit/test_hibari_parity.py) and to eager f32's audio;
pocketsphinx's WER; whether every length is unchanged; the most streamed windows joined differ
from the whole decode (in 16-bit steps); and CPU seconds per second of speech of the vocoder
stage (decoder + DSP, best of ``--repeats`` passes, process CPU time, one thread). Prints a table
and pass/fail per (voice, stage, precision) against models/audio/perceptual.py's bound, and the
precision ``auto`` should pick (models.engine.AUTO_PRECISION holds what was measured).
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from models.audio.perceptual import (  # noqa: E402
    Figures,
    choose,
    corpus_wer,
    log_mel_distance,
    misses,
)
from models.audio.quality import transcribe  # noqa: E402
from models.engine import EngineConfig, accelerate  # noqa: E402
from models.hibari.calibration import decoder_calibration  # noqa: E402
from models.hibari.g2p import phonemize  # noqa: E402
from models.hibari.voice import HibariVoice  # noqa: E402
from models.neural.hifigan import stream_windows  # noqa: E402
from tests.unit.test_neural_wer import SENTENCES as WER_SENTENCES  # noqa: E402
from tests.unit.test_neural_wer import to_int16  # noqa: E402

# The neural WER test's ten everyday sentences and fourteen more; none is in the calibration set.
SENTENCES = [
    *WER_SENTENCES,
    "The meeting has been moved to Thursday afternoon.",
    "Please remember to bring your umbrella, it might rain later.",
    "Our flight leaves at seven in the morning.",
    "He forgot his keys on the kitchen table again.",
    "Do you know how long the museum stays open?",
    "The soup needs a little more salt and pepper.",
    "I will send you the report by the end of the week.",
    "Where did you park the car last night?",
    "The garden looks lovely after the spring rain.",
    "Let me know if you need anything else.",
    "The bus was late, so we walked to school.",
    "She plays the piano every evening after dinner.",
    "Is this seat taken, or may I sit here?",
    "The library closes early on Sundays.",
]
RATE = 24000
STEP = 1 / 32768  # one step of 16-bit PCM


def wheel_audio(id_lists: list[list[int]]) -> list[np.ndarray]:
    """The wheel's own audio per sentence (its graph, its numpy DSP), seed = the index."""
    import hibari  # noqa: PLC0415  (the reference only)

    tts = hibari.Hibari("heart", threads=1)
    return [tts.from_ids(ids, rng=np.random.default_rng(seed))
            for seed, ids in enumerate(id_lists)]


def decode_all(voice: HibariVoice, frames: list[torch.Tensor]) -> list[np.ndarray]:
    return [voice.decode(f, seed).numpy() for seed, f in enumerate(frames)]


def cpu_per_second(voice: HibariVoice, frames: list[torch.Tensor], repeats: int) -> float:
    """CPU seconds of the vocoder stage per second of speech, best of ``repeats`` passes."""
    speech = sum(int(f.shape[1]) for f in frames) * voice.hop / RATE
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        decode_all(voice, frames)
        best = min(best, time.process_time() - started)
    return best / speech


def windows_off(voice: HibariVoice, frames: torch.Tensor, seed: int) -> float:
    """Most |diff| between streamed windows (12 frames, doubling) joined and the whole."""
    whole = voice.decode(frames, seed)
    plan = stream_windows(int(frames.shape[1]), 12, int(voice.WINDOW_CONTEXT), 2)
    joined = torch.cat([voice.decode_window(frames, seed, w.start, w.end, voice.WINDOW_CONTEXT)
                        for w in plan])
    return float((joined - whole).abs().max())


def figures(audio: list[np.ndarray], wheel: list[np.ndarray], cpu: float) -> Figures:
    heard = [transcribe(to_int16(a), RATE) for a in audio]
    return Figures(
        log_mel=float(np.mean([log_mel_distance(a, w, RATE) for a, w in zip(audio, wheel,
                                                                            strict=True)])),
        wer=corpus_wer(SENTENCES, heard), samples=tuple(len(a) for a in audio),
        cpu_per_second=cpu)


def measure(voice: HibariVoice, precisions: list[str], repeats: int, cache: str) -> None:
    id_lists = [voice.ids(phonemize(s)) for s in SENTENCES]
    frames = [voice.features([ids])[0].frames for ids in id_lists]
    wheel = wheel_audio(id_lists)
    voice.decoder.stages = None
    eager = decode_all(voice, frames)
    results = {"eager f32": figures(eager, wheel, cpu_per_second(voice, frames, repeats))}
    to_eager, off = {"eager f32": 0.0}, {"eager f32": windows_off(voice, frames[-1], 7)}
    for precision in precisions:
        config = EngineConfig("openvino", cache, threads=1, vocoder_precision=precision)
        engine = accelerate(voice.decoder, f"bench-precision-{precision}", config, "cpu",
                            functools.partial(decoder_calibration, voice))
        assert engine == "openvino", f"{precision} did not compile"
        audio = decode_all(voice, frames)
        results[precision] = figures(audio, wheel, cpu_per_second(voice, frames, repeats))
        to_eager[precision] = float(np.mean([log_mel_distance(a, e, RATE)
                                             for a, e in zip(audio, eager, strict=True)]))
        off[precision] = windows_off(voice, frames[-1], 7)
    voice.decoder.stages = None
    report(results, to_eager, off)


def report(results: dict[str, Figures], to_eager: dict[str, float],
           off: dict[str, float]) -> None:
    speech = sum(results["eager f32"].samples) / RATE
    print(f"\nhibari (en_us-hibari-heart), vocoder stage, {len(SENTENCES)} sentences, "
          f"{speech:.1f} s of speech, one thread\n")
    print("| precision | log-mel to wheel | log-mel to eager f32 | WER | lengths | "
          "windows off (16-bit steps) | CPU-s per s of speech | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    reference = results["eager f32"]
    for name, fig in results.items():
        failed = misses(fig, reference)
        verdict = "reference" if name == "eager f32" else (
            "PASS" if not failed else "FAIL: " + "; ".join(failed))
        lengths = "equal" if fig.samples == reference.samples else "changed"
        print(f"| {name} | {fig.log_mel:.4f} | {to_eager[name]:.4f} | {fig.wer:.3f} | "
              f"{lengths} | {off[name] / STEP:.2f} | {fig.cpu_per_second:.4f} | {verdict} |")
    picked = choose({k: v for k, v in results.items() if k != "eager f32"}, reference)
    print(f"\nauto for (hibari, vocoder): {picked}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", default="f32,bf16,int8")
    ap.add_argument("--repeats", type=int, default=3, help="timing passes (best taken)")
    ap.add_argument("--cache", default="", help="engine cache (default: a temporary folder)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as a pool process runs
    voice = HibariVoice("cpu")
    cache = args.cache or tempfile.mkdtemp(prefix="voxfarm-bench-precision-")
    measure(voice, args.precisions.split(","), args.repeats, cache)


if __name__ == "__main__":
    main()
