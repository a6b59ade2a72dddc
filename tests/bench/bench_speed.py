"""How long a sentence lasts at each speed, against its length at 1.0 / speed, for every engine.

    .venv/bin/python tests/bench/bench_speed.py [--voices NAME ...]

Renders each sentence's acoustic half in process (the eager torch engine; the speed rule runs
on the host either way: models/durations.py) at 1.0 and at each speed, and takes the length a
vocoder renders from it (frames x hop: every vocoder of the farm gives exactly that many
samples, tests/unit/test_speed_linear.py checks it through the vocoder). Prints one table: per
voice and speed, the wanted and the rendered length of the sentence the error is worst for, and
the worst and mean error over the sentences. A timing-free bench: the numbers are lengths.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from models.engine import EngineConfig  # noqa: E402
from models.voices import ACOUSTIC, Loading, backend_for, get_voice  # noqa: E402

SENTENCES = (
    "Yes, of course, we can meet at nine, or ten, if the train is late again.",
    "The quiet harbor town woke slowly as fishing boats returned with their morning catch "
    "under gray skies.",
    "First, the boats came home; then, slowly, the town woke up, and the market opened.",
    "She sells sea shells by the sea shore, and the shells she sells are surely seashells.",
)
SPEEDS = (0.5, 0.8, 1.1, 1.5, 2.0)
VOICES = ("en_us-hibari-heart", "en_us-joe-medium", "en-us", "jm_kumo[lang=en]")


def lengths(name: str) -> dict[float, list[float]]:
    """Seconds of each sentence at 1.0 and at each speed, for voice ``name``."""
    voice = get_voice(name)
    backend = backend_for(voice)
    model = backend.load(ACOUSTIC, voice, Loading("cpu", EngineConfig(engine="torch"),
                                                  "espeak", "griffinlim"))
    hop = model.mel_config.hop_length
    out: dict[float, list[float]] = {s: [] for s in (1.0, *SPEEDS)}
    for text in SENTENCES:
        phonemes = backend.phrase_phonemes(text, voice, False)
        for speed in out:
            batch = backend.acoustic_batch(model, voice, phonemes, voice.name, speed, 0)
            features, _ = batch.run([batch.item])[0]
            out[speed].append(int(features.shape[-1]) * hop / voice.sample_rate)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--voices", nargs="+", default=list(VOICES))
    args = parser.parse_args()
    print(f"{len(SENTENCES)} sentences of 13-17 words; error = rendered / (1.0 length / speed) - 1")
    print("| voice | speed | want s | got s | worst error | mean error |")
    print("|---|---|---|---|---|---|")
    for name in args.voices:
        seconds = lengths(name)
        for speed in SPEEDS:
            errors = [got / (one / speed) - 1.0
                      for one, got in zip(seconds[1.0], seconds[speed], strict=True)]
            worst = max(range(len(errors)), key=lambda i: abs(errors[i]))
            want = seconds[1.0][worst] / speed
            print(f"| {name} | {speed} | {want:.3f} | {seconds[speed][worst]:.3f} | "
                  f"{100 * errors[worst]:+.1f} % | {100 * sum(errors) / len(errors):+.1f} % |")


if __name__ == "__main__":
    main()
