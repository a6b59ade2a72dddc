"""Per stage, per engine: eager torch, the compiled engine (OpenVINO) and onnxruntime.

For the bundled English voice (Piper en_US-joe-medium): the acoustic half (ids -> latent z) and
the decoder half (z -> audio), for a short, a medium and a long segment, on CPU at 1 and 2
threads and batch 1 and 4 (the same segment with a different noise seed per item). Three
engines run each stage side by side: the farm's torch modules eager, the same modules compiled
by the farm's engine (models/engine.py, as the pools run them), and onnxruntime on the voice's
own sub-graphs (Piper's runtime). Prints the real-time factor of each: compute seconds /
seconds of audio produced (lower is faster).

Not run by the test command:
    flock /tmp/voxfarm-heavy.lock .venv/bin/python tests/bench/bench_neural.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import openvino
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's models/, not the installed one's

from models.engine import EngineConfig  # noqa: E402
from models.neural.piper import (  # noqa: E402
    PiperAcoustic,
    PiperVocoder,
    default_voice_path,
    load_piper_voice,
)

LATENT = "/Mul_7_output_0"
SEGMENTS = {
    "short": "Thank you very much.",
    "medium": "The weather is nice today, so let's go for a walk in the park after lunch.",
    "long": (
        "When the train finally arrived at the station, the passengers gathered their bags, "
        "said goodbye to the friends they had made on the long journey, and stepped out into "
        "the cold morning air, glad to be home again after so many weeks away."
    ),
}


def best_of(repeats: int, fn, *args, **kwargs) -> float:
    """Fastest of ``repeats`` calls of ``fn(*args, **kwargs)``, in seconds."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args, **kwargs)
        best = min(best, time.perf_counter() - start)
    return best


def split_model(model: Path, folder: Path) -> tuple[Path, Path]:
    acoustic, decoder = folder / "acoustic.onnx", folder / "decoder.onnx"
    onnx.utils.extract_model(str(model), str(acoustic), ["input", "input_lengths", "scales"],
                             [LATENT])
    onnx.utils.extract_model(str(model), str(decoder), [LATENT], ["output"])
    return acoustic, decoder


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="best of N timed runs")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--precision", default="f32", choices=["f32", "bf16"],
                        help="the engine's inference precision (the farm's: f32)")
    args = parser.parse_args()

    model = default_voice_path()
    voice = load_piper_voice(model)
    cfg = voice.config
    scales = np.array([cfg.noise_scale, cfg.length_scale, cfg.noise_w], dtype=np.float32)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        acoustic_path, decoder_path = split_model(model, Path(tmp))
        for threads in args.threads:
            torch.set_num_threads(threads)
            acoustic_session = session(acoustic_path, threads)
            decoder_session = session(decoder_path, threads)
            # The pools' engine at this thread count, its cache in the temporary folder (the
            # first thread count converts, the next reads the conversion back).
            config = EngineConfig("openvino", str(Path(tmp) / "engine"), threads=threads,
                                  acoustic_precision=args.precision,
                                  vocoder_precision=args.precision)
            compiled = PiperAcoustic(engine=config).voice
            compiled.decoder = PiperVocoder(engine=config).voice.decoder
            for name, text in SEGMENTS.items():
                ids = voice.ids(voice.phonemes(text))
                for batch in args.batches:
                    seeds = list(range(batch))
                    id_lists = [ids] * batch
                    out = voice.latents(id_lists, seeds, max_batch=batch)  # also a warm-up
                    audio_seconds = float(out.frame_lengths.sum()) * 256 / cfg.sample_rate
                    x = np.array(id_lists, dtype=np.int64)
                    feeds = {"input": x, "input_lengths": np.full(batch, len(ids)),
                             "scales": scales}
                    z_onnx = acoustic_session.run(None, feeds)[0]  # warm-up
                    decoder_session.run(None, {LATENT: z_onnx})  # warm-up
                    voice.decoder.decode(out.z, out.frame_lengths, max_batch=batch)  # warm-up
                    # Warm-up, and how far the compiled stages land from eager torch.
                    c_out = compiled.latents(id_lists, seeds, max_batch=batch)
                    z_err = float((c_out.z - out.z).abs().max()) if torch.equal(
                        c_out.frame_lengths, out.frame_lengths) else math.inf
                    a_err = float((compiled.decoder.decode(out.z, out.frame_lengths,
                                                           max_batch=batch)
                                   - voice.decoder.decode(out.z, out.frame_lengths,
                                                          max_batch=batch)).abs().max())
                    n = args.repeats
                    # Interleaved, engine after engine, so all see the same machine load.
                    t_acoustic = c_acoustic = o_acoustic = math.inf
                    t_decoder = c_decoder = o_decoder = math.inf
                    for _ in range(n):
                        t_acoustic = min(t_acoustic, best_of(1, voice.latents, id_lists, seeds,
                                                             max_batch=batch))
                        c_acoustic = min(c_acoustic, best_of(1, compiled.latents, id_lists,
                                                             seeds, max_batch=batch))
                        o_acoustic = min(o_acoustic, best_of(1, acoustic_session.run, None,
                                                             feeds))
                        t_decoder = min(t_decoder, best_of(1, voice.decoder.decode, out.z,
                                                           out.frame_lengths, max_batch=batch))
                        c_decoder = min(c_decoder, best_of(1, compiled.decoder.decode, out.z,
                                                           out.frame_lengths, max_batch=batch))
                        o_decoder = min(o_decoder, best_of(1, decoder_session.run, None,
                                                           {LATENT: z_onnx}))
                    per_item = audio_seconds / batch
                    for stage, t, c, o, err in (
                            ("acoustic", t_acoustic, c_acoustic, o_acoustic, z_err),
                            ("decoder", t_decoder, c_decoder, o_decoder, a_err)):
                        rows.append((stage, name, per_item, threads, batch, t / audio_seconds,
                                     c / audio_seconds, o / audio_seconds, err))
                    print(f"  done {name} threads={threads} batch={batch}", flush=True)

    print()
    print("RTF = compute seconds / audio seconds (lower is faster); CPU, "
          f"torch {torch.__version__}, OpenVINO {openvino.__version__.split('-')[0]} "
          f"({args.precision}), onnxruntime {ort.__version__}; ov err: max abs against eager "
          "torch (latent; audio), inf if a duration differs")
    header = (f"| {'stage':<8} | {'segment':<7} | {'audio s':>7} | {'threads':>7} | "
              f"{'batch':>5} | {'torch':>7} | {'openvino':>8} | {'ort':>7} | {'ov/torch':>8} | "
              f"{'ov/ort':>6} | {'ov err':>7} |")
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for stage, name, seconds, threads, batch, t, c, o, err in sorted(rows):
        print(f"| {stage:<8} | {name:<7} | {seconds:>7.2f} | {threads:>7} | {batch:>5} | "
              f"{t:>7.4f} | {c:>8.4f} | {o:>7.4f} | {c / t:>8.2f} | {c / o:>6.2f} | "
              f"{err:>7.1e} |")

if __name__ == "__main__":
    main()
