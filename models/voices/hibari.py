"""hibari: ``en_us-hibari-heart``, the Kokoro-distilled voice ``heart`` inside the
``hibari-tts`` wheel (24 kHz; its own G2P and phoneme set, ``models.hibari.vocab``). The
wheel's other voices (emma, fenrir, fable, kore) would download at run time, so they are
offered only where an operator drops their files into the voices directory: a file whose
SHA-256 the wheel's ``voices.json`` names becomes ``en_us-hibari-NAME`` or
``en_gb-hibari-NAME`` (British voices read through the G2P's British lexicon), one model each.

Its phonemes are misaki's symbols (IPA with ``A I O W Y`` for its diphthongs); a space is its
word boundary, a tab or line break none. Its acoustic half draws no noise; its decoder adds
seeded noise (the source-filter's noise part), the seed from the cached features
(models/hibari/stage.py).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

from models.stages import ACOUSTIC
from models.voices.base import Batch, Loading, Voice, VoiceBackend


def _g2p(text: str, accent: str = "en-us") -> str:
    """hibari's phonemes for ``text`` in ``accent`` (``en-us``, or ``en-gb`` for the British
    voices): its G2P's, kept to its vocab (the G2P can pass a quote mark the model has no id
    for; its own runtime drops those the same way)."""
    # hibari's G2P loads its lexicons once a hibari voice is asked for
    from models.hibari.g2p import phonemize as hibari_phonemize
    from models.hibari.vocab import keep_vocab

    return keep_vocab(hibari_phonemize(text, accent))


@functools.lru_cache(maxsize=8192)
def _word_phonemes(word: str, accent: str) -> str:
    return _g2p(word, accent)


class HibariBackend(VoiceBackend):
    name = "hibari"
    alphabet = "misaki"
    alphabet_name = "hibari's misaki phonemes, vocab.json"
    # hibari's misaki symbols are IPA but for a few capitals (its diphthongs): "ipa".
    ssml_alphabet = "ipa"
    feature_format = "hibari frames (130 decoder-input channels + f0, frames), for its decoder"
    phonemes_are_ipa = True
    frames_per_phoneme = True
    streams_windows = True
    has_versions = False
    listing_rank = 10  # the most natural English voice the farm has
    decoder_noise = True
    # Its vocoder shifts f0 and scales the spectral envelope's frequencies before the DSP
    # (models/hibari/dsp.py, `shaped`); rate is the acoustic half's speed.
    shapes = frozenset({"pitch", "formant"})

    def list_voices(self, voices_dir: str) -> list[Voice]:
        """hibari's voice ``heart``, when the ``hibari-tts`` wheel is installed, and the
        wheel's other voices (``voices.json``: emma, fenrir, fable, kore) whose files an
        operator dropped into ``voices_dir``, each found by its SHA-256 (the wheel would
        download them, so they are never fetched here)."""
        # the hibari wheel is looked for only when the voices are listed
        from models.hibari import vocab as hibari_voice

        path = hibari_voice.model_path()
        if path is None:
            return []
        voices = [Voice(name=hibari_voice.NAME, language="en",
                        display_name=f"{hibari_voice.NAME} (hibari neural, Kokoro-distilled)",
                        base="en-us", variant=None, engine=self.name,
                        sample_rate=hibari_voice.SAMPLE_RATE, model_path=str(path),
                        gender="female")]
        for found in hibari_voice.voice_files(voices_dir) if voices_dir else ():
            voices.append(Voice(name=found.name, language="en",
                                display_name=f"{found.name} (hibari neural, Kokoro-distilled)",
                                base="en-gb" if found.british else "en-us", variant=None,
                                engine=self.name, sample_rate=hibari_voice.SAMPLE_RATE,
                                model_path=str(found.path), gender=found.gender))
        return voices

    def phrase_phonemes(self, text: str, voice: Voice, ipa: bool) -> str:
        return _g2p(text, voice.base)

    def word_phonemes(self, word: str, voice: Voice) -> str:
        return _word_phonemes(word, voice.base)

    def says_something(self, phonemes: str, voice: Voice) -> bool:
        # the hibari wheel's vocab loads once a hibari voice is asked for
        from models.hibari.vocab import says_something

        return says_something(phonemes)

    def unsayable(self, phonemes: str, voice: Voice) -> tuple[int, list[str]] | None:
        # the hibari wheel's vocab loads once a hibari voice is asked for
        from models.hibari.vocab import unsayable

        return unsayable(phonemes)

    def phoneme_segment(self, phonemes: str) -> str:
        return re.sub(r"\s", " ", phonemes)  # a space is its word boundary; a tab or break none

    def warm_g2p(self) -> None:
        # hibari's G2P loads its lexicons on its first call (about a second). Pure Python and
        # no eSpeak, so it may run outside the frontend thread.
        from models.hibari.g2p import phonemize

        phonemize("Hello.")

    def model_key(self, stage: str, voice: Voice) -> str:
        # One model a voice file (heart's, or a dropped one), loaded once and shared by the
        # voices shaped from it.
        return f"hibari-{stage}:{voice.model_path}"

    def load(self, stage: str, voice: Voice, loading: Loading) -> Any:
        # models load after the fork, in the process that runs them
        from models.errors import VoiceUnavailable
        from models.hibari.stage import HibariAcoustic, HibariVocoder

        cls = HibariAcoustic if stage == ACOUSTIC else HibariVocoder
        try:
            return cls(device=loading.device, engine=loading.engine, path=voice.model_path)
        except (OSError, ValueError) as exc:  # final: a retry reads the same files
            raise VoiceUnavailable(f"the hibari voice cannot be loaded: {exc}") from exc

    def warm_up(self, stage: str, model: Any) -> None:
        if stage == ACOUSTIC:
            model.synthesize("həlˈO.")
            return
        # torch loads in the model pools, after the fork (CUDA is not fork-safe)
        import torch

        model.vocode([torch.zeros(model.mel_config.n_mels, 8)])

    def acoustic_batch(self, model: Any, voice: Voice, phonemes: str, voice_name: str,
                       speed: float, seed: int) -> Batch:
        """Frames and durations, in a batch with other segments of the same speed. Its
        acoustic half draws no noise: ``seed`` is not used."""

        def run(items: list[str]) -> list:
            return model.synthesize_timed_batch(items, speed)

        return Batch((model.model_id, speed), run, phonemes)

    def vocode_batch(self, vocoder: Any, voice: Voice, features: Any, piece: Any,
                     seed: int) -> Batch:
        # torch loads only in the pools that run the voice
        from models.neural.hifigan import Window

        piece = piece or Window.whole(int(features.shape[-1]))

        def run(items: list) -> list:
            return vocoder.vocode_windows(items)

        # A shaped voice's pitch and formant ratio ride with each piece (applied per frame).
        shape = voice.shape
        return Batch(vocoder.model_id, run, (features, piece, seed, shape.pitch, shape.formant))

    def word_times(self, vocoder: Any, phonemes: str, spans: Sequence[Any],
                   durations: Sequence[int], samples: int) -> list[dict]:
        # Frames per id, as for a Piper voice; one frame is 300 samples at 24 kHz.
        from models.hibari.stage import word_positions
        from models.text.words import word_times

        return word_times(list(spans), phonemes, word_positions(phonemes, durations),
                          durations, vocoder.hop_length / vocoder.sample_rate)
