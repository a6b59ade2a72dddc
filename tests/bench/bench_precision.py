"""Precision chosen by ear: a voice's stage at f32, bf16 and int8 (static scales), each
against the eager f32 reference, on 24 sentences; and its CPU cost per second of speech.

    flock /tmp/voxfarm-heavy.lock .venv/bin/python tests/bench/bench_precision.py \
        [--voice hibari|piper] [--stage vocoder|acoustic] [--precisions f32,bf16,int8] \
        [--repeats 3]

``--stage acoustic`` (the Piper voice's only: hibari's acoustic half stays eager) compiles the
VITS acoustic half at each precision and decodes its latents with the eager f32 decoder.

The Piper voice (``--voice piper``) has no reference pipeline here: its log-mel distances are
to eager f32, whose own is 0; its int8 is calibrated on latents its own acoustic half makes from
its own sentences (models/neural/calibration.py).

For each precision the decoder is compiled as a vocoder pool compiles it (models/engine.py, one
thread, int8 calibrated on the voice's own frames: models/hibari/calibration.py) and decodes the
acoustic half's frames of every sentence with the same noise seed. Per precision, over all
sentences: the log-mel distance to the wheel's own audio (its onnxruntime graph and numpy DSP,
the same seed: the measure of tests/unit/test_hibari_parity.py) and to eager f32's audio;
pocketsphinx's WER; whether every length is unchanged; the most streamed windows joined differ
from the whole decode (in 16-bit steps); and CPU seconds per second of speech of the vocoder
stage (decoder + DSP, best of ``--repeats`` passes, process CPU time, one thread); and how long
the stage takes to be ready, cold (an empty engine cache: for int8 the calibration set, NNCF and
the conversion) and warm (the same cache again, as a pool's second start). Prints a table
and pass/fail per (voice, stage, precision) against models/audio/perceptual.py's bound, and the
precision ``auto`` should pick (models.engine.AUTO_PRECISION holds what was measured).
"""

from __future__ import annotations

import argparse
import logging
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
from models.hibari.calibration import decoder_calibration_set  # noqa: E402
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
STEP = 1 / 32768  # one step of 16-bit PCM


class HibariSubject:
    """The hibari vocoder stage (decoder + DSP) on the sentences; its reference audio is the
    wheel's own (its graph, its numpy DSP, the same seeds)."""

    name, rate, stage = "hibari (en_us-hibari-heart)", 24000, "vocoder"

    def __init__(self) -> None:
        self.voice = HibariVoice("cpu")
        self.decoder = self.model = self.voice.decoder
        self.calibration = decoder_calibration_set(self.voice)
        id_lists = [self.voice.ids(phonemize(s)) for s in SENTENCES]
        self.inputs = [self.voice.features([ids])[0].frames for ids in id_lists]
        self.frames = sum(int(f.shape[1]) for f in self.inputs)
        self.hop = self.voice.hop

    def decode(self, i: int) -> np.ndarray:
        return self.voice.decode(self.inputs[i], i).numpy()

    def stage_pass(self) -> None:
        """The timed stage on every sentence."""
        for i in range(len(self.inputs)):
            self.decode(i)

    def windows_off(self) -> float:
        """Most |diff| between streamed windows (12 frames, doubling) joined and the whole."""
        frames, voice = self.inputs[-1], self.voice
        whole = voice.decode(frames, 7)
        plan = stream_windows(int(frames.shape[1]), 12, int(voice.WINDOW_CONTEXT), 2)
        joined = torch.cat([voice.decode_window(frames, 7, w.start, w.end, voice.WINDOW_CONTEXT)
                            for w in plan])
        return float((joined - whole).abs().max())

    def reference(self) -> list[np.ndarray] | None:
        import hibari  # noqa: PLC0415  (the reference only)

        tts = hibari.Hibari("heart", threads=1)
        return [tts.from_ids(self.voice.ids(phonemize(s)), rng=np.random.default_rng(seed))
                for seed, s in enumerate(SENTENCES)]


class PiperSubject:
    """The Piper voice's vocoder stage (HiFi-GAN) on the sentences' latents (seeded); no
    reference beside eager f32, whose own distance is then 0."""

    name, rate, stage = "piper (en_us-joe-medium)", 22050, "vocoder"

    def __init__(self) -> None:
        from models.neural.calibration import (  # noqa: PLC0415  (only this subject)
            calibration_set,
        )
        from models.neural.piper import (  # noqa: PLC0415  (only this subject loads Piper)
            WINDOW_CONTEXT,
            default_voice_path,
            load_piper_voice,
        )

        self.voice = load_piper_voice(default_voice_path())
        self.decoder = self.model = self.voice.decoder
        self.context = WINDOW_CONTEXT
        self.calibration = calibration_set(self.voice)
        self.ids = [self.voice.ids(self.voice.phonemes(s)) for s in SENTENCES]
        self.inputs = [self.voice.latents([ids], [i]).z[0] for i, ids in enumerate(self.ids)]
        self.frames = sum(int(z.shape[1]) for z in self.inputs)
        self.hop = self.voice.hop_length

    def decode(self, i: int) -> np.ndarray:
        return self.decoder.decode(self.inputs[i]).float().numpy()

    def stage_pass(self) -> None:
        for i in range(len(self.inputs)):
            self.decode(i)

    def windows_off(self) -> float:
        z = self.inputs[-1]
        whole = self.decoder.decode(z)
        pieces = []
        for w in stream_windows(int(z.shape[1]), 12, self.context, 2):
            audio = self.decoder.decode(z[:, w.lo:w.hi])
            pieces.append(audio[(w.start - w.lo) * self.hop:(w.end - w.lo) * self.hop])
        return float((torch.cat(pieces) - whole).abs().max())

    def reference(self) -> list[np.ndarray] | None:
        return None


