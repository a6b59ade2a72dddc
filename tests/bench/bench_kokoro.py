"""Kokoro-82M's two pool stages on CPU, eager torch against compiled (the farm's engine layer,
models/engine.py) against the int8 ONNX on onnxruntime, per stage, at 1 and 2 threads.

Per stage, seconds of compute per second of audio (RTF, lower is faster), best of
``--repeats`` passes over the sentences one at a time (batch 1, as the stages run them):

- acoustic: ids, style -> the decoder's input and the durations (``KokoroAcousticStage``, which
  the engine leaves eager: "compiled" is the same module; onnxruntime on the graph cut at the
  decoder's input: the aligned text features, F0 and N projections, the durations);
- decoder: that input -> audio (``KokoroVocoderStage``: eager, and OpenVINO f32 as a pool with
  that many threads compiles it; onnxruntime on the graph from the decoder's input to the
  audio, fed the graph's own acoustic outputs).

Phonemes from hibari's G2P, ids from Kokoro's vocab (the one hibari shares), style from the
voices wheel's ``voices_ja.npz`` (``jf_alpha``, row = phoneme count - 1).

``--precision`` instead runs the precision harness (tests/bench/bench_precision.py) on the
Kokoro decoder: f32 and bf16 against eager f32 on its 24 sentences (log-mel, WER, lengths, CPU
per second of speech), so ``AUTO_PRECISION`` can name what passed.

Not run by the test command:
    flock /tmp/voxfarm-heavy.lock .venv/bin/python -m tests.bench.bench_kokoro [--repeats 3]
        [--threads 1,2] [--precision]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from models.engine import EngineConfig
from models.hibari.g2p import phonemize
from models.kokoro import assets
from models.kokoro.stage import HOP, SAMPLE_RATE, KokoroAcousticStage, KokoroVocoderStage

SENTENCES = [
    "The meeting has been moved to Thursday afternoon.",
    "Please remember to bring your umbrella, it might rain later.",
    "Thank you very much for your help.",
    "She plays the piano every evening after dinner.",
]
VOICE = "jf_alpha"
# The graph's tensors at the split (tests/unit/test_kokoro_parity.py names the same ones).
DURATIONS = "/encoder/Clip_output_0"
FEATURES = "/encoder/MatMul_1_output_0"
F0 = "/encoder/F0_proj/Conv_output_0"
ENERGY = "/encoder/N_proj/Conv_output_0"


def cases() -> list[tuple[list[int], np.ndarray]]:
    """(ids with their pads, the 256-float style) per sentence."""
    vocab = json.loads(assets.vocab_path().read_text())["vocab"]
    out = []
    with np.load(assets.voices_path()) as voices:
        for text in SENTENCES:
            tokens = [vocab[c] for c in phonemize(text) if c in vocab]
            out.append(([0, *tokens, 0], voices[VOICE][len(tokens) - 1][0].astype(np.float32)))
    return out


def best_of(repeats: int, fn) -> float:
    """Fastest of ``repeats`` calls of ``fn()``, in seconds."""
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


class OnnxStages:
    """onnxruntime on the graph's two halves, cut where the farm cuts it."""

    def __init__(self, path: Path, threads: int) -> None:
        model = onnx.load(str(path))
        audio = model.graph.output[0].name
        extractor = onnx.utils.Extractor(model)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3

        def session(inputs, outputs):
            sub = extractor.extract_model(inputs, outputs)
            return ort.InferenceSession(sub.SerializeToString(), options,
                                        providers=["CPUExecutionProvider"])

        self.acoustic = session(["tokens", "style", "speed"], [DURATIONS, FEATURES, F0, ENERGY])
        self.decoder = session([FEATURES, F0, ENERGY, "style"], [audio])
        self.decoder_inputs = [i.name for i in self.decoder.get_inputs()]

    def acoustic_outputs(self, ids: list[int], style: np.ndarray) -> dict[str, np.ndarray]:
        feeds = {"tokens": np.asarray([ids], np.int64), "style": style.reshape(1, -1),
                 "speed": np.asarray([1.0], np.float32)}
        names = (DURATIONS, FEATURES, F0, ENERGY)
        return dict(zip(names, self.acoustic.run(None, feeds), strict=True))

    def decode(self, outputs: dict[str, np.ndarray], style: np.ndarray) -> np.ndarray:
        feeds = {name: outputs[name] for name in (FEATURES, F0, ENERGY)}
        feeds["style"] = style.reshape(1, -1)
        return self.decoder.run(None, {k: feeds[k] for k in self.decoder_inputs})[0]


