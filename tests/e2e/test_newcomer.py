"""What a newcomer meets, over HTTP against gunicorn on a farm of its own
(Redis database 14, with a book worker): the OpenAI and Kokoro surface through the real
`openai` client, the whole farm in /readyz, /v1/stats and the job counter, and
`voxfarm book render` naming its files one way and re-packaging without re-rendering."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests import wsclient
from tests.e2e.test_streaming import events_until, ws_url
from tests.helpers import ROOT, gunicorn_server, running_farm

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def farm14(redis_url, tmp_path_factory):
    with running_farm(redis_url, 14, tmp_path_factory.mktemp("farm14"), book=True,
                      store_dir=str(tmp_path_factory.mktemp("store14"))) as tf:
        yield tf


@pytest.fixture(scope="module")
def server(farm14, tmp_path_factory) -> str:
    with gunicorn_server(farm14.env, tmp_path_factory.mktemp("web14") / "gunicorn.log",
                         workers=2) as base:
        yield base


@pytest.fixture
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


# -- the OpenAI and Kokoro surface -----------------------------------------------------------


def test_openai_client_lists_models_and_retrieves_one(oai):
    ids = [m.id for m in oai.models.list()]
    assert {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(ids)
    model = oai.models.retrieve("tts-1")
    assert model.id == "tts-1" and model.object == "model" and isinstance(model.created, int)
    with pytest.raises(openai.NotFoundError) as exc:
        oai.models.retrieve("whisper-1")
    assert exc.value.body["code"] == "model_not_found"


def test_voices_listed_kokoro_style_are_each_accepted(oai):
    voices = oai.get("/audio/voices", cast_to=object)["voices"]
    assert voices[:2] == ["alloy", "ash"] and "en_us-joe-medium" in voices and "cmn" in voices
    # What a client picks from the list, the speech endpoint takes.
    for voice in ("nova", "en-us+f3", "en_us-joe-medium"):
        audio = oai.audio.speech.create(model="tts-1", voice=voice, input="Listed and spoken.",
                                        response_format="wav")
        assert audio.read()[:4] == b"RIFF"


def read_sse(resp) -> list[dict]:
    events = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            events.append(json.loads(line[len("data: "):]))
        else:
            assert line == "", line  # events are separated by blank lines, nothing else
    return events


def test_sse_stream_has_delta_and_done_events_with_the_same_audio(oai):
    text = "Events carry the audio. Each one holds a piece of it, in order."
    with oai.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="alloy", input=text, response_format="pcm",
            stream_format="sse", instructions="Speak in a cheerful and positive tone.") as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = read_sse(resp)
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert len(events) >= 3  # audio in several pieces, then done
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    assert done["usage"]["input_tokens"] == len(text)
    assert done["usage"]["total_tokens"] == done["usage"]["input_tokens"] + \
        done["usage"]["output_tokens"]
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    samples = np.frombuffer(pcm, dtype="<i2")
    assert 2.0 < len(samples) / 24_000 < 8.0 and np.abs(samples).max() > 1000
    # The same request without events: the same bytes (the farm's audio is deterministic).
    raw = oai.audio.speech.create(model="gpt-4o-mini-tts", voice="alloy", input=text,
                                  response_format="pcm")
    assert raw.read() == pcm


def test_bad_stream_format_and_instructions_are_refused(oai):
    with pytest.raises(openai.UnprocessableEntityError) as exc:
        oai.audio.speech.create(model="tts-1", voice="alloy", input="Hi.",
                                stream_format="websocket")
    assert exc.value.body["param"] == "stream_format"
    assert exc.value.body["valid"] == ["audio", "sse"]
    with pytest.raises(openai.UnprocessableEntityError) as exc:
        oai.audio.speech.create(model="tts-1", voice="alloy", input="Hi.",
                                extra_body={"instructions": 3})
    assert exc.value.body["param"] == "instructions"


# -- the whole farm in health, stats and metrics ---------------------------------------------


def test_readyz_and_stats_see_the_book_pool(server):
    ready = requests.get(f"{server}/readyz", timeout=10).json()
    assert ready["ready"] is True
    # Every queue's consumers (these workers read all their stage's queues: lead, own and
    # batch), the book pool's too.
    assert ready["workers"] == {"acoustic": 1, "vocoder": 1, "acoustic_lead": 1,
                                "vocoder_lead": 1, "vocoder_rest": 1, "acoustic_batch": 1,
                                "vocoder_batch": 1,
                                "book": 1, "acoustic_cpu": 1, "vocoder_cpu": 1, "quality": 0}
    assert ready["warnings"] == []
    resp = requests.get(f"{server}/v1/stats", timeout=10)
    assert resp.status_code == 200, resp.text
    queues = resp.json()["queues"]
    # Every pool's queues: the canary's quality pool too (it is not started here).
    assert set(queues) == {"acoustic", "acoustic_lead", "acoustic_batch", "vocoder",
                           "vocoder_lead", "vocoder_rest", "vocoder_batch", "book", "quality",
                           "acoustic_cpu", "vocoder_cpu"}
    assert queues["quality"] == {"depth": 0, "workers": 0, "pool": "quality"}
    assert queues["book"] == {"depth": 0, "workers": 1, "pool": "book"}
    assert queues["acoustic_batch"] == {"depth": 0, "workers": 1, "pool": "acoustic"}


def submitted(server: str) -> dict[str, float]:
    text = requests.get(f"{server}/metrics", timeout=10).text
    return {s.labels["entry"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "voxfarm_jobs_submitted_total"}


def test_every_entry_point_counts_its_jobs(server, oai):
    before = submitted(server)
    assert set(before) == {"jobs", "openai", "websocket"}
    resp = requests.post(f"{server}/v1/jobs", json={"text": "Counted as a job."}, timeout=30)
    assert resp.status_code == 202
    oai.audio.speech.create(model="tts-1", voice="alloy", input="Counted as OpenAI.").read()
    ws = wsclient.connect(ws_url(server))
    try:
        events_until(ws, "ready")
        ws.send(json.dumps({"text": "Counted as a socket's job.", "flush": True}))
        events_until(ws, "flushed")
    finally:
        ws.close()
    after = submitted(server)
    assert {k: after[k] - before[k] for k in after} == {"jobs": 1, "openai": 1,
                                                        "websocket": 1}


# -- books: one naming, and new formats without a new render ---------------------------------

BOOK_MD = """# The Tiny Book

