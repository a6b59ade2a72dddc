"""The hibari voice's own promises, without a reference pipeline: the interface the farm builds
on, windowed decoding equal to the whole, one seed one waveform, batches equal to items alone,
phonemes outside the vocabulary refused by name. On CUDA too when there is one."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("hibari", reason="the hibari-tts wheel (worker extra) is not installed")

from models.errors import InvalidPhonemes, SpeechError  # noqa: E402
from models.hibari import dsp, layers  # noqa: E402
from models.hibari.g2p import phonemize  # noqa: E402
from models.hibari.voice import HibariVoice, load_voice  # noqa: E402

TEXT = "The weather is nice today, so let's go for a walk in the park."
WINDOWED_TOL = 1e-3  # the contract's; measured 1.2e-6 with WINDOW_CONTEXT frames


@pytest.fixture(scope="module")
def voice():
    torch.set_num_threads(1)  # two threads on a shared 2-core box spin and run 5x slower
    return load_voice("cpu")


@pytest.fixture(scope="module")
def features(voice):
    return voice.features([voice.ids(phonemize(TEXT))])[0]


def test_interface(voice, features):
    assert load_voice("cpu") is voice  # one per process
    assert (voice.sample_rate, voice.hop) == (24000, 300)
    frames = features.frames
    assert frames.dtype == torch.float32 and frames.shape[0] == 131
    assert sum(features.durations) == frames.shape[1]
    assert len(features.durations) == len(voice.ids(phonemize(TEXT)))
    audio = voice.decode(frames, seed=7)
    assert audio.shape == (frames.shape[1] * 300,)
    assert audio.abs().max() <= 1.0
    assert audio.abs().max() > 0.05  # speech, not silence
    assert 40 <= frames[130].max() <= 500  # f0 in Hz: a voice, somewhere


def test_both_int8_products_give_the_same_features(voice, features, monkeypatch):
    """The acoustic half's exact int8 layers multiply with ``torch._int_mm`` or as integers
    held in float32, whichever this CPU runs faster (``layers.int_mm_pays``): the choice may
    move speed only, never a duration or a frame."""
    ids = voice.ids(phonemize(TEXT))
    for pays in (True, False):
        monkeypatch.setattr(layers, "int_mm_pays", lambda pays=pays: pays)
        other = voice.features([ids])[0]
        assert other.durations == features.durations
        assert torch.equal(other.frames, features.frames)


def test_ids_wrap_the_phonemes_in_pads(voice):
    ids = voice.ids("hˈi")
    assert ids[0] == ids[-1] == 0 and len(ids) == 5
    assert ids[1:-1] == [voice.vocab["h"], voice.vocab["ˈ"], voice.vocab["i"]]


@pytest.mark.parametrize("phonemes, symbol, position", [("həlˈO wˈɜɹld#", "#", 12),
                                                          ("a\nb", "\n", 1)])
def test_a_symbol_outside_the_vocab_is_refused_by_name(voice, phonemes, symbol, position):
    with pytest.raises(InvalidPhonemes) as caught:
        voice.ids(phonemes)
    assert isinstance(caught.value, SpeechError)  # never retried
    assert caught.value.symbols == [symbol] and caught.value.position == position
    assert repr(symbol) in str(caught.value)


def test_same_seed_same_bytes_other_seed_other_noise(voice, features):
    first = voice.decode(features.frames, seed=11)
    again = voice.decode(features.frames, seed=11)
    other = voice.decode(features.frames, seed=12)
    assert first.numpy().tobytes() == again.numpy().tobytes()
    assert not torch.equal(first, other)


def test_features_are_deterministic(voice):
    ids = voice.ids(phonemize(TEXT))
    a, b = voice.features([ids])[0], voice.features([ids])[0]
    assert a.durations == b.durations and torch.equal(a.frames, b.frames)


def windowed(voice, frames, seed, size, context):
    total = frames.shape[1]
    return torch.cat([voice.decode_window(frames, seed, start, min(total, start + size), context)
                      for start in range(0, total, size)])


def test_windows_joined_equal_the_whole_segment(voice, features):
    whole = voice.decode(features.frames, seed=3)
    for size in (37, 80):
        joined = windowed(voice, features.frames, 3, size, voice.WINDOW_CONTEXT)
        assert joined.shape == whole.shape
        assert (joined - whole).abs().max().item() <= WINDOWED_TOL


def test_windows_without_context_do_not(voice, features):
    """The comparison above can fail: with no context the window edges are audibly wrong."""
    whole = voice.decode(features.frames, seed=3)
    assert (windowed(voice, features.frames, 3, 37, 0) - whole).abs().max().item() > WINDOWED_TOL


def test_the_dsp_renders_only_its_margin_around_a_window(voice, features):
    """On the same parts, the DSP's windows rendered with ``RENDER_MARGIN`` frames either side
    join to the whole segment's samples bit for bit (what lets a window skip most of the
    decoder's context); one frame less is audibly off at the edges."""
    frames, total = features.frames, features.frames.shape[1]
    parts, f0, noise = voice.parts(frames), frames[130], dsp.segment_noise(4, total)
    whole = dsp.synthesize(parts, f0, noise)

    def joined(margin: int) -> torch.Tensor:
        pieces = []
        for start in range(0, total, 37):
            stop = min(total, start + 37)
            lo, hi = max(0, start - margin), min(total, stop + margin)
            audio = dsp.synthesize(parts[:, lo:hi], f0, noise, lo)
            pieces.append(audio[(start - lo) * dsp.HOP: (stop - lo) * dsp.HOP])
        return torch.cat(pieces)

    assert torch.equal(joined(dsp.RENDER_MARGIN), whole)
    assert (joined(dsp.RENDER_MARGIN - 1) - whole).abs().max().item() > WINDOWED_TOL