def measure(path: Path, threads: int, repeats: int, cache: str) -> dict[str, float]:
    """RTF per (stage, engine) at ``threads``."""
    torch.set_num_threads(threads)
    items = [(ids, style, 1.0) for ids, style in cases()]
    acoustic = KokoroAcousticStage(model_path=path)
    eager = KokoroVocoderStage(model_path=path)
    compiled = KokoroVocoderStage(model_path=path, engine=EngineConfig(
        "openvino", cache, threads=threads, vocoder_precision="f32"))
    assert compiled.engine == "openvino", "the decoder did not compile (see the log)"
    graph = OnnxStages(path, threads)
    timed = acoustic.synthesize_timed_batch(items, 1.0)
    speech = sum(int(frames.shape[1]) for frames, _ in timed) * HOP / SAMPLE_RATE
    graph_outputs = [graph.acoustic_outputs(ids, style) for ids, style, _ in items]
    graph_speech = sum(float(o[DURATIONS].sum()) for o in graph_outputs) * HOP / SAMPLE_RATE
    runs = {
        ("acoustic", "torch"): (lambda: acoustic.synthesize_timed_batch(items, 1.0), speech),
        ("acoustic", "onnxruntime"): (
            lambda: [graph.acoustic_outputs(ids, style) for ids, style, _ in items],
            graph_speech),
        ("decoder", "torch"): (lambda: eager.vocode([f for f, _ in timed]), speech),
        ("decoder", "openvino"): (lambda: compiled.vocode([f for f, _ in timed]), speech),
        ("decoder", "onnxruntime"): (
            lambda: [graph.decode(o, items[i][1]) for i, o in enumerate(graph_outputs)],
            graph_speech),
    }
    for fn, _ in runs.values():  # warm: first calls allocate and pick kernels
        fn()
    rtf = {key: 0.0 for key in runs}
    for key, (fn, seconds) in runs.items():
        rtf[key] = best_of(repeats, fn) / seconds
    rtf[("speech", "seconds")] = speech
    return {f"{stage} {engine}": value for (stage, engine), value in rtf.items()}


def report(results: dict[int, dict[str, float]]) -> None:
    first = next(iter(results.values()))
    print(f"\nKokoro-82M, {len(SENTENCES)} sentences, {first['speech seconds']:.1f} s of speech, "
          "batch 1; RTF = compute seconds per second of audio\n")
    print("| stage | engine | " + " | ".join(f"{n} thread(s)" for n in results) + " |")
    print("|---|---|" + "---|" * len(results))
    rows = [("acoustic", "torch", "eager torch (also compiled: stays eager)"),
            ("acoustic", "onnxruntime", "onnxruntime (int8 graph)"),
            ("decoder", "torch", "eager torch"), ("decoder", "openvino", "OpenVINO f32"),
            ("decoder", "onnxruntime", "onnxruntime (int8 graph)")]
    for stage, engine, label in rows:
        cells = " | ".join(f"{r[f'{stage} {engine}']:.3f}" for r in results.values())
        print(f"| {stage} | {label} | {cells} |")
    for n, r in results.items():
        total = r["acoustic torch"] + r["decoder openvino"]
        print(f"\n{n} thread(s): what a CPU pool runs (acoustic eager + OpenVINO decoder) "
              f"{total:.3f}; onnxruntime's two halves "
              f"{r['acoustic onnxruntime'] + r['decoder onnxruntime']:.3f}")


def precision(path: Path, repeats: int, cache: str) -> None:
    """The precision harness on the Kokoro decoder (module docstring)."""
    # the harness is a bench module of its own, needed only in this mode
    from tests.bench import bench_precision

    torch.set_num_threads(1)
    bench_precision.measure(KokoroSubject(path), ["f32", "bf16"], repeats, cache)


class KokoroSubject:
    """The Kokoro vocoder stage for tests/bench/bench_precision.py: the acoustic half's frames
    of its 24 sentences; no reference pipeline beside eager f32 (the ONNX's durations differ
    by a frame here and there, which shifts whole clips); windows: whole segments only."""

    name, rate, stage, hop, calibration = "kokoro (jf_alpha)", SAMPLE_RATE, "vocoder", HOP, None

    def __init__(self, path: Path) -> None:
        # the harness's sentences, only in this mode
        from tests.bench.bench_precision import SENTENCES as PRECISION_SENTENCES

        vocab = json.loads(assets.vocab_path().read_text())["vocab"]
        items = []
        with np.load(assets.voices_path()) as voices:
            for text in PRECISION_SENTENCES:
                tokens = [vocab[c] for c in phonemize(text) if c in vocab]
                items.append(([0, *tokens, 0], voices[VOICE][len(tokens) - 1][0], 1.0))
        self.inputs = [f for f, _ in KokoroAcousticStage(model_path=path)
                       .synthesize_timed_batch(items, 1.0)]
        self.frames = sum(int(f.shape[1]) for f in self.inputs)
        self.vocoder = KokoroVocoderStage(model_path=path)
        self.model = self.decoder = self.vocoder.model

    def decode(self, i: int) -> np.ndarray:
        return self.vocoder.decode(self.inputs[i]).numpy()

    def stage_pass(self) -> None:
        for frames in self.inputs:
            self.vocoder.decode(frames)

    def windows_off(self) -> float:
        return 0.0  # one window per segment: nothing to join

    def reference(self) -> None:
        return None


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="timing passes (best taken)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--precision", action="store_true", help="the precision harness instead")
    ap.add_argument("--cache", default="", help="engine cache (default: a temporary folder)")
    args = ap.parse_args()
    cache = args.cache or tempfile.mkdtemp(prefix="voxfarm-bench-kokoro-")
    path = assets.assemble_model(Path(cache) / "kokoro")
    if args.precision:
        precision(path, args.repeats, cache)
        return
    results = {n: measure(path, n, args.repeats, cache)
               for n in (int(t) for t in args.threads.split(","))}
    report(results)


if __name__ == "__main__":
    main()
