"""Piper voice files: the ``.onnx.json`` config, Piper's phonemes and ids, the ``.onnx`` weights.

A Piper voice is ``NAME.onnx`` (a VITS model exported whole) plus ``NAME.onnx.json``. The JSON is
the source of truth for everything around the network: the phoneme -> id map, the espeak voice
that phonemizes for it, the sample rate, the default noise and length scales, the speakers.

No torch here: the web process can check that a text has something speakable for a voice before
enqueueing. ``onnx`` is imported only by :func:`read_onnx_weights`, which the workers call once at
start (the torch modules in ``models.neural.vits`` and ``models.neural.hifigan`` are built from
its output).
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models.errors import NoSpeakableText

_LOGGER = logging.getLogger(__name__)

PAD = "_"  # after every phoneme's id (Piper's "intersperse")
BOS = "^"
EOS = "$"
HOP_LENGTH = 256  # samples per latent frame in every Piper VITS voice (the decoder's upsampling)

# Ids that carry no sound of their own: a text made only of these has nothing to say.
_NON_SPEECH = frozenset(" !\"#'(),-.:;?¡¿«»“”‘’—–…↓↑" + PAD + BOS + EOS + "ˈˌːˑ")
# espeak marks words it reads in another language as "(fr)...(en)"; Piper drops the flags.
_LANGUAGE_FLAG = re.compile(r"\([^()]*\)")
_SENTENCE_MARKS = ".?!"
_CLAUSE_MARKS = ",:;"  # Piper follows these with a space


class VoiceFileError(ValueError):
    """A voice file is missing, unreadable, or does not match its companion; names the file."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}")

    def __reduce__(self):  # keep the fields when the error crosses a process boundary
        return (type(self), (self.path, self.problem))


class UnspeakableText(NoSpeakableText, ValueError):
    """The phonemes hold nothing this voice can say (only punctuation, or unknown symbols)."""