class PiperAcousticSubject(PiperSubject):
    """The Piper voice's acoustic half (text encoder, durations, flow) on the sentences' ids,
    seeded; its latents decoded by the eager f32 decoder to be heard. Not windowed."""

    stage = "acoustic"

    def __init__(self) -> None:
        super().__init__()
        self.model = self.voice.acoustic

    def decode(self, i: int) -> np.ndarray:
        z = self.voice.latents([self.ids[i]], [i]).z[0]
        return self.decoder.decode(z).float().numpy()

    def stage_pass(self) -> None:
        for i, ids in enumerate(self.ids):
            self.voice.latents([ids], [i])

    def windows_off(self) -> float:
        return 0.0  # the acoustic half is not streamed in windows


def decode_all(subject) -> list[np.ndarray]:
    return [subject.decode(i) for i in range(len(subject.inputs))]


def cpu_per_second(subject, repeats: int) -> float:
    """CPU seconds of the stage per second of speech, best of ``repeats`` passes."""
    speech = subject.frames * subject.hop / subject.rate
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        subject.stage_pass()
        best = min(best, time.process_time() - started)
    return best / speech


def figures(audio: list[np.ndarray], reference: list[np.ndarray], cpu: float,
            rate: int) -> Figures:
    heard = [transcribe(to_int16(a), rate) for a in audio]
    return Figures(
        log_mel=float(np.mean([log_mel_distance(a, r, rate)
                               for a, r in zip(audio, reference, strict=True)])),
        wer=corpus_wer(SENTENCES, heard), samples=tuple(len(a) for a in audio),
        cpu_per_second=cpu)


def measure(subject, precisions: list[str], repeats: int, cache: str) -> None:
    subject.model.stages = None
    eager = decode_all(subject)
    reference = subject.reference() or eager
    results = {"eager f32": figures(eager, reference, cpu_per_second(subject, repeats),
                                    subject.rate)}
    to_eager, off = {"eager f32": 0.0}, {"eager f32": subject.windows_off()}
    ready: dict[str, tuple[float, float]] = {}
    for precision in precisions:
        config = EngineConfig("openvino", cache, threads=1,
                              **{f"{subject.stage}_precision": precision})
        times = []
        for _ in ("cold", "warm"):  # an empty engine cache, then the same cache again
            started = time.perf_counter()
            engine = accelerate(subject.model, f"bench-precision-{precision}", config, "cpu",
                                subject.calibration)
            times.append(time.perf_counter() - started)
            if engine != "openvino":
                break
        if engine != "openvino":  # the engine logged why (a warning)
            print(f"{precision}: did not compile, not measured")
            continue
        ready[precision] = (times[0], times[1])
        audio = decode_all(subject)
        results[precision] = figures(audio, reference, cpu_per_second(subject, repeats),
                                     subject.rate)
        to_eager[precision] = float(np.mean([log_mel_distance(a, e, subject.rate)
                                             for a, e in zip(audio, eager, strict=True)]))
        off[precision] = subject.windows_off()
    subject.model.stages = None
    report(subject, results, to_eager, off)
    for precision, (cold, warm) in ready.items():
        print(f"ready at {precision}: {cold:.1f} s cold (empty engine cache), {warm:.2f} s warm")


def report(subject, results: dict[str, Figures], to_eager: dict[str, float],
           off: dict[str, float]) -> None:
    speech = sum(results["eager f32"].samples) / subject.rate
    print(f"\n{subject.name}, {subject.stage} stage, {len(SENTENCES)} sentences, "
          f"{speech:.1f} s of speech, one thread\n")
    print("| precision | log-mel to reference | log-mel to eager f32 | WER | lengths | "
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
    print(f"\nauto for the {subject.stage} of {subject.name}: {picked}")


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--voice", choices=["hibari", "piper"], default="hibari")
    ap.add_argument("--stage", choices=["vocoder", "acoustic"], default="vocoder",
                    help="acoustic: the Piper voice's only (hibari's stays eager)")
    ap.add_argument("--precisions", default="f32,bf16,int8")
    ap.add_argument("--repeats", type=int, default=3, help="timing passes (best taken)")
    ap.add_argument("--cache", default="", help="engine cache (default: a temporary folder)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as a pool process runs
    if args.stage == "acoustic" and args.voice != "piper":
        ap.error("--stage acoustic is measured for --voice piper only")
    subject = (HibariSubject() if args.voice == "hibari" else
               PiperAcousticSubject() if args.stage == "acoustic" else PiperSubject())
    cache = args.cache or tempfile.mkdtemp(prefix="voxfarm-bench-precision-")
    measure(subject, args.precisions.split(","), args.repeats, cache)


if __name__ == "__main__":
    main()
