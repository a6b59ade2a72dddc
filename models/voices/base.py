"""What the farm asks of a voice engine: the one interface every engine module implements.

The pipeline (the text frontend, the segment stages, the canary, the web's voice answers)
asks a voice's backend (``models.voices.backend_for(voice)``) and never tests which engine
it is: an engine is one module of this package (``piper.py``, ``hibari.py``,
``espeak.py``), registered once in ``models.voices.registry``.

No torch at import: the web lists voices and checks phonemes through these classes. What
loads a model imports it inside the method that loads it, in the pool process that runs it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from models.classic.espeak import SAMPLE_RATE as ESPEAK_SAMPLE_RATE
from models.neural.voice_file import Inference

# espeak language-code prefix -> frontend language (Piper voices name an espeak voice too)
LANGUAGE_PREFIXES = {"en": "en", "cmn": "zh"}


@dataclass(frozen=True)
class Shape:
    """How a voice is shaped from its base: ``pitch`` in semitones, ``formant`` a ratio of the
    spectral envelope's frequencies, ``rate`` a speed factor, ``language`` the frontend language
    it speaks ("" for its base's). The identity shape changes nothing."""

    pitch: float = 0.0
    formant: float = 1.0
    rate: float = 1.0
    language: str = ""

    @property
    def is_identity(self) -> bool:
        return self == Shape()


@dataclass(frozen=True)
class Voice:
    """A voice users can ask for.

    ``name`` is what users pass (``en_us-joe-medium``, ``en-us``, ``en-us+f3``, ``NAME:SPEAKER``);
    ``language`` the frontend language (``"en"``, ``"zh"``, or another espeak language code for
    a Piper voice, which gets no number reading); ``base`` the espeak voice that phonemizes it
    (without the variant); ``engine`` the name its backend is registered under (``"piper"``,
    ``"hibari"`` or ``"espeak"``: data, which ``models.voices.backend_for`` reads);
    ``model_path`` a neural voice's ``.onnx``; ``speakers`` a multi-speaker voice's speaker
    names (or indices);
    ``speaker`` the one asked for in ``NAME:SPEAKER``; ``version`` the voice version that
    renders it (app/canary/; "" for the voice's own file as offered) and ``inference`` that
    version's overrides of the config's inference settings.
    """

    name: str
    language: str
    display_name: str
    base: str
    variant: str | None
    engine: str = "espeak"
    sample_rate: int = ESPEAK_SAMPLE_RATE
    model_path: str | None = None
    speakers: tuple[str, ...] = ()
    speaker: str | None = None
    version: str = ""
    inference: Inference = Inference()
    gender: str = ""  # "female", "male", or "" where nobody said
    # What it is made of: "model" (a voice file or pack as installed), "shaped" (a base voice
    # with ``shape`` applied) or "mix" (a weighted mix of style voices of one model, ``mix``).
    kind: str = "model"
    shape: Shape = Shape()
    # A mix's parts: (model voice name, weight), the weights summing to 1.
    mix: tuple[tuple[str, float], ...] = ()
    # The engine's own handle of the voice inside ``model_path`` (a Kokoro pack's key in its
    # .npz); "" where the file is the voice.
    style: str = ""

    @property
    def voice_name(self) -> str:
        """The name without ``:SPEAKER``: the voice whose files render it."""
        return self.name.split(":", 1)[0]


@dataclass(frozen=True)
class Loading:
    """What a worker process gives an engine to load a model: where it runs and how."""

    device: str
    engine: Any  # models.engine.EngineConfig: how the neural models run (torch, OpenVINO)
    classic_acoustic: str  # the eSpeak voices' acoustic model (the setting acoustic_model)
    classic_vocoder: str  # the eSpeak voices' vocoder (the setting vocoder)


@dataclass(frozen=True)
class Batch:
    """One forward pass's share, as tasks/batching.py gathers them: ``run([item, ...])``
    returns one result per item for items that share ``key``. ``key`` None: the model does not
    batch, the pipeline runs ``run([item])[0]`` at once."""

    key: Hashable | None
    run: Callable[[list[Any]], list[Any]]
    item: Any


class VoiceBackend(ABC):
    """One voice engine: its voices, its G2P and phoneme alphabet, its models in the pools.

    Class attributes are facts about the engine the pipeline reads instead of its name.
    """

    name: ClassVar[str]  # what Voice.engine holds for its voices
    alphabet: ClassVar[str]  # its phonemes' alphabet on the API ("ipa", "misaki", "espeak")
    alphabet_name: ClassVar[str]  # the same, as an error message names it
    ssml_alphabet: ClassVar[str]  # what SSML <phoneme alphabet="..."> must say for it
    feature_format: ClassVar[str]  # what its acoustic half caches for its vocoder
    # Its phonemes are IPA already (a segment's ``ipa`` is its phonemes) and clause
    # punctuation follows its word, as Piper writes it.
    phonemes_are_ipa: ClassVar[bool]
    # Its features come with frames per phoneme id: word times from each group of phonemes,
    # so phonemes a client gives have word timestamps too.
    frames_per_phoneme: ClassVar[bool]
    streams_windows: ClassVar[bool]  # its vocoder renders a segment window by window
    has_versions: ClassVar[bool]  # a voice of it may have versions (app/canary/)
    # What a file that may be a version of one of its voices ends in (the canary reads no
    # other file of the voices directory); none where its voices have no versions.
    version_suffixes: ClassVar[tuple[str, ...]] = ()
    # Why its versions take no inference overrides (Piper's noise and length scales), or ""
    # where they do: a version is then another file only.
    no_overrides: ClassVar[str] = ""
    # Its decoder adds noise (hibari's source-filter): the pipeline seeds it from the cached
    # features' bytes (app/stores/features.py, `features_seed`), so a hit renders as a miss.
    decoder_noise: ClassVar[bool] = False
    # What of a Shape it can apply ("pitch", "formant"; every engine applies "rate" as speed),
    # and whether its voices mix (a weighted mix of style vectors of one model).
    shapes: ClassVar[frozenset[str]] = frozenset()
    mixes: ClassVar[bool] = False
    # Why it cannot apply a shaping it lacks (("pitch", "its decoder takes no f0 track"), ...), as
    # the refusal says it; and the frontend languages any of its voices may speak (empty:
    # each voice its own only, its G2P being its language's).
    shape_refusals: ClassVar[tuple[tuple[str, str], ...]] = ()
    languages: ClassVar[frozenset[str]] = frozenset()
    # Where its voices come in a listing of one language (GET /v1/voices, the page's picker):
    # lower first, the most natural-sounding engine first, eSpeak's variants last.
    listing_rank: ClassVar[int] = 50
    # Its models must load for the pool to serve at all (the fallback every pool runs): a
    # failure to warm one stops the warm-up, where another engine's is logged and skipped.
    required: ClassVar[bool] = False

    # -- the voices ------------------------------------------------------------------------

    @abstractmethod
    def list_voices(self, voices_dir: str) -> list[Voice]:
        """Its voices on offer (``voices_dir``: the operator's voices directory, "" for none)."""

    def speaker_id(self, voice: Voice, speaker: str) -> int | None:
        """The index of ``speaker`` (a name or an index) of a multi-speaker ``voice`` (None for
        a voice of one speaker).

        Raises ValueError: no such speaker."""
        raise ValueError(f"voice {voice.name} has one speaker")

    # -- versions (app/canary/; the web and the CLI check, the segment stages render) ------

    def check_version_file(self, voice: Voice, path: str) -> None:
        """Whether the file at ``path`` (a readable file ending in one of
        ``version_suffixes``) may render ``voice`` as a version of it: read, never loaded.

        Raises ValueError saying why not."""
        raise ValueError(f"voice {voice.name} has no versions")

    def at_version(self, voice: Voice, path: str) -> Voice:
        """``voice`` rendered from a version's file ``path`` (one ``check_version_file``
        passed)."""
        return replace(voice, model_path=path)

    # -- text to phonemes (the frontend thread; no torch) ----------------------------------

    @abstractmethod
    def phrase_phonemes(self, text: str, voice: Voice, ipa: bool) -> str:
        """``text`` through the voice's own G2P, whole; ``ipa``: in IPA rather than the voice's
        alphabet (an engine whose phonemes are IPA already ignores it)."""

    @abstractmethod
    def word_phonemes(self, word: str, voice: Voice) -> str:
        """``word`` said alone (cached a word), as the word alignment compares it with a
        phrase's phonemes."""

    @abstractmethod
    def says_something(self, phonemes: str, voice: Voice) -> bool:
        """Whether ``phonemes`` hold anything the voice would say (not only pauses)."""

    @abstractmethod
    def unsayable(self, phonemes: str, voice: Voice) -> tuple[int, list[str]] | None:
        """``(position of the first symbol, symbols)`` the voice cannot say in ``phonemes``
        (positions index them as given), or None when it can say them all."""

    def given_phonemes(self, phonemes: str) -> str:
        """Phonemes a client gives (a lexicon entry, SSML ``ph``), as the voice is given them
        and as their symbols are counted."""
        return phonemes

    def phoneme_segment(self, phonemes: str) -> str:
        """A segment of phonemes a client gives instead of text, as the voice renders it."""
        return self.given_phonemes(phonemes)

    def warm_g2p(self) -> None:
        """Load the G2P before the first request would (the web, at start, outside the
        frontend thread: so never through eSpeak). Nothing by default: most engines' G2P
        costs nothing to start."""
        return None

    # -- the models (the pool processes, after the fork) -----------------------------------

    @abstractmethod
    def model_key(self, stage: str, voice: Voice) -> str:
        """What names the model ``load`` returns for ``stage`` in the process: voices with one
        key share one loaded model."""

    @abstractmethod
    def load(self, stage: str, voice: Voice, loading: Loading) -> Any:
        """The model of ``stage`` (ACOUSTIC or VOCODER) that renders ``voice``."""

    @abstractmethod
    def warm_up(self, stage: str, model: Any) -> None:
        """Run ``model`` (``load``'s for ``stage``) once on a short input."""

    def features_id(self, model: Any, voice: Voice) -> str:
        """What names the maker of ``voice``'s features in their cache key
        (app/stores/features.py): the acoustic model's id, which names its file and
        inference overrides."""
        return str(model.model_id)

    def timed(self, model: Any) -> bool:
        """Whether ``model`` gives durations beside its features (cached for word times)."""
        return self.frames_per_phoneme

    @abstractmethod
    def acoustic_batch(self, model: Any, voice: Voice, phonemes: str, voice_name: str,
                       speed: float, seed: int) -> Batch:
        """The acoustic forward pass of one segment: its results are ``(features,
        durations)`` (durations None for a model without timing). ``voice_name``: the
        segment's voice as it names it; ``seed``: the segment's noise seed, from its content
        (an engine that draws no noise ignores it)."""

    @abstractmethod
    def vocode_batch(self, vocoder: Any, voice: Voice, features: Any, piece: Any,
                     seed: int) -> Batch:
        """The vocoder pass of ``features`` (``piece``: a window of them, None for the whole
        segment): its result is a float audio tensor."""

    @abstractmethod
    def word_times(self, vocoder: Any, phonemes: str, spans: Sequence[Any],
                   durations: Sequence[int], samples: int) -> list[dict]:
        """The words (``spans``, models.text.words.WordSpan) with their start and end in
        seconds of the segment's audio (``samples`` long), from the cached ``durations``."""