@dataclass(frozen=True)
class PiperConfig:
    """What a Piper voice's ``.onnx.json`` says, typed.

    Defaults are Piper's own for the keys a file may leave out.
    """

    phoneme_id_map: Mapping[str, tuple[int, ...]]
    espeak_voice: str  # the espeak-ng voice that phonemizes for this model, e.g. "en-us"
    sample_rate: int
    noise_scale: float = 0.667  # spread of the latent prior's noise (0 = its mean)
    length_scale: float = 1.0  # > 1 speaks slower; the farm's speed then stretches its durations
    noise_w: float = 0.8  # spread of the stochastic duration predictor's noise
    num_speakers: int = 1
    speaker_id_map: Mapping[str, int] = field(default_factory=dict)
    num_symbols: int = 256  # rows of the phoneme embedding
    phoneme_type: str = "espeak"
    language: str = ""  # e.g. "en_US"
    hop_length: int = HOP_LENGTH
    source: str = ""  # the file it was read from, for messages

    @classmethod
    def from_json(cls, path: str | Path) -> PiperConfig:
        """Read ``NAME.onnx.json``.

        Raises:
            VoiceFileError: the file is missing, not JSON, or lacks what a voice needs.
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise VoiceFileError(path, "voice config not found") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise VoiceFileError(path, f"not a readable JSON voice config ({exc})") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Any, source: str = "<config>") -> PiperConfig:
        """Build from the parsed JSON; ``source`` names it in errors."""
        if not isinstance(data, dict):
            raise VoiceFileError(source, "voice config is not a JSON object")
        try:
            raw_map = data["phoneme_id_map"]
            id_map = {str(k): tuple(int(i) for i in v) for k, v in raw_map.items()}
            sample_rate = int(data["audio"]["sample_rate"])
            phoneme_type = str(data.get("phoneme_type", "espeak"))
            espeak_voice = str(data.get("espeak", {}).get("voice", ""))
            inference = data.get("inference", {})
            speaker_id_map = {str(k): int(v) for k, v in data.get("speaker_id_map", {}).items()}
            num_speakers = int(data.get("num_speakers", max(1, len(speaker_id_map))))
            num_symbols = int(data.get("num_symbols", max(max(v) for v in id_map.values()) + 1))
            language = data.get("language", {})
            code = str(language.get("code", "")) if isinstance(language, dict) else str(language)
            config = cls(
                phoneme_id_map=id_map,
                espeak_voice=espeak_voice,
                sample_rate=sample_rate,
                noise_scale=float(inference.get("noise_scale", 0.667)),
                length_scale=float(inference.get("length_scale", 1.0)),
                noise_w=float(inference.get("noise_w", 0.8)),
                num_speakers=num_speakers,
                speaker_id_map=speaker_id_map,
                num_symbols=num_symbols,
                phoneme_type=phoneme_type,
                language=code,
                source=source,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise VoiceFileError(source, f"malformed voice config ({exc!r})") from None
        for symbol in (PAD, BOS, EOS):
            if symbol not in id_map:
                raise VoiceFileError(source, f"phoneme_id_map has no {symbol!r}")
        if phoneme_type == "espeak" and not espeak_voice:
            raise VoiceFileError(source, "an espeak voice config must name espeak.voice")
        if sample_rate <= 0 or num_speakers < 1:
            raise VoiceFileError(source, "sample_rate and num_speakers must be positive")
        return config

    def speaker_id(self, speaker: str | int | None) -> int | None:
        """The model's speaker index for a name or index; ``None`` for a one-speaker voice.

        Raises:
            ValueError: an unknown speaker name or an index out of range.
        """
        if self.num_speakers <= 1:
            if speaker not in (None, 0, "0", ""):
                raise ValueError(f"voice {self.source} has one speaker; got speaker {speaker!r}")
            return None
        if speaker is None or speaker == "":
            return 0
        if isinstance(speaker, str) and speaker in self.speaker_id_map:
            return self.speaker_id_map[speaker]
        try:
            index = int(speaker)
        except (TypeError, ValueError):
            names = ", ".join(sorted(self.speaker_id_map)) or "(unnamed)"
            raise ValueError(f"unknown speaker {speaker!r}; speakers: {names}") from None
        if not 0 <= index < self.num_speakers:
            raise ValueError(f"speaker {index} out of range 0..{self.num_speakers - 1}")
        return index


# The values a voice version may give each override (inclusive): what app/canary/ checks
# and the admin API declares. The noise scales from 0 (the prior's mean, no noise) to 10,
# well past speech (Piper's configs use 0.3 to 1; 5 turns to noise, which the canary drill
# uses for a candidate the rule must roll back). length_scale from 5x faster to 5x slower
# than the voice's pace, before a job's speed divides it. Beyond these a value is a typo
# (1e308 would ask for years of audio a phoneme), never a voice.
INFERENCE_RANGES: dict[str, tuple[float, float]] = {
    "noise_scale": (0.0, 10.0), "length_scale": (0.2, 5.0), "noise_w": (0.0, 10.0)}


@dataclass(frozen=True)
class Inference:
    """Inference settings that override a voice config's (``None`` keeps the config's): what
    a voice version may change without another file (app/canary/), each within
    :data:`INFERENCE_RANGES`. Changing them changes what the acoustic half renders, so
    :attr:`tag` is part of its model id (and cache keys)."""

    noise_scale: float | None = None
    length_scale: float | None = None
    noise_w: float | None = None

    @property
    def tag(self) -> str:
        """"" for no override, else e.g. ``ns5-lsX-nwX`` (X: the config's)."""
        values = (self.noise_scale, self.length_scale, self.noise_w)
        if values == (None, None, None):
            return ""
        return "-".join(f"{name}{'X' if v is None else f'{v:g}'}"
                        for name, v in zip(("ns", "ls", "nw"), values, strict=True))

    def as_dict(self) -> dict:
        return {k: v for k, v in (("noise_scale", self.noise_scale),
                                  ("length_scale", self.length_scale),
                                  ("noise_w", self.noise_w)) if v is not None}


def piper_phonemes(text: str, espeak_voice: str) -> str:
    """IPA for ``text`` the way Piper's phonemizer writes it, punctuation included.

    Each clause's phonemes are followed by the punctuation that ended it (``, : ;`` then a
    space; ``. ? !`` end a sentence); sentences are joined by a space; language-switch flags are
    dropped; the result is NFD-decomposed, as Piper's phoneme map expects (``ç`` -> ``c`` + ``̧``).
    Goes through the process's one espeak engine and its lock.

    One deliberate difference: where espeak ends a clause without punctuation mid-sentence (a
    dash, a very long clause), Piper glues the two clauses' phonemes together; here a space
    keeps the words apart.
    """
    # eSpeak's library loads on first use
    from models.classic.espeak import get_engine

    pieces: list[str] = []
    for ipa, mark in get_engine().phonemize_clauses(text, espeak_voice):
        ipa = _LANGUAGE_FLAG.sub("", ipa).strip()
        if not ipa and not mark:
            continue
        pieces.append(ipa + mark)
    return unicodedata.normalize("NFD", " ".join(pieces).strip())


def ids_for(phonemes: str, config: PiperConfig) -> list[int]:
    """Phoneme ids as Piper forms them: ``^ _``, each phoneme's ids then ``_``, then ``$``.

    Symbols the voice's map lacks are skipped (as Piper does), with a debug log.

    Raises:
        UnspeakableText (a ValueError and a ``NoSpeakableText``): nothing in ``phonemes`` is a
            sound this voice knows (empty, only punctuation, or only unknown symbols).
    """
    return ids_and_positions(phonemes, config)[0]


def ids_and_positions(phonemes: str, config: PiperConfig) -> tuple[list[int], list[int]]:
    """:func:`ids_for`, and for each id the index in ``phonemes`` (NFD) of the symbol it
    stands for: a symbol's ids and the pad after them share its index; the start markers
    and the end marker have -1. What word timestamps sum the model's durations over."""
    id_map = config.phoneme_id_map
    pad = id_map[PAD]
    ids: list[int] = [*id_map[BOS], *pad]
    positions: list[int] = [-1] * len(ids)
    speakable = False
    missing: set[str] = set()
    for index, symbol in enumerate(unicodedata.normalize("NFD", phonemes)):
        mapped = id_map.get(symbol)
        if mapped is None:
            missing.add(symbol)
            continue
        ids.extend(mapped)
        ids.extend(pad)
        positions.extend([index] * (len(mapped) + len(pad)))
        speakable = speakable or symbol not in _NON_SPEECH
    ids.extend(id_map[EOS])
    positions.extend([-1] * len(id_map[EOS]))
    if missing:
        _LOGGER.debug("phonemes not in %s: %s", config.source or "the id map", sorted(missing))
    if not speakable:
        raise UnspeakableText(f"no speakable phonemes for this voice in {phonemes!r}")
    return ids, positions


def config_path_for(onnx_path: str | Path) -> Path:
    """Piper's convention: the config sits beside the model as ``NAME.onnx.json``."""
    onnx_path = Path(onnx_path)
    return onnx_path.with_name(onnx_path.name + ".json")


@dataclass
class OnnxWeights:
    """The weights of a Piper ``.onnx`` under their torch names, and each convolution's shape
    attributes (dilation, stride, padding) keyed by its torch module name."""

    tensors: dict[str, np.ndarray]
    conv_attrs: dict[str, dict[str, Any]]
    source: str

    def get(self, name: str) -> np.ndarray:
        try:
            return self.tensors[name]
        except KeyError:
            raise VoiceFileError(self.source, f"missing weight {name!r}") from None

    def has(self, name: str) -> bool:
        return name in self.tensors

    def count(self, pattern: str) -> int:
        """How many ``i`` make ``pattern.format(i)`` a weight, counting from 0 without gaps."""
        i = 0
        while pattern.format(i) in self.tensors:
            i += 1
        return i

    def subset(self, prefix: str) -> dict[str, np.ndarray]:
        """Weights under ``prefix`` (e.g. ``"dec."``), with the prefix removed."""
        return {k[len(prefix) :]: v for k, v in self.tensors.items() if k.startswith(prefix)}


def _module_name(node_name: str) -> str:
    """``/flow/flows.0/enc/in_layers.0/Conv`` -> ``flow.flows.0.enc.in_layers.0``."""
    return ".".join(node_name.strip("/").split("/")[:-1])


def read_onnx_weights(path: str | Path) -> OnnxWeights:
    """Every weight of a Piper VITS ``.onnx`` under the name the torch module gives it.

    Most initializers keep their torch names. The rest are reached through the node that
    consumes them: convolution weights with weight norm folded in (``onnx::Conv_NNNN``, in the
    flow's WaveNet layers), the phoneme and speaker embeddings (whatever the exporter called
    them), and the duration predictor's first affine flow, whose ``exp(-logs)`` was folded.

    Raises:
        VoiceFileError: the file is missing or not an ONNX model.
    """
    # onnx is the worker extra's: the web reads only the voice's .json
    import onnx
    from onnx import helper, numpy_helper

    path = Path(path)
    if not path.is_file():
        raise VoiceFileError(path, "voice model not found")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # onnx raises DecodeError, ValueError... for a damaged file
        raise VoiceFileError(path, f"not a readable ONNX model ({type(exc).__name__})") from None
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    if not initializers:
        raise VoiceFileError(path, "the ONNX model holds no weights")

    def array(name: str) -> np.ndarray:
        return numpy_helper.to_array(initializers[name])

    tensors: dict[str, np.ndarray] = {}
    for name in initializers:
        if not (name.startswith("onnx::") or name.startswith("/")):
            tensors[name] = array(name)
    conv_attrs: dict[str, dict[str, Any]] = {}
    for node in graph.node:
        if node.op_type in ("Conv", "ConvTranspose"):
            module = _module_name(node.name)
            conv_attrs[module] = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            for suffix, index in (("weight", 1), ("bias", 2)):
                if len(node.input) > index and node.input[index] in initializers:
                    tensors[f"{module}.{suffix}"] = array(node.input[index])
        elif node.op_type == "Gather" and node.name in ("/enc_p/emb/Gather", "/emb_g/Gather"):
            if node.input[0] in initializers:
                tensors[f"{_module_name(node.name)}.weight"] = array(node.input[0])
        elif node.name == "/dp/flows.0/Mul" and "dp.flows.0.logs" not in tensors:
            # (z - m) * exp(-logs): the exporter folded exp(-logs) into a constant.
            for name in node.input:
                if name in initializers and name != "dp.flows.0.m":
                    inverse_scale = array(name).astype(np.float64)
                    tensors["dp.flows.0.logs"] = (-np.log(inverse_scale)).astype(np.float32)
    return OnnxWeights(tensors=tensors, conv_attrs=conv_attrs, source=str(path))
