"""The English neural voices side by side: compute per second of audio, per stage, as the
pools run them, and intelligibility on the same sentences.

    .venv/bin/python tests/bench/bench_voices.py [--repeats 3] [--threads 1]

For `en_us-hibari-heart`, `en_us-joe-medium` and Kokoro-82M speaking English with two of its
style voices (`jm_kumo[lang=en]`, `jf_nezumi[lang=en]`: hibari's G2P, Kokoro's model): the
frontend's phonemes for each of the WER test's sentences (tests/unit/test_neural_wer.py), then
the acoustic half and the vocoder through the adapters the acoustic and vocoder pools call
(models/hibari/stage.py, models/neural/piper.py, the Kokoro engine's batches,
models/voices/kokoro.py), eager torch, one segment at a time, best of `--repeats`, voices
interleaved sentence by sentence so all see the same machine load. Prints each stage's seconds
of compute per second of audio produced (lower is faster) and pocketsphinx's word error rate
on the audio. What the farm adds around the stages (Redis, the broker) is the same for every
voice: bench_farm.py.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from models.hibari.stage import HibariAcoustic, HibariVocoder  # noqa: E402
from models.neural.piper import PiperAcoustic, PiperVocoder  # noqa: E402
from models.text.frontend import prepare  # noqa: E402
from models.voices import backend_for, get_voice  # noqa: E402
from tests.asr import transcribe, word_errors  # noqa: E402
from tests.unit.test_neural_wer import SENTENCES  # noqa: E402

VOICES = ("en_us-hibari-heart", "en_us-joe-medium", "jm_kumo[lang=en]", "jf_nezumi[lang=en]")


def best_of(repeats: int, fn, *args):
    """The fastest of ``repeats`` calls of ``fn(*args)`` in seconds, and its result."""
    best, out = math.inf, None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - start)
    return best, out


class Hibari:
    def __init__(self) -> None:
        self.acoustic, self.vocoder = HibariAcoustic(), HibariVocoder()

    def features(self, phonemes: str):
        return self.acoustic.synthesize_timed_batch([phonemes], 1.0)[0][0]

    def audio(self, features) -> torch.Tensor:
        return self.vocoder.vocode([features], seed=1)[0]


class Piper:
    def __init__(self, voice) -> None:
        self.acoustic = PiperAcoustic(model_path=voice.model_path)
        self.vocoder = PiperVocoder(model_path=voice.model_path)

    def features(self, phonemes: str):
        return self.acoustic.synthesize(phonemes, seed=1)

    def audio(self, features) -> torch.Tensor:
        return self.vocoder.vocode([features])[0]


class Kokoro:
    """A Kokoro voice through its engine's batches (style row and pitch as the pools pick
    them), the model joined into a scratch folder once."""

    def __init__(self, voice) -> None:
        # Kokoro's stages load only when a Kokoro voice is benchmarked
        from models.kokoro.stage import KokoroAcousticStage, KokoroVocoderStage, model_file

        self.voice, self.backend = voice, backend_for(voice)
        path = model_file(ROOT / "var" / "engine-cache" / "kokoro")
        self.acoustic = KokoroAcousticStage(model_path=path)
        self.vocoder = KokoroVocoderStage(model_path=path)

    def features(self, phonemes: str):
        batch = self.backend.acoustic_batch(self.acoustic, self.voice, phonemes,
                                            self.voice.name, 1.0, 1)
        return batch.run([batch.item])[0][0]

    def audio(self, features) -> torch.Tensor:
        batch = self.backend.vocode_batch(self.vocoder, self.voice, features, None, 1)
        return batch.run([batch.item])[0]


def runner_for(name: str):
    voice = get_voice(name)
    if voice.engine == "hibari":
        return Hibari()
    return Kokoro(voice) if voice.engine == "kokoro" else Piper(voice)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    runners = {name: runner_for(name) for name in VOICES}
    totals = {name: {"acoustic": 0.0, "vocoder": 0.0, "audio": 0.0, "errors": 0, "words": 0}
              for name in VOICES}
    for name, runner in runners.items():  # warm: first calls allocate
        runner.audio(runner.features(prepare("Warm up.", name)[0].phonemes))
    for sentence in SENTENCES:
        for name, runner in runners.items():
            segments = prepare(sentence, name)
            row = totals[name]
            pcm = []
            for segment in segments:
                t_ac, features = best_of(args.repeats, runner.features, segment.phonemes)
                t_voc, audio = best_of(args.repeats, runner.audio, features)
                row["acoustic"] += t_ac
                row["vocoder"] += t_voc
                rate = runner.vocoder.sample_rate
                row["audio"] += audio.numel() / rate
                pcm.append(audio.float().cpu().numpy())
            x = np.concatenate(pcm)
            heard = transcribe(np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16),
                               rate)
            e, n = word_errors(sentence, heard)
            row["errors"] += e
            row["words"] += n
    print(f"\n{len(SENTENCES)} sentences, torch {torch.__version__}, {args.threads} thread(s), "
          f"best of {args.repeats}")
    print(f"{'voice':<22}{'audio s':>9}{'acoustic s/s':>14}{'vocoder s/s':>13}"
          f"{'total s/s':>11}{'WER':>7}")
    for name, row in totals.items():
        ac, voc = row["acoustic"] / row["audio"], row["vocoder"] / row["audio"]
        print(f"{name:<22}{row['audio']:>9.1f}{ac:>14.4f}{voc:>13.4f}{ac + voc:>11.4f}"
              f"{row['errors'] / row['words']:>7.3f}")


if __name__ == "__main__":
    main()
