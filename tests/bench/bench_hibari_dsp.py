"""The hibari vocoder stage's DSP (models/hibari/dsp.py) beside the wheel's numpy DSP, and the
whole stage (int8 OpenVINO decoder + DSP) as a vocoder pool runs it: CPU seconds per second
of speech, one thread, on the decoder's real outputs for eight everyday sentences.

Rows, each best of ``--repeats`` (process CPU time, so a busy box skews it less than wall time):
- the DSP on whole segments, each with its noise drawn anew (a segment draws once);
- the DSP on the farm's streamed windows (``vocoder_window_frames`` 64, doubling, the voice's
  29 frames of context; the DSP renders ``dsp.RENDER_MARGIN`` frames either side, or the whole
  context for a baseline without it, as the vocoder did before);
- the wheel's ``hibari.dsp.synth`` on the same parts, f0 and seed;
- the stage, whole and windowed: the int8 decoder (calibrated as a pool calibrates it) + DSP;
- the DSP's steps on whole segments.
``--baseline REV`` runs the DSP rows and the stage rows a second time with
``models/hibari/dsp.py`` as it was at git revision ``REV``, in the same run.

Not run by the test command:
    flock /tmp/voxfarm-heavy.lock .venv/bin/python tests/bench/bench_hibari_dsp.py
        [--repeats 5] [--baseline REV]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from models.engine import EngineConfig, accelerate  # noqa: E402
from models.hibari import dsp  # noqa: E402
from models.hibari.calibration import decoder_calibration_set  # noqa: E402
from models.hibari.g2p import phonemize  # noqa: E402
from models.hibari.voice import HibariVoice  # noqa: E402
from models.neural.hifigan import stream_windows  # noqa: E402
from tests.unit.test_neural_wer import SENTENCES  # noqa: E402

WINDOW_FRAMES = 64  # the farm's default vocoder_window_frames (app/setting_groups.py)


def best_cpu(repeats: int, fn) -> float:
    """Least process CPU seconds of ``repeats`` calls of ``fn()``."""
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        fn()
        best = min(best, time.process_time() - started)
    return best


def module_at(rev: str, folder: Path) -> ModuleType:
    """``models/hibari/dsp.py`` as it was at git revision ``rev``, imported under another name."""
    source = subprocess.run(["git", "show", f"{rev}:models/hibari/dsp.py"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    path = folder / "dsp_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("dsp_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def render(module: ModuleType, voice: HibariVoice, frames: torch.Tensor, seed: int,
           parts: torch.Tensor | None, windowed: bool) -> int:
    """One segment as the vocoder renders it with ``module`` as its DSP: the decoder too
    where ``parts`` is None, whole or in the farm's windows, its noise (and pulse train,
    where the module caches one) made anew; returns the count of passes."""
    module._noise_cpu.cache_clear()
    if hasattr(module, "_segment_pulses"):
        module._segment_pulses.cache_clear()
    total, context = frames.shape[1], int(voice.WINDOW_CONTEXT)
    margin = getattr(module, "RENDER_MARGIN", context)
    windows = stream_windows(total, WINDOW_FRAMES, context, 2) if windowed else []
    spans = [(w.start, w.end) for w in windows] or [(0, total)]
    noise = module.segment_noise(seed, total)
    for start, stop in spans:
        first, last = max(0, start - context), min(total, stop + context)
        if parts is None:
            window_parts = voice.parts(frames[:, first:last])
        else:
            window_parts = parts[:, first:last]
        lo, hi = max(first, start - margin), min(last, stop + margin)
        module.synthesize(window_parts[:, lo - first: hi - first], frames[130], noise, lo)
    return len(spans)


def wheel_dsp(parts: torch.Tensor, f0: torch.Tensor, seed: int) -> np.ndarray:
    from hibari import dsp as wheel  # the reference only, installed with the voice

    lh, theta, ln, lr, phi = np.split(parts.numpy(), 5)
    return wheel.synth(lh, theta, ln, lr, phi, f0.numpy(), np.random.default_rng(seed))


def dsp_steps(segments, repeats: int) -> dict[str, float]:
    """CPU seconds of each step of ``dsp.synthesize`` on whole segments (least of repeats)."""
    steps: dict[str, float] = {}
    for _ in range(repeats):
        once: dict[str, float] = {}
        for seed, (frames, parts) in enumerate(segments):
            n, f0 = parts.shape[1], frames[130].numpy()
            lh, theta, ln, lr, phi = np.split(parts.numpy(), 5)
            clock = [time.process_time()]

            def step(name: str, value, clock=clock, once=once):
                now = time.process_time()
                once[name] = once.get(name, 0.0) + now - clock[0]
                clock[0] = now
                return value

            dsp._noise_cpu.cache_clear()
            noise = step("noise draw (numpy, the seed contract)",
                         dsp.segment_noise(seed, n).numpy())
            train = step("pulse train (f0 interpolation, float64 phase sum)",
                         dsp.pulses(f0, 0, n))
            source = step("forward STFT of the pulses", dsp.stft(train, n).T)
            angle = np.tanh(theta)
            angle *= np.float32(np.pi)
            spec = dsp._rotation(dsp._capped_exp(lh), angle)
            spec *= source
            step("harmonic part: tanh, exp, cos, sin, product", None)
            spec += noise[:, :n] * dsp._capped_exp(ln)
            step("noise part: exp, product", None)
            spec += dsp._rotation(dsp._capped_exp(lr), phi)
            step("free-phase part: exp, cos, sin", None)
            step("inverse STFT, overlap-add, normalisation", dsp.overlap_add(spec))
        steps = {k: min(v, steps.get(k, v)) for k, v in once.items()}
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", help="a git revision: its dsp.py measured beside")
    args = parser.parse_args()
    torch.set_num_threads(1)
    voice = HibariVoice("cpu")
    with tempfile.TemporaryDirectory() as folder:
        modules = {"now": dsp}
        if args.baseline:
            modules[args.baseline] = module_at(args.baseline, Path(folder))
        config = EngineConfig("openvino", folder, threads=1, vocoder_precision="int8")
        engine = accelerate(voice.decoder, "bench-hibari-dsp", config, "cpu",
                            decoder_calibration_set(voice))
        if engine != "openvino":
            raise SystemExit("the hibari decoder did not compile (see the log line above)")
        segments = []
        for text in SENTENCES[:8]:
            frames = voice.features([voice.ids(phonemize(text))])[0].frames
            segments.append((frames, voice.parts(frames)))  # the int8 decoder's real parts
        speech = sum(f.shape[1] for f, _ in segments) * dsp.HOP / dsp.SAMPLE_RATE
        print(f"{len(segments)} sentences, {speech:.1f} s of speech, int8 decoder, best of "
              f"{args.repeats}, CPU-s per second of speech, one thread\n")
        print("| what | " + " | ".join(f"dsp.py {name}" for name in modules) + " |")
        print("|---|" + "---|" * len(modules))
        rows = {"DSP, whole segments": (True, False), "DSP, the farm's windows": (True, True),
                "stage (int8 decoder + DSP), whole": (False, False),
                "stage (int8 decoder + DSP), windows": (False, True)}
        for label, (dsp_only, windowed) in rows.items():
            cells = []
            for module in modules.values():
                cpu = best_cpu(args.repeats, lambda m=module, d=dsp_only, w=windowed: [
                    render(m, voice, f, seed, p if d else None, w)
                    for seed, (f, p) in enumerate(segments)])
                cells.append(f"{cpu / speech:.5f}")
            print(f"| {label} | " + " | ".join(cells) + " |")
        wheel = best_cpu(args.repeats, lambda: [wheel_dsp(p, f[130], seed)
                                                for seed, (f, p) in enumerate(segments)])
        print(f"| the wheel's numpy DSP, whole | {wheel / speech:.5f} |")
        print("\nThe DSP's steps (dsp.py now, whole segments):\n")
        print("| step | CPU-s per s |\n|---|---|")
        for name, cpu in dsp_steps(segments, args.repeats).items():
            print(f"| {name} | {cpu / speech:.5f} |")


if __name__ == "__main__":
    main()