## The Beginning

It was a quiet morning in the harbour. The boats lay still on the water.

## The End

By evening the wind came back. Everyone went home for supper.
"""


def render(server: str, book: Path, out: Path, formats: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "VOXFARM_SERVER"}
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli", "book", "render", str(book), "-o", str(out),
         "--formats", formats, "--server", server],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def named_files(manifest: dict) -> list[str]:
    """Every file a folder's manifest.json names: the book's audio and captions, each
    chapter's file and captions."""
    names = [*manifest["files"].values(), *manifest.get("captions", {}).values()]
    for ch in manifest["chapters"]:
        names += [*([ch["file"]] if "file" in ch else []), *ch.get("captions", {}).values()]
    return sorted(names)


def segment_mtimes(farm, book_id: str) -> dict[str, int]:
    keys = farm.store.list(f"books/{book_id}/segments/")
    return {k: os.stat(farm.store.local_path(k)).st_mtime_ns for k in keys}


def test_book_files_have_one_name_and_new_formats_reuse_the_audio(server, farm14, tmp_path):
    book = tmp_path / "tiny.md"
    book.write_text(BOOK_MD)
    first = render(server, book, tmp_path / "out1", "m4b")
    assert "(new)" in first
    book_id = first.split("book ", 1)[1].split(":", 1)[0]
    files = sorted(os.listdir(tmp_path / "out1"))
    # The book's audio and the captions that time it.
    assert files == ["The Tiny Book.m4b", "The Tiny Book.srt", "The Tiny Book.vtt",
                     "manifest.json"]
    manifest = json.loads((tmp_path / "out1" / "manifest.json").read_text())
    assert manifest["files"] == {"m4b": "The Tiny Book.m4b"}
    assert named_files(manifest) == files[:3]
    assert [c["title"] for c in manifest["chapters"]] == ["The Beginning", "The End"]
    assert all("file" not in c and "captions" not in c for c in manifest["chapters"])
    rendered = requests.get(f"{server}/v1/books/{book_id}", timeout=10).json()
    segments = segment_mtimes(farm14.farm, book_id)
    assert len(segments) == rendered["segments"]["total"] >= 4

    # Other formats: the same book (its id names the audio, not the packaging), packaged
    # again from the stored segments; nothing is rendered twice.
    second = render(server, book, tmp_path / "out2", "mp3,chapters")
    assert f"book {book_id}:" in second and "its audio is rendered" in second
    assert "resuming" not in second
    files = sorted(os.listdir(tmp_path / "out2"))
    assert files == ["001 The Beginning.mp3", "001 The Beginning.srt", "001 The Beginning.vtt",
                     "002 The End.mp3", "002 The End.srt", "002 The End.vtt",
                     "The Tiny Book.mp3", "The Tiny Book.srt", "The Tiny Book.vtt",
                     "manifest.json"]
    manifest = json.loads((tmp_path / "out2" / "manifest.json").read_text())
    assert named_files(manifest) == files[:-1]  # the manifest names exactly what was written
    assert segment_mtimes(farm14.farm, book_id) == segments
    again = requests.get(f"{server}/v1/books/{book_id}", timeout=10).json()
    assert again["segments"] == rendered["segments"]
    assert sorted(again["formats"]) == ["chapters", "m4b", "mp3"]

    # The API's downloads carry the same names.
    resp = requests.get(f"{server}/v1/books/{book_id}/chapters/1/audio", timeout=30)
    assert 'filename="002 The End.mp3"' in resp.headers["Content-Disposition"]
    resp = requests.get(f"{server}/v1/books/{book_id}/audio?format=m4b", timeout=30)
    assert "The Tiny Book.m4b" in resp.headers["Content-Disposition"]

    # A finished book run again is not "resuming".
    third = render(server, book, tmp_path / "out3", "m4b")
    assert "rendered before; downloading it" in third
    assert sorted(os.listdir(tmp_path / "out3")) == ["The Tiny Book.m4b", "The Tiny Book.srt",
                                                     "The Tiny Book.vtt", "manifest.json"]