def test_the_smallest_pieces_decode(voice):
    """Pads alone (no phoneme) and a one-frame window without context still give audio of
    the right length (the STFT's reflect padding is longer than such a piece)."""
    frames = voice.features([[0, 0]])[0].frames
    assert voice.decode(frames, 1).shape == (frames.shape[1] * 300,)
    assert voice.decode_window(frames, 1, 1, 2, 0).shape == (300,)


def test_a_batch_gives_each_item_what_it_gives_alone(voice):
    texts = ["Yes.", TEXT, "Can you tell me where the train station is?"]
    id_lists = [voice.ids(phonemize(t)) for t in texts]
    batch = voice.features(id_lists)
    for ids, item in zip(id_lists, batch, strict=True):
        alone = voice.features([ids])[0]
        assert item.durations == alone.durations
        # int8 steps may flip where a padded matmul rounds differently (see the parity test)
        assert (item.frames - alone.frames)[:130].abs().mean() <= 5e-4


def test_speed_shortens_the_speech(voice):
    ids = voice.ids(phonemize(TEXT))
    normal, fast = voice.features([ids], 1.0)[0], voice.features([ids], 1.5)[0]
    assert fast.frames.shape[1] < 0.8 * normal.frames.shape[1]
    with pytest.raises(ValueError):
        voice.features([ids], 0.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_cuda_matches_cpu(voice, features):
    gpu = HibariVoice("cuda")
    ids = voice.ids(phonemize(TEXT))
    on_gpu = gpu.features([ids])[0]
    assert on_gpu.durations == features.durations
    assert (on_gpu.frames.cpu() - features.frames)[:130].abs().mean() <= 5e-4
    a = gpu.decode(features.frames.cuda(), seed=5).cpu()
    b = voice.decode(features.frames, seed=5)
    assert a.shape == b.shape
    assert gpu.decode(features.frames.cuda(), seed=5).cpu().numpy().tobytes() == a.numpy().tobytes()
    joined = windowed(gpu, features.frames.cuda(), 5, 37, gpu.WINDOW_CONTEXT).cpu()
    assert (joined - a).abs().max().item() <= WINDOWED_TOL