GULL_ROCK_MD = """# The Keeper of Gull Rock

*A Tale of the Northern Light*

## The Lamp

The lamp burned all night. Ships passed the rock safely.

## The Fog

Then the fog came down. Nobody could see the light from the harbour.

## The Rescue

A boat found the rock at dawn. Everyone on it was saved.
"""


def test_book_render_of_a_book_with_a_subtitle_as_a_newcomer_runs_it(server, tmp_path):
    """The CLI on a Markdown book whose title has a subtitle under it, its output a pipe:
    three chapters (the subtitle is no chapter), plain progress lines with one estimate, and
    a folder whose every file the manifest names, captions included."""
    book = tmp_path / "gull.md"
    book.write_text(GULL_ROCK_MD)
    out = render(server, book, tmp_path / "out", "m4b,chapters")
    # Off a terminal: plain lines, each with one estimate at most, chapters counted as done
    # only when every segment of theirs is; the last one says it is all done.
    progress = [line for line in out.splitlines() if line.startswith("segments ")]
    assert progress, out
    # (Before the book is split its segments and chapters are not known yet.)
    pattern = (r"segments (\d+)/(\d+|\?), (queued|preparing|rendering|assembling|done)"
               r"(?:, chapters done (\d)/3)?(, ETA \d+(:\d\d| s))?")
    for line in progress:
        assert re.fullmatch(pattern, line), line
    done, total, state, chapters = re.fullmatch(pattern, progress[-1]).group(1, 2, 3, 4)
    assert (done, state, chapters) == (total, "done", "3")
    files = sorted(os.listdir(tmp_path / "out"))
    assert files == ["001 The Lamp.mp3", "001 The Lamp.srt", "001 The Lamp.vtt",
                     "002 The Fog.mp3", "002 The Fog.srt", "002 The Fog.vtt",
                     "003 The Rescue.mp3", "003 The Rescue.srt", "003 The Rescue.vtt",
                     "The Keeper of Gull Rock.m4b", "The Keeper of Gull Rock.srt",
                     "The Keeper of Gull Rock.vtt", "manifest.json"]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert named_files(manifest) == files[:-1]
    assert "captions_links" not in json.dumps(manifest)  # names of files here, not links
    assert [c["title"] for c in manifest["chapters"]] == ["The Lamp", "The Fog", "The Rescue"]
    with av.open(str(tmp_path / "out" / "001 The Lamp.mp3")) as mp3:
        assert mp3.metadata.get("track") == "1/3"
    srt = (tmp_path / "out" / "001 The Lamp.srt").read_text()
    assert "lamp" in srt.lower() and "Northern" not in srt
